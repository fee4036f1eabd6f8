"""``python -m coordinator demo``: the whole loop on one machine, in well under a minute.

A coordinator on a SQLite file, 4 gloo workers (started by the launcher) running all_reduce in
a loop; one worker is SIGKILLed; the launcher reports the death, the survivors' operation fails
with a hint naming the dead rank, the coordinator commits a view without it and the survivors
carry on; a replacement process joins and is activated; the view history is printed, and the
user is told how to replay the log.

The same module is the demo's worker (``python -m foldplane.demo worker``), so the demo needs
nothing but the installed package.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .agent.invocation import invoked_as
from .coordinator.commands import serve_argv

GROUP = "demo"
WORLD_SIZE = 4
VICTIM = 2
#: How long the victim is frozen before the kill: the survivors loop every 50 ms, so by then
#: each is blocked in an all_reduce that needs the victim.
STALL_S = 0.3
#: Quick detection for a demo; real jobs use the defaults in docs/operations.md.
GROUP_CONFIG = {
    "heartbeat_timeout_s": 3.0,
    "ack_timeout_s": 10.0,
    "admission_timeout_s": 30.0,
    "formation_timeout_s": 120.0,
    "reconcile_window_s": 0.2,
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog=f"{invoked_as('foldplane.coordinator', 'foldplane-coordinator')} demo",
        description="Start a coordinator and 4 gloo workers, kill one, recover, show the history.",
    )
    p.add_argument("--db", help="the SQLite log to write (default: a new temporary directory)")
    p.add_argument("--port", type=int, default=0, help="HTTP port (default: a free one)")
    args = p.parse_args(argv)
    if args.db:
        db = Path(args.db).resolve()
        if db.exists():
            p.error(f"{db} exists; the demo writes a new log (pick another --db)")
        db.parent.mkdir(parents=True, exist_ok=True)
    else:
        db = Path(tempfile.mkdtemp(prefix="foldplane-demo-")) / "demo.db"
    return Demo(db, args.port or _free_port()).run()


#: The longest the demo stays silent while it waits: then it says what it waits for.
WAIT_NOTE_S = 3.0


class Demo:
    def __init__(self, db: Path, port: int) -> None:
        self.db = db
        self.url = f"http://127.0.0.1:{port}"
        self.port = port
        self.t0 = time.monotonic()
        self.last_said = self.t0
        self.server: subprocess.Popen[bytes] | None = None
        self.launcher: Any = None
        self.after = 0

    def say(self, text: str) -> None:
        self.last_said = time.monotonic()
        print(f"[{self.last_said - self.t0:5.1f}s] {text}", flush=True)

    def run(self) -> int:
        from .agent.client import CoordinatorClient

        self.client = CoordinatorClient(self.url, timeout_s=10.0)
        try:
            return self._story()
        except (TimeoutError, RuntimeError) as exc:
            self.say(f"the demo failed: {exc}")
            return 1
        finally:
            self._clean_up()

    def _story(self) -> int:
        from .agent.launch import Launcher

        logging.getLogger("foldplane.launch").setLevel(logging.ERROR)  # _on_exit tells the story
        print("foldplane demo: an elastic process group, a failure, and a recovery\n")
        self.say(f"1. starting a coordinator on the SQLite log {self.db}")
        self._start_server()
        self.say(f"   serving {self.url} (OpenAPI at {self.url}/docs)")

        self.client.create_group(GROUP, WORLD_SIZE, **GROUP_CONFIG)
        self.say(f"2. group {GROUP!r} of {WORLD_SIZE} ranks created; the launcher starts 4 workers")
        self.launcher = Launcher(
            [sys.executable, "-m", "foldplane.demo", "worker"],
            coordinator=self.url,
            group=GROUP,
            ranks=range(WORLD_SIZE),
            on_exit=self._on_exit,
        )
        self.launcher.start()
        view = self._wait_view(lambda v: v["version"] >= 1, "formation", 120)
        self.say(f"   view 1 committed: active_ranks {view['active_ranks']} (every rank HEALTHY)")
        self._pause(2.0)

        pid = self.launcher.worker(VICTIM).process.pid
        self.say(
            f"3. SIGKILL rank {VICTIM} (pid {pid}) while the others wait on it in an all_reduce"
        )
        # Frozen first, the victim cannot finish the step it is in, so the survivors are inside
        # an all_reduce when it dies (killed between two steps, the survivors might go straight
        # to the next view and the demo would show no failed operation).
        os.kill(pid, signal.SIGSTOP)
        time.sleep(STALL_S)
        killed_ns = time.time_ns()
        self.launcher.kill(VICTIM)
        view = self._wait_view(lambda v: VICTIM not in v["active_ranks"], "the failure", 30)
        self.say(
            f"   view {view['version']} committed {(view['ts'] - killed_ns) / 1e9:.2f} s after "
            f"the kill: active_ranks {view['active_ranks']} (cause: {view['cause']['kind']})"
        )
        self._pause(1.5)

        self.say(f"4. starting a replacement process for rank {VICTIM} (a new incarnation)")
        self.launcher.replace(VICTIM)
        self._wait_rank_state(VICTIM, "HEALTHY", 90)
        self.say(f"   rank {VICTIM} joined and is HEALTHY; proposing to activate it")
        first = self.client.propose(GROUP, "activate", [VICTIM], proposer="demo", wait_s=30)
        again = self.client.propose(GROUP, "activate", [VICTIM], proposer="demo", wait_s=30)
        self.say(
            f"   proposal {first['id']}: {first['status']} in view {first['version']}; an "
            f"identical proposal {again['id']}: {again['status']} in view {again['version']} "
            "(no second view change)"
        )
        view = self._wait_view(lambda v: VICTIM in v["active_ranks"], "the recovery", 30)
        self.say(f"   view {view['version']} committed: active_ranks {view['active_ranks']}")
        self._pause(2.0)

        self.say("5. stopping the workers (clean exits are not failures)")
        self.launcher.stop(grace_s=10)
        self.launcher = None
        self._print_history()
        print(
            f"\nThe log holds every input. Re-derive and check the history with:\n"
            f"  {invoked_as('foldplane.coordinator', 'foldplane-coordinator')} replay {self.db}\n"
        )
        return 0

    # -- steps -----------------------------------------------------------------------------------

    def _start_server(self) -> None:
        self.server = subprocess.Popen(
            serve_argv(
                str(self.db),
                self.port,
                *("--host", "127.0.0.1", "--store-port", "0", "--log-level", "warning"),
            ),
        )
        deadline = time.monotonic() + 60
        while True:
            if self.server.poll() is not None:
                raise RuntimeError(f"the coordinator exited with code {self.server.returncode}")
            try:
                self.client.healthz()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise TimeoutError("the coordinator did not answer within 60 s") from None
                time.sleep(0.2)

    def _wait_view(self, test: Callable[[dict[str, Any]], bool], what: str, timeout: float) -> dict:
        """Follow the committed views (a long poll on the updates) until one passes ``test``."""
        deadline = time.monotonic() + timeout
        while True:
            head = self._head()  # read first: a view committed after it wakes the long poll
            for view in self.client.view_history(GROUP, after_version=self.after):
                self.after = view["version"]
                if test(view):
                    return view
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no view for {what} within {timeout:.0f} s")
            self._still_waiting(what)
            self.client.updates(GROUP, 0, head, min(left, WAIT_NOTE_S))

    def _head(self) -> int:
        return int(self.client.healthz().get("fold_offset", 0))

    def _wait_rank_state(self, rank: int, state: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            ranks = self.client.group(GROUP)["ranks"]
            if next(r for r in ranks if r["rank"] == rank)["state"] == state:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {rank} not {state} within {timeout:.0f} s")
            self._still_waiting(f"rank {rank} to be {state}")
            time.sleep(0.2)

    def _still_waiting(self, what: str) -> None:
        """After :data:`WAIT_NOTE_S` without a line, say what the demo waits for and where the
        ranks stand: a new worker spends its first seconds importing torch, and a newcomer
        watching a silent terminal thinks it hung."""
        if time.monotonic() - self.last_said < WAIT_NOTE_S:
            return
        counts = self.client.group(GROUP)["rank_counts"]
        self.say(
            f"   ... waiting for {what}: {counts['HEALTHY']} HEALTHY, {counts['SYNCED']} SYNCED, "
            f"{counts['OFFLINE']} OFFLINE (a new worker first imports torch, then joins)"
        )

    def _pause(self, seconds: float) -> None:
        """Let the workers' loop run for a moment so the reader sees it."""
        time.sleep(seconds)

    def _on_exit(self, exit_: Any) -> None:
        note = "; the launcher reported the death at once" if exit_.reported else ""
        self.say(f"   [launcher] {exit_.describe()}{note}")

    def _print_history(self) -> None:
        views = self.client.view_history(GROUP)
        print("\nView history (GET /views/history):")
        print(f"  {'version':>7}  {'active_ranks':<14} {'cause':<18} {'acked':<14} dropped")
        for v in views:
            print(
                f"  {v['version']:>7}  {str(v['active_ranks']):<14} {v['cause']['kind']:<18} "
                f"{str(v.get('acked_ranks', [])):<14} {v.get('dropped_ranks', [])}"
            )
        if views:
            print(
                f"  (the workers then left cleanly: view {views[-1]['version']} stays the last one, "
                "its ranks OFFLINE and exited; a clean exit is never a failure and never empties a "
                "view)"
            )

    def _clean_up(self) -> None:
        if self.launcher is not None:
            self.launcher.stop(grace_s=5)
        if self.server is not None and self.server.poll() is None:
            self.server.terminate()
            try:
                self.server.wait(10)
            except subprocess.TimeoutExpired:
                self.server.kill()
        self.client.close()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the worker ----------------------------------------------------------------------------------


