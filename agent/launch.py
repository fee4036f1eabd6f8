"""The launcher: start N worker processes, report a child's death at once, replace it if asked.

``python -m foldplane.agent.launch --coordinator URL --group G --nproc 4 train.py --lr 0.1`` starts ranks
0..3 of group ``G``, each with the environment ``Agent()`` reads (``FOLDPLANE_COORDINATOR``,
``FOLDPLANE_GROUP``, ``FOLDPLANE_RANK``, ``FOLDPLANE_INCARNATION`` and, when the launcher knows
``FOLDPLANE_SECRET``, the rank's own agent token as ``FOLDPLANE_TOKEN``), torchrun's ``RANK``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` and ``WORLD_SIZE`` (a GPU worker's device is
``cuda:LOCAL_RANK``; a replacement keeps its predecessor's), and, unless started
with ``--no-relay``, ``FOLDPLANE_RELAY``: the address of the per-host relay (``agent/relay/``)
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
  or one that ran before. A group whose run is over (finished, ended, shut down, failed to form, or no
  rank online any more) or, with ``--world-size``, one that is running is refused at once, with
  what to do: its history stays in the log under its name, so a new run takes a new name.
- **Replacement is a new incarnation.** ``replace(rank)`` (or ``--replace-failed``) starts the
  same command for the same rank with a new incarnation; the agent inside joins through the same
  machine as any process, and the upper layer (or an operator) activates it. Its
  ``TORCHELASTIC_RESTART_COUNT`` says how many times the rank was replaced, its
  ``TORCHELASTIC_MAX_RESTARTS`` the budget.
- **An unchanged torch script runs.** The command line gives every worker ``MASTER_ADDR`` and
  ``MASTER_PORT`` (the launcher that runs rank 0 picks a free port, or takes
  ``--master-port``), where rank 0's ``init_process_group`` hosts the store, as torch's
  ``env://`` does: a plain ``init_process_group("gloo")`` (or ``"nccl"``) forms a static group
  over it, and ``init_process_group("foldplane")`` makes the same script elastic (it says so
  once). The launcher itself never imports torch.
- **Each rank's output is its own.** Every line a worker writes goes out prefixed with its
  rank (``[rank 2]: ...``), or into a file of its own under ``--log-dir`` (``rank-2.log``, its
  replacements ``rank-2.replacement-1.log``, ...); the end of each is kept for the summary.
- **The run ends with a summary** like torchrun's: each rank's last process and how it ended
  (exit code or signal), the replacements used of the budget, and the first error with the last
  lines its process wrote.

torchrun's flags are accepted where they mean the same (``--nproc-per-node``, ``--nnodes`` and
``--node-rank``, ``--max-restarts``, ``--log-dir``, ``--rdzv-id`` as the group,
``--rdzv-endpoint`` as the coordinator, ``--master-addr``/``--master-port``, ``--no-python``,
``-m``); the others are refused with what to do instead (:data:`UNSUPPORTED`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

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
from .invocation import invoked_as
from .relay import Relay

log = logging.getLogger("foldplane.launch")

#: Lines of a worker's output kept for the summary (its last ones).
TAIL_LINES = 20


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
    #: 0 for the rank's first process, n for its n-th replacement
    attempt: int = 0
    #: when it ended (seconds since the epoch)
    ended_at: float = 0.0
    #: the last lines it wrote (when the launcher read its output), and where all of it went
    tail: tuple[str, ...] = ()
    log_file: str | None = None

    @property
    def failed(self) -> bool:
        return self.returncode != 0 and not self.left_cleanly

    def how(self) -> str:
        """``exited with code 1``, ``killed by SIGKILL``, ..."""
        if self.returncode < 0:
            try:
                return f"killed by {signal.Signals(-self.returncode).name}"
            except ValueError:
                return f"killed by signal {-self.returncode}"
        return f"exited with code {self.returncode}"

    def describe(self) -> str:
        how = self.how()
        if self.left_cleanly:
            how += " after it left the group cleanly (a teardown abort, not a failure)"
        return f"rank {self.rank} (pid {self.pid}, incarnation {self.incarnation[:8]}) {how}"


@dataclass
class Worker:
    rank: int
    incarnation: str
    process: subprocess.Popen[bytes]
    #: 0 for the rank's first process, n for its n-th replacement
    attempt: int = 0
    #: the file its output goes to (``log_dir``), or None
    log_file: str | None = None
    #: its last lines, when the launcher reads its output (prefixed lines)
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    reader: threading.Thread | None = None


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
        log_dir: str | os.PathLike[str] | None = None,
        prefix_output: bool = False,
        output: TextIO | None = None,
        master: tuple[str, int] | None = None,
    ) -> None:
        if not command:
            raise ValueError("the launcher needs a command to run")
        self.command = list(command)
        self.addresses = parse_addresses(coordinator)
        self.group = group
        self.ranks = list(ranks)
        self.replace_failed = replace_failed
        self.max_replacements = max_replacements
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
        #: each worker's output: a file of its own under ``log_dir``, or lines prefixed with
        #: its rank on ``output`` (default stdout), or wherever ``stdout``/``stderr`` say
        self.log_dir = None if log_dir is None else Path(log_dir)
        self.prefix_output = prefix_output
        self._output = output
        self._printing = threading.Lock()
        #: the store an unchanged ``init_process_group`` reaches (``MASTER_ADDR``/``_PORT``)
        self.master = master
        self._attempts: dict[int, int] = {}

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
        with self._lock:
            attempt = self._attempts[rank] = self._attempts.get(rank, -1) + 1
        env.update(self.torchrun_env(rank, attempt))
        log_file = None
        stdout, stderr = self._stdout, self._stderr
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            name = f"rank-{rank}.log" if attempt == 0 else f"rank-{rank}.replacement-{attempt}.log"
            log_file = str(self.log_dir / name)
            stdout, stderr = open(log_file, "ab"), subprocess.STDOUT  # noqa: SIM115 (closed below)
        elif self.prefix_output:
            stdout, stderr = subprocess.PIPE, subprocess.STDOUT
        try:
            process = subprocess.Popen(
                self.command, env=env, stdin=self._stdin, stdout=stdout, stderr=stderr
            )
        finally:
            if log_file is not None:
                stdout.close()  # type: ignore[union-attr]  (the child holds its own copy)
        worker = Worker(rank, incarnation, process, attempt, log_file)
        if self.prefix_output and self.log_dir is None:
            worker.reader = threading.Thread(
                target=self._print_output, args=(worker,), name=f"foldplane-out-{rank}", daemon=True
            )
            worker.reader.start()
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

    def torchrun_env(self, rank: int, attempt: int = 0) -> dict[str, str]:
        """torchrun's variables for ``rank``: ``RANK``, ``LOCAL_RANK`` (its place among this
        launcher's ranks, so its GPU is ``cuda:LOCAL_RANK``; a replacement takes its
        predecessor's), ``LOCAL_WORLD_SIZE``, ``TORCHELASTIC_RESTART_COUNT`` (``attempt``: how
        many times the rank was replaced), ``TORCHELASTIC_MAX_RESTARTS`` (the budget),
        ``TORCHELASTIC_RUN_ID`` (the group) and, when known, ``WORLD_SIZE`` and the store of
        an unchanged ``init_process_group`` (``MASTER_ADDR``, ``MASTER_PORT``: rank 0 hosts
        it)."""
        env = {
            "RANK": str(rank),
            "LOCAL_RANK": str(self.ranks.index(rank)),
            "LOCAL_WORLD_SIZE": str(len(self.ranks)),
            "TORCHELASTIC_RESTART_COUNT": str(attempt),
            "TORCHELASTIC_MAX_RESTARTS": str(self.max_replacements if self.replace_failed else 0),
            "TORCHELASTIC_RUN_ID": self.group,
        }
        if self.world_size is not None:
            env["WORLD_SIZE"] = str(self.world_size)
        if self.master is not None:
            env["MASTER_ADDR"], env["MASTER_PORT"] = self.master[0], str(self.master[1])
        return env

    def _print_output(self, worker: Worker) -> None:
        """Each line the worker writes, prefixed with its rank; its last ones kept."""
        out = worker.process.stdout
        assert out is not None
        prefix = f"[rank {worker.rank}]: "
        for raw in out:
            line = raw.decode(errors="replace").rstrip("\n")
            worker.tail.append(line)
            with self._printing:
                target = self._output or sys.stdout
                target.write(prefix + line + "\n")
                target.flush()

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
        ended_at = time.time()
        with self._lock:
            stopping = self._stopping
        reported, error, left = False, None, False
        if returncode == -signal.SIGABRT and not stopping:
            left = self._left_cleanly(worker)
        if returncode != 0 and not stopping and not left:
            reported, error = self._report_death(worker, returncode)
        if worker.reader is not None:
            worker.reader.join(5.0)  # the last lines it wrote, for the summary
        tail = tuple(worker.tail) if worker.log_file is None else _file_tail(worker.log_file)
        exit_ = WorkerExit(
            worker.rank,
            worker.incarnation,
            worker.process.pid,
            returncode,
            reported,
            error,
            left,
            attempt=worker.attempt,
            ended_at=ended_at,
            tail=tail,
            log_file=worker.log_file,
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

    def summary(self) -> str:
        """The end-of-run summary (like torchrun's): each rank's processes and how each ended
        (exit code or signal), the replacements used of the budget, and the first error with
        the last lines its process wrote."""
        with self._lock:
            exits = list(self.exits)
            workers = dict(self._workers)
        by_rank: dict[int, list[WorkerExit]] = {}
        for e in exits:
            by_rank.setdefault(e.rank, []).append(e)
        failed = sorted(r for r in self.ranks if by_rank.get(r) and by_rank[r][-1].failed)
        running = sorted(r for r, w in workers.items() if w.process.poll() is None)
        if failed:
            verdict = f"{len(failed)} of {len(self.ranks)} ranks failed: {_ranks_text(failed)}"
        elif running:
            verdict = f"ranks {_ranks_text(running)} still running"
        else:
            verdict = f"every rank's last process exited cleanly ({len(self.ranks)} ranks)"
        budget = self.max_replacements if self.replace_failed else 0
        used = budget - self.replacements_left if self.replace_failed else 0
        lines = [
            "=" * 72,
            f"launch summary: group {self.group!r}: {verdict}; replacements used: {used} of "
            f"{budget}" + ("" if self.replace_failed else " (--max-restarts 0)"),
        ]
        for rank in self.ranks:
            parts = []
            for e in by_rank.get(rank, []):
                who = "first process" if e.attempt == 0 else f"replacement {e.attempt}"
                how = e.how() + (" after a clean exit (not a failure)" if e.left_cleanly else "")
                parts.append(f"{who} (pid {e.pid}) {how}")
            if rank in running:
                parts.append(f"pid {workers[rank].process.pid} still running")
            lines.append(f"  rank {rank}: " + ("; ".join(parts) or "never started"))
        first = min((e for e in exits if e.failed), key=lambda e: e.ended_at, default=None)
        if first is not None:
            where = f"; its output: {first.log_file}" if first.log_file else ""
            lines.append(f"first error: {first.describe()} at {_utc(first.ended_at)}{where}")
            lines.extend(f"  | {line}" for line in first.tail[-10:])
        lines.append("=" * 72)
        return "\n".join(lines)

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

    def _report_death(self, worker: Worker, returncode: int) -> tuple[bool, str | None]:
        how = (
            f"killed by {signal.Signals(-returncode).name}"
            if returncode < 0 and -returncode in signal.valid_signals()
            else f"exit status {returncode}"
        )
        reporter = f"the launcher on {socket.gethostname()} (pid {worker.process.pid} {how})"
        try:
            self.client.report_death(
                self.group, worker.rank, worker.incarnation, reporter=reporter[:200]
            )
        except (CoordinatorError, CoordinatorUnavailable) as exc:
            # A 409 stale_incarnation means a newer process already speaks for the rank.
            return False, str(exc)
        return True, None


def _file_tail(path: str, lines: int = TAIL_LINES) -> tuple[str, ...]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode(errors="replace")
    except OSError:
        return ()
    return tuple(text.splitlines()[-lines:])


def _utc(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%H:%M:%S.%f")[:-3] + "Z"


def _ranks_text(ranks: Sequence[int]) -> str:
    return ", ".join(str(r) for r in ranks)


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
            f"(python -m foldplane.coordinator group end {group} --coordinator "
            f"{client.addresses[0]}), "
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


#: torchrun's flags that ``agent.launch`` does not take, and what to do instead.
UNSUPPORTED: dict[str, str] = {
    "--standalone": "the launcher always runs against a coordinator: give --coordinator "
    "(or --rdzv-endpoint) and --group (or --rdzv-id)",
    "--rdzv-conf": "a foldplane group's settings are the coordinator's (POST /groups); for "
    "torchrun's own rendezvous use torchrun --rdzv-backend foldplane --rdzv-conf ...",
    "--monitor-interval": "the launcher sees a worker's death the moment it happens (no polling)",
    "--start-method": "workers are always started as new processes (subprocess)",
    "--role": "a group has one role",
    "--redirects": "use --log-dir (each rank's output in a file of its own)",
    "--tee": "use --log-dir, or read the [rank R] prefixed lines",
    "--local-ranks-filter": "every rank's lines are printed, prefixed with its rank",
    "--local-addr": "the store's address is --master-addr",
    "--run-path": "give the script's path",
    "--numa-binding": "not supported",
    "--logs-specs": "use --log-dir",
    "--event-log-handler": "the coordinator's log holds every event (GET /events)",
    "--log-line-prefix-template": "lines are prefixed [rank R]: (or go to --log-dir files)",
    "--signals-to-handle": "SIGTERM and SIGINT stop every worker",
    "--virtual-local-rank": "not supported",
    "--duplicate-stdout-filters": "use --log-dir, or read the [rank R] prefixed lines",
    "--duplicate-stderr-filters": "use --log-dir, or read the [rank R] prefixed lines",
    "--shutdown-timeout": "SIGTERM, then SIGKILL after 5 s",
    "--local-rank": "LOCAL_RANK is in each worker's environment",
}


class _Unsupported(argparse.Action):
    """A torchrun flag this launcher refuses, saying what to do instead."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: str | None = None) -> None:
        flag = (option or self.option_strings[0]).replace("_", "-")
        parser.error(
            f"torchrun's {option} is not supported by {parser.prog}: "
            f"{UNSUPPORTED.get(flag, 'not supported')} (docs/torchrun.md)"
        )


def _spellings(flag: str) -> list[str]:
    """torchrun takes every flag with dashes and with underscores."""
    return (
        [flag]
        if "_" not in flag[2:] and "-" not in flag[2:]
        else [flag, "--" + flag[2:].replace("-", "_")]
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=invoked_as("foldplane.agent.launch", "foldplane-launch"),
        description="Start the worker processes of a foldplane group, report deaths at once, "
        "and optionally replace failed workers. torchrun's flags are accepted where they mean "
        "the same (docs/torchrun.md).",
    )
    p.add_argument(
        "--coordinator",
        *_spellings("--rdzv-endpoint"),
        dest="coordinator",
        default=os.environ.get("FOLDPLANE_COORDINATOR"),
        help="coordinator URL(s), comma-separated (default: $FOLDPLANE_COORDINATOR); torchrun's "
        "--rdzv-endpoint means the same",
    )
    p.add_argument(
        "--group",
        *_spellings("--rdzv-id"),
        dest="group",
        default=os.environ.get("FOLDPLANE_GROUP"),
        help="the group name (torchrun's --rdzv-id means the same)",
    )
    p.add_argument(
        "--nproc",
        *_spellings("--nproc-per-node"),
        dest="nproc",
        type=_count("--nproc-per-node"),
        help="start ranks FIRST..FIRST+NPROC-1 on this machine (torchrun's --nproc-per-node)",
    )
    p.add_argument("--first-rank", type=int, default=0, help="the first rank (default 0)")
    p.add_argument("--ranks", help="explicit ranks, e.g. 0-3 or 4,5,7 (instead of --nproc)")
    p.add_argument(
        "--nnodes",
        help="torchrun's number of nodes (a number, not MIN:MAX): with --nproc-per-node, the "
        "group's world size is NNODES x NPROC and this machine runs node --node-rank's ranks",
    )
    p.add_argument(
        *_spellings("--node-rank"),
        dest="node_rank",
        type=int,
        default=None,
        help="this machine's node (torchrun's --node-rank): its ranks start at NODE_RANK x NPROC",
    )
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
        *_spellings("--max-restarts"),
        dest="max_restarts",
        type=_count("--max-restarts", zero=True),
        default=None,
        help="torchrun's restart budget: replace a failed worker, at most N times in all "
        "(--replace-failed --max-replacements N)",
    )
    p.add_argument(
        *_spellings("--log-dir"),
        dest="log_dir",
        default=None,
        help="each rank's output (stdout and stderr) in a file of its own here: rank-R.log, "
        "rank-R.replacement-N.log (default: lines on stdout prefixed [rank R]:)",
    )
    p.add_argument(
        *_spellings("--master-addr"),
        dest="master_addr",
        default=None,
        help="where the store of an unchanged init_process_group listens: the machine of rank 0 "
        "(default 127.0.0.1, when this launcher runs rank 0)",
    )
    p.add_argument(
        *_spellings("--master-port"),
        dest="master_port",
        type=int,
        default=None,
        help="its port (default: a free port, when this launcher runs rank 0)",
    )
    p.add_argument(
        *_spellings("--rdzv-backend"),
        dest="rdzv_backend",
        default=None,
        help="only 'foldplane' (the launcher's own; torchrun's c10d, etcd and static are "
        "torchrun's)",
    )
    for flag in UNSUPPORTED:
        p.add_argument(*_spellings(flag), action=_Unsupported, nargs="?", help=argparse.SUPPRESS)
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
        *_spellings("--no-python"),
        dest="no_python",
        action="store_true",
        help="run SCRIPT as an executable, not with python",
    )
    p.add_argument(
        "script", help="the worker script (or module with -m, executable with --no-python)"
    )
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the worker")
    return p


