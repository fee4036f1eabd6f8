"""The launcher: start N worker processes, report a child's death at once, replace it if asked.

``python -m foldplane.agent.launch --coordinator URL --group G --nproc 4 train.py --lr 0.1`` starts ranks
0..3 of group ``G``, each with the environment ``Agent()`` reads (``FOLDPLANE_COORDINATOR``,
``FOLDPLANE_GROUP``, ``FOLDPLANE_RANK``, ``FOLDPLANE_INCARNATION`` and, when the launcher knows
``FOLDPLANE_SECRET``, the rank's own agent token as ``FOLDPLANE_TOKEN``), torchrun's ``RANK``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` and ``WORLD_SIZE`` (a GPU worker's device is
``cuda:LOCAL_RANK``; a replacement keeps its predecessor's), and, unless started
with ``--no-relay``, ``FOLDPLANE_RELAY``: the address of the per-host relay (``agent/relay.py``)
the launcher runs, through which every worker's agent sends its events and polls its updates.

The rules:

- **A failure is reported the moment it is seen.** A child that exits by a signal or with a
  non-zero code is reported with ``POST /agents/deaths`` naming its incarnation, so the
  coordinator takes it OFFLINE at once instead of after the heartbeat timeout. The incarnation
  fences the report: a late report can never take down the replacement.
- **A clean exit is not a death.** Exit code 0 is never reported; the agent said ``exit``.
  Nor is a SIGABRT after the agent left: a process that exits while a view's rendezvous is
  still stuck on a dead peer can abort (docs/dataplane.md, known limits). When a worker ends by SIGABRT and the
  coordinator already holds that incarnation's clean ``exit``, the rank's work was done: it is
  not reported, not replaced and not counted as a failure (the log line says what happened).
- **A group runs once; the launcher says what it found.** Before it starts a worker it looks
  the group up (waiting up to ``--start-timeout`` for the coordinator and, without
  ``--world-size``, for the group) and says what it found: a new group, one that is forming,
  or one that ran before. A group whose run is over (ended, shut down, failed to form, or no
  rank online any more) or, with ``--world-size``, one that is running is refused at once, with
  what to do: its history stays in the log under its name, so a new run takes a new name.
- **Replacement is a new incarnation.** ``replace(rank)`` (or ``--replace-failed``) starts the
  same command for the same rank with a new incarnation; the agent inside joins through the same
  machine as any process, and the upper layer (or an operator) activates it.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..wire.auth import agent_token
from ..wire.codes import NOT_FOLDPLANE, UNKNOWN_GROUP
from .client import (
    START_LOG_EVERY_S,
    CoordinatorClient,
    CoordinatorError,
    CoordinatorUnavailable,
    group_run,
    parse_addresses,
    start_timeout_s,
)
from .relay import Relay

log = logging.getLogger("foldplane.launch")


@dataclass(frozen=True)
class WorkerExit:
    """How one worker process ended, and what the launcher did about it."""

    rank: int
    incarnation: str
    pid: int
    returncode: int
    reported: bool
    report_error: str | None = None
    #: the coordinator held this incarnation's clean exit before the process ended
    left_cleanly: bool = False

    @property
    def failed(self) -> bool:
        return self.returncode != 0 and not self.left_cleanly

    def describe(self) -> str:
        if self.returncode < 0:
            how = f"killed by {signal.Signals(-self.returncode).name}"
        else:
            how = f"exited with code {self.returncode}"
        if self.left_cleanly:
            how += " after it left the group cleanly (a teardown abort, not a failure)"
        return f"rank {self.rank} (pid {self.pid}, incarnation {self.incarnation[:8]}) {how}"


@dataclass
class Worker:
    rank: int
    incarnation: str
    process: subprocess.Popen[bytes]


class Launcher:
    """Starts and watches the worker processes of one group on this machine."""

    def __init__(
        self,
        command: Sequence[str],
        *,
        coordinator: str | Sequence[str],
        group: str,
        ranks: Sequence[int],
        token: str | None = None,
        secret: str | None = None,
        env: Mapping[str, str] | None = None,
        replace_failed: bool = False,
        max_replacements: int = 3,
        on_exit: Callable[[WorkerExit], None] | None = None,
        on_spawn: Callable[[Worker], None] | None = None,
        stdin: int | None = None,
        stdout: int | None = None,
        stderr: int | None = None,
        relay: bool = True,
        world_size: int | None = None,
    ) -> None:
        if not command:
            raise ValueError("the launcher needs a command to run")
        self.command = list(command)
        self.addresses = parse_addresses(coordinator)
        self.group = group
        self.ranks = list(ranks)
        self.replace_failed = replace_failed
        self.replacements_left = max_replacements
        self.on_exit = on_exit
        self.on_spawn = on_spawn
        self.exits: list[WorkerExit] = []
        self._token = token if token is not None else os.environ.get("FOLDPLANE_TOKEN")
        self._secret = secret if secret is not None else os.environ.get("FOLDPLANE_SECRET")
        self._env = dict(os.environ if env is None else env)
        self._env.pop("FOLDPLANE_SECRET", None)  # workers never hold the server's secret
        self._stdin = stdin
        self._stdout = stdout
        self._stderr = stderr
        self._workers: dict[int, Worker] = {}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._stopping = False
        self._pending_spawns = 0  # replacements decided but not started yet
        self.client = CoordinatorClient(self.addresses, token=self._token)
        #: the per-host relay the workers talk through (from the first spawn on), or None
        self.relay: Relay | None = None
        self._use_relay = relay
        #: torchrun's WORLD_SIZE for the workers (the group's world size), when known
        self.world_size = world_size

    # -- processes -------------------------------------------------------------------------------

    def start(self) -> Launcher:
        for rank in self.ranks:
            self.spawn(rank)
        return self

    def spawn(self, rank: int) -> Worker:
        """Start the command for ``rank`` with a new incarnation (a first start or a replacement)."""
        incarnation = uuid.uuid4().hex
        self._start_relay()
        env = dict(self._env)
        env.pop("FOLDPLANE_RELAY", None)  # only this launcher's relay, if any
        env.update(
            FOLDPLANE_COORDINATOR=",".join(self.addresses),
            FOLDPLANE_GROUP=self.group,
            FOLDPLANE_RANK=str(rank),
            FOLDPLANE_INCARNATION=incarnation,
        )
        if self._secret:
            env["FOLDPLANE_TOKEN"] = agent_token(self._secret, self.group, rank)
        if self.relay is not None:
            env["FOLDPLANE_RELAY"] = self.relay.url
        env.update(self.torchrun_env(rank))
        process = subprocess.Popen(
            self.command, env=env, stdin=self._stdin, stdout=self._stdout, stderr=self._stderr
        )
        worker = Worker(rank, incarnation, process)
        with self._changed:
            self._workers[rank] = worker
            self._changed.notify_all()
        if self.on_spawn is not None:
            self.on_spawn(worker)
        threading.Thread(
            target=self._watch, args=(worker,), name=f"foldplane-launch-{rank}", daemon=True
        ).start()
        log.info("rank %d: started pid %d (incarnation %s)", rank, process.pid, incarnation)
        return worker

    replace = spawn

    def torchrun_env(self, rank: int) -> dict[str, str]:
        """torchrun's variables for ``rank``: ``RANK``, ``LOCAL_RANK`` (its place among this
        launcher's ranks, so its GPU is ``cuda:LOCAL_RANK``; a replacement takes its
        predecessor's), ``LOCAL_WORLD_SIZE`` and, when known, ``WORLD_SIZE``."""
        env = {
            "RANK": str(rank),
            "LOCAL_RANK": str(self.ranks.index(rank)),
            "LOCAL_WORLD_SIZE": str(len(self.ranks)),
        }
        if self.world_size is not None:
            env["WORLD_SIZE"] = str(self.world_size)
        return env

    def worker(self, rank: int) -> Worker:
        return self._workers[rank]

    def kill(self, rank: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the current process of ``rank`` (its death is reported as any other)."""
        self._workers[rank].process.send_signal(sig)

    def running(self) -> list[int]:
        with self._lock:
            return sorted(r for r, w in self._workers.items() if w.process.poll() is None)

    def wait(self, timeout: float | None = None) -> int:
        """Wait until no worker runs; 0 if every rank's last process exited cleanly, else 1."""
        with self._changed:
            done = self._changed.wait_for(
                lambda: (
                    self._pending_spawns == 0
                    and all(w.process.returncode is not None for w in self._workers.values())
                ),
                timeout,
            )
        if not done:
            raise TimeoutError(f"workers {self.running()} still running after {timeout} s")
        with self._lock:
            last = {e.incarnation: e for e in self.exits}
            failed = [
                w.rank
                for w in self._workers.values()
                if w.process.returncode != 0
                and not (w.incarnation in last and last[w.incarnation].left_cleanly)
            ]
        return 1 if failed else 0

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM every worker, SIGKILL what is left after ``grace_s``; report no deaths."""
        with self._lock:
            self._stopping = True
            workers = list(self._workers.values())
        for w in workers:
            if w.process.poll() is None:
                w.process.terminate()
        for w in workers:
            try:
                w.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                w.process.kill()
                w.process.wait()
        if self.relay is not None:
            self.relay.close()
        self.client.close()

    def _start_relay(self) -> None:
        with self._lock:
            if self._use_relay and self.relay is None and not self._stopping:
                self.relay = Relay(self.addresses).start()

    # -- the watcher -----------------------------------------------------------------------------

    def _watch(self, worker: Worker) -> None:
        returncode = worker.process.wait()
        with self._lock:
            stopping = self._stopping
        reported, error, left = False, None, False
        if returncode == -signal.SIGABRT and not stopping:
            left = self._left_cleanly(worker)
        if returncode != 0 and not stopping and not left:
            reported, error = self._report_death(worker)
        exit_ = WorkerExit(
            worker.rank, worker.incarnation, worker.process.pid, returncode, reported, error, left
        )
        log.warning("%s%s", exit_.describe(), "; death reported" if reported else "")
        replace = False
        with self._changed:
            self.exits.append(exit_)
            if (
                exit_.failed
                and not self._stopping
                and self.replace_failed
                and self.replacements_left > 0
                and self._workers.get(worker.rank) is worker
            ):
                self.replacements_left -= 1
                self._pending_spawns += 1
                replace = True
            self._changed.notify_all()
        if self.on_exit is not None:
            self.on_exit(exit_)
        if replace:
            try:
                self.spawn(worker.rank)
            finally:
                with self._changed:
                    self._pending_spawns -= 1
                    self._changed.notify_all()

    def _left_cleanly(self, worker: Worker) -> bool:
        """Whether the coordinator holds ``worker``'s clean exit (its rank OFFLINE, marked
        exited, with this incarnation); False when it cannot be asked."""
        page: dict[str, int] = {"ranks_limit": 1}
        if worker.rank > 0:
            page["ranks_after"] = worker.rank - 1
        try:
            status = self.client.request("GET", f"/groups/{self.group}", params=page)
        except (CoordinatorError, CoordinatorUnavailable) as exc:
            log.warning("rank %d: cannot ask whether it left cleanly: %s", worker.rank, exc)
            return False
        ranks = [r for r in status.get("ranks", []) if r.get("rank") == worker.rank]
        return bool(
            ranks
            and ranks[0].get("exited")
            and ranks[0].get("state") == "OFFLINE"
            and ranks[0].get("incarnation") == worker.incarnation
        )

    def _report_death(self, worker: Worker) -> tuple[bool, str | None]:
        try:
            self.client.report_death(self.group, worker.rank, worker.incarnation)
        except (CoordinatorError, CoordinatorUnavailable) as exc:
            # A 409 stale_incarnation means a newer process already speaks for the rank.
            return False, str(exc)
        return True, None


# -- command line ------------------------------------------------------------------------------


def prepare_group(
    client: CoordinatorClient, group: str, world_size: int | None, timeout_s: float
) -> str | None:
    """Look ``group`` up before any worker starts and say what was found; create it when
    ``world_size`` is given and it does not exist. Returns None to go on, or why not (a
    message that says what to do). Waits up to ``timeout_s`` for the coordinator to answer
    and, without ``world_size``, for another launcher (or the operator) to create the group."""
    where = ",".join(client.addresses)
    deadline = time.monotonic() + timeout_s
    next_log = time.monotonic() + START_LOG_EVERY_S
    while True:
        try:
            body = client.group(group, timeout_s=max(0.5, min(5.0, deadline - time.monotonic())))
            break
        except CoordinatorUnavailable as exc:
            waiting = f"no foldplane coordinator at {where} ({exc})"
        except CoordinatorError as exc:
            if exc.code == NOT_FOLDPLANE:
                return exc.detail
            if exc.code != UNKNOWN_GROUP:
                return f"cannot look up group {group!r} at {where}: {exc}"
            if world_size is not None:
                try:
                    client.create_group(group, world_size)
                except (CoordinatorError, CoordinatorUnavailable) as exc:
                    return f"cannot create group {group!r} at {where}: {exc}"
                log.info("created group %r (%d ranks) at %s", group, world_size, where)
                return None
            waiting = f"no group {group!r} at {where}"
        now = time.monotonic()
        if now >= deadline:
            if waiting.startswith("no group"):
                return (
                    f"{waiting} (groups: {_names(client)}) after {timeout_s:g} s; check --group, "
                    "give --world-size to create it, or wait longer with --start-timeout"
                )
            return (
                f"{waiting} after {timeout_s:g} s; check --coordinator, or wait longer with "
                "--start-timeout"
            )
        if now >= next_log:
            log.info("waiting for group %r at %s: %s", group, where, waiting)
            next_log = now + START_LOG_EVERY_S
        time.sleep(0.2)
    stage, found = group_run(body)
    new_name = (
        "start this run under another --group (or on a coordinator with a new --db): a group "
        "runs once, and its history stays in the log under its name"
    )
    if stage == "over":
        return f"{found}; {new_name}"
    if stage == "running" and world_size is not None:
        return (
            f"{found}; a second launch would contend for its ranks. Stop that run or end it "
            f"(python -m coordinator group end {group} --coordinator {client.addresses[0]}), "
            f"and {new_name}"
        )
    if world_size is not None:
        try:
            client.create_group(group, world_size)  # an identical group: a no-op
        except (CoordinatorError, CoordinatorUnavailable) as exc:
            return f"cannot create group {group!r} at {where}: {exc}"
    log.info("found %s; joining it", found)
    return None


def _names(client: CoordinatorClient) -> str:
    try:
        names = [str(g.get("group")) for g in client.groups(timeout_s=2.0)]
    except (CoordinatorError, CoordinatorUnavailable) as exc:
        return f"unknown: {exc}"
    more = f", ... (+{len(names) - 20})" if len(names) > 20 else ""
    return ", ".join(names[:20]) + more if names else "none"


def _parse_ranks(text: str) -> list[int]:
    ranks: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        ranks.extend(range(int(lo), int(hi or lo) + 1))
    return ranks


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m foldplane.agent.launch",
        description="Start the worker processes of a foldplane group, report deaths at once, "
        "and optionally replace failed workers.",
    )
    p.add_argument(
        "--coordinator",
        default=os.environ.get("FOLDPLANE_COORDINATOR"),
        help="coordinator URL(s), comma-separated (default: $FOLDPLANE_COORDINATOR)",
    )
    p.add_argument("--group", default=os.environ.get("FOLDPLANE_GROUP"), help="the group name")
    p.add_argument("--nproc", type=int, help="start ranks FIRST..FIRST+NPROC-1 on this machine")
    p.add_argument("--first-rank", type=int, default=0, help="the first rank (default 0)")
    p.add_argument("--ranks", help="explicit ranks, e.g. 0-3 or 4,5,7 (instead of --nproc)")
    p.add_argument(
        "--world-size",
        type=int,
        help="create the group with this world size first (an identical group is a no-op)",
    )
    p.add_argument(
        "--start-timeout",
        type=float,
        default=None,
        metavar="S",
        help="how long to wait for the coordinator (and, without --world-size, the group) "
        "before failing (default $FOLDPLANE_START_TIMEOUT_S, else 10)",
    )
    p.add_argument(
        "--replace-failed", action="store_true", help="start a replacement for a failed worker"
    )
    p.add_argument(
        "--max-replacements", type=int, default=3, help="replacements in all (default 3)"
    )
    p.add_argument(
        "--no-relay",
        action="store_true",
        help="let every worker talk to the coordinator itself instead of through this "
        "launcher's per-host relay",
    )
    p.add_argument(
        "-m", "--module", action="store_true", help="run SCRIPT as a module (python -m SCRIPT)"
    )
    p.add_argument(
        "--no-python", action="store_true", help="run SCRIPT as an executable, not with python"
    )
    p.add_argument(
        "script", help="the worker script (or module with -m, executable with --no-python)"
    )
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the worker")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    if not a.coordinator:
        p.error("--coordinator (or FOLDPLANE_COORDINATOR) is required")
    if not a.group:
        p.error("--group (or FOLDPLANE_GROUP) is required")
    if a.ranks:
        try:
            ranks = _parse_ranks(a.ranks)
        except ValueError:
            p.error(f"--ranks {a.ranks!r}: expected a list like 0-3 or 4,5,7")
    elif a.nproc:
        ranks = list(range(a.first_rank, a.first_rank + a.nproc))
    else:
        p.error("give --nproc N or --ranks LIST")
    if a.no_python:
        command = [a.script, *a.args]
    elif a.module:
        command = [sys.executable, "-m", a.script, *a.args]
    else:
        command = [sys.executable, a.script, *a.args]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s launch: %(message)s")
    launcher = Launcher(
        command,
        coordinator=a.coordinator,
        group=a.group,
        ranks=ranks,
        replace_failed=a.replace_failed,
        max_replacements=a.max_replacements,
        relay=not a.no_relay,
        world_size=a.world_size,
    )
    try:
        timeout_s = start_timeout_s(a.start_timeout)
    except ValueError as exc:
        p.error(str(exc))
    refused = prepare_group(launcher.client, a.group, a.world_size, timeout_s)
    if refused is not None:
        print(f"launch: {refused}", file=sys.stderr)
        return 2
    if launcher.world_size is None:  # joining a group made elsewhere: WORLD_SIZE from it
        try:
            launcher.world_size = int(launcher.client.group(a.group)["config"]["world_size"])
        except (CoordinatorError, CoordinatorUnavailable, KeyError, TypeError, ValueError) as exc:
            log.warning("group %r: world size unknown (%s); WORLD_SIZE is not set", a.group, exc)

    def forward(signum: int, frame: object) -> None:
        threading.Thread(target=launcher.stop, daemon=True).start()

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    launcher.start()
    try:
        return launcher.wait()
    finally:
        if launcher.relay is not None:
            launcher.relay.close()


if __name__ == "__main__":
    raise SystemExit(main())