def worker() -> int:
    """One rank: all_reduce in a loop, saying what happens to it; SIGTERM ends it cleanly."""
    import torch

    from .agent import Agent

    logging.getLogger("foldplane.agent.dataplane").setLevel(logging.ERROR)  # the loop says what happened
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    agent = Agent(heartbeat_interval_s=0.5, collective_timeout_s=5.0, p2p_timeout_s=5.0).start()
    rank = agent.rank
    incarnation = agent.incarnation[:8]

    def say(text: str) -> None:
        # One write per line: the workers share the demo's stdout, and print() writes the line
        # and its newline separately, so two workers' lines could run together.
        sys.stdout.write(f"          [rank {rank} {incarnation}] {text}\n")
        sys.stdout.flush()

    agent.wait_for_view(timeout=120)
    pg = agent.process_group()
    version, steps, last_report = 0, 0, 0.0
    t = torch.ones(1024)
    while not stop.is_set():
        t.fill_(1.0)
        # The op runs on the view installed when it is issued (a newer one may arrive meanwhile).
        issued_on, active = pg.version, rank in pg.active_ranks
        if issued_on != version:
            version = issued_on
            role = "active" if active else "inactive (waiting to be activated)"
            say(f"now on view {version}, active_ranks {list(pg.active_ranks)}: {role}")
        work = pg.all_reduce(t, async_op=True)
        ok = work.wait()
        steps += 1
        if not ok:
            # When the demo stops its workers (SIGTERM to each at once), a peer that left
            # cleanly first fails this op: that is the stop, not a failure, so say nothing.
            if stop.wait(1.0):
                break
            hint = pg.get_failed_ranks_hint(work).tolist()
            if not any(hint):
                # Nobody failed: most often the group moved on under this op (a peer installed
                # the next view and let this one go while this rank still ran an op on it),
                # as a view change that only adds ranks can do. Said so if that view comes
                # within an op's deadline, as the data plane itself tells it.
                try:
                    newer = agent.wait_for_view(issued_on + 1, timeout=5.0).version
                except TimeoutError:
                    newer = None
                if newer is not None:
                    say(
                        f"all_reduce in view {issued_on} did not finish: the group moved on to "
                        f"view {newer} under it, no rank failed (failed_ranks_hint {hint})"
                    )
                    continue
            say(f"all_reduce FAILED in view {issued_on}: failed_ranks_hint {hint}")
            agent.wait_for_view(issued_on + 1, timeout=60)
            continue
        now = time.monotonic()
        if now - last_report > 3.0 and active:
            say(f"step {steps}: all_reduce ok, sum {t[0].item():.0f}")
            last_report = now
        stop.wait(0.05)
    agent.close()
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["worker"]:
        os.environ.setdefault("PYTHONUNBUFFERED", "1")
        raise SystemExit(worker())
    raise SystemExit(main(sys.argv[1:]))