def _count(flag: str, *, zero: bool = False) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if not text.isdecimal() or (int(text) == 0 and not zero):
            extra = (
                " (torchrun's auto, cpu and gpu are not taken: give the number)"
                if flag == "--nproc-per-node"
                else ""
            )
            raise argparse.ArgumentTypeError(
                f"{flag} {text!r}: a whole number{'' if zero else ' >= 1'}{extra}"
            )
        return int(text)

    return parse


def free_port(addr: str) -> int:
    """A port free on ``addr`` now, for rank 0's store (torchrun picks its ``MASTER_PORT`` so
    when its agent does not host the store: ``get_free_port``)."""
    with socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET) as s:
        s.bind((addr, 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    if a.rdzv_backend not in (None, "foldplane"):
        p.error(
            f"--rdzv-backend {a.rdzv_backend}: {p.prog} always uses the foldplane "
            "coordinator; torchrun --rdzv-backend foldplane runs torchrun on it (docs/torchrun.md)"
        )
    if not a.coordinator:
        p.error("--coordinator (or FOLDPLANE_COORDINATOR) is required")
    coordinator = ",".join(
        u if "://" in u else f"http://{u}"
        for u in (x.strip() for x in a.coordinator.split(","))
        if u
    )
    if not a.group:
        p.error("--group (or FOLDPLANE_GROUP) is required")
    world_size = a.world_size
    if a.nnodes is not None:
        if not a.nnodes.isdecimal() or int(a.nnodes) < 1:
            p.error(
                f"--nnodes {a.nnodes}: {p.prog} takes a number of nodes; a range "
                "(MIN:MAX) is torchrun's elastic rendezvous: a foldplane group has a fixed world "
                "size and changes its members inside it; for elastic node counts run torchrun "
                "--rdzv-backend foldplane (docs/torchrun.md)"
            )
        if not a.nproc:
            p.error("--nnodes needs --nproc-per-node (the group's world size is their product)")
        nodes = int(a.nnodes)
        if world_size is not None and world_size != nodes * a.nproc:
            p.error(
                f"--world-size {world_size} is not --nnodes x --nproc-per-node ({nodes * a.nproc})"
            )
        world_size = nodes * a.nproc
        node_rank = a.node_rank or 0
        if not 0 <= node_rank < nodes:
            p.error(f"--node-rank {node_rank} is not in 0..{nodes - 1} (--nnodes {nodes})")
        a.first_rank = node_rank * a.nproc
    elif a.node_rank is not None:
        p.error("--node-rank needs --nnodes")
    if a.ranks:
        try:
            ranks = _parse_ranks(a.ranks)
        except ValueError:
            p.error(f"--ranks {a.ranks!r}: expected a list like 0-3 or 4,5,7")
    elif a.nproc:
        ranks = list(range(a.first_rank, a.first_rank + a.nproc))
    else:
        p.error("give --nproc N or --ranks LIST (or torchrun's --nproc-per-node N)")
    replace_failed, max_replacements = a.replace_failed, a.max_replacements
    if a.max_restarts is not None:
        replace_failed, max_replacements = a.max_restarts > 0, a.max_restarts
    if a.no_python:
        command = [a.script, *a.args]
    elif a.module:
        command = [sys.executable, "-m", a.script, *a.args]
    else:
        command = [sys.executable, a.script, *a.args]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s launch: %(message)s")
    launcher = Launcher(
        command,
        coordinator=coordinator,
        group=a.group,
        ranks=ranks,
        replace_failed=replace_failed,
        max_replacements=max_replacements,
        relay=not a.no_relay,
        world_size=world_size,
        log_dir=a.log_dir,
        prefix_output=a.log_dir is None,
    )
    try:
        timeout_s = start_timeout_s(a.start_timeout)
    except ValueError as exc:
        p.error(str(exc))
    refused = prepare_group(launcher.client, a.group, world_size, timeout_s)
    if refused is not None:
        print(f"launch: {refused}", file=sys.stderr)
        return 2
    if launcher.world_size is None:  # joining a group made elsewhere: WORLD_SIZE from it
        try:
            launcher.world_size = int(launcher.client.group(a.group)["config"]["world_size"])
        except (CoordinatorError, CoordinatorUnavailable, KeyError, TypeError, ValueError) as exc:
            log.warning("group %r: world size unknown (%s); WORLD_SIZE is not set", a.group, exc)
    if 0 in ranks:
        addr = a.master_addr or "127.0.0.1"
        try:
            port = a.master_port or free_port(addr)
        except OSError as exc:
            print(f"launch: no free port for rank 0's store on {addr}: {exc}", file=sys.stderr)
            return 2
        launcher.master = (addr, port)
    elif a.master_addr and a.master_port:
        launcher.master = (a.master_addr, a.master_port)
    else:
        log.warning(
            "MASTER_ADDR/MASTER_PORT are not set: rank 0 runs elsewhere; give --master-addr and "
            "--master-port (its launcher's) for a plain init_process_group script"
        )
    if launcher.master is not None:
        log.info(
            'MASTER_ADDR=%s MASTER_PORT=%d: init_process_group("gloo") forms a plain static '
            'group; init_process_group("foldplane") makes it elastic (docs/ddp.md)',
            *launcher.master,
        )

    def forward(signum: int, frame: object) -> None:
        threading.Thread(target=launcher.stop, daemon=True).start()

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    launcher.start()
    try:
        code = launcher.wait()
    finally:
        if launcher.relay is not None:
            launcher.relay.close()
        print(launcher.summary(), file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
