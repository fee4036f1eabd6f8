"""Fixtures of the agent suites: a real coordinator server and real worker processes.

``coordinator`` starts ``python -m coordinator serve`` on a SQLite file in the test's temporary
directory, at a free loopback port, and stops it afterwards. ``Workers`` starts
``tests/agent/worker.py`` processes through the real launcher and talks to each one over its
stdin/stdout: the test sends a command and waits for the answering event, with a deadline.
"""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from foldplane.agent.client import CoordinatorClient
from foldplane.agent.launch import Launcher, WorkerExit
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("worker.py")

#: Group settings for tests: quick failure detection, deadlines that fail a broken test soon.
FAST_GROUP = {
    "heartbeat_timeout_s": 3.0,
    "ack_timeout_s": 10.0,
    "admission_timeout_s": 20.0,
    "formation_timeout_s": 60.0,
    "reconcile_window_s": 0.2,
}


@dataclass
class Coordinator:
    url: str
    db: Path
    process: subprocess.Popen[bytes]
    client: CoordinatorClient
    log_path: Path
    output: ServerOutput

    def create_group(self, group: str, world_size: int, **config: Any) -> dict[str, Any]:
        return self.client.create_group(group, world_size, **{**FAST_GROUP, **config})

    def view(self, group: str) -> dict[str, Any]:
        return self.client.current_view(group)

    def history(self, group: str) -> list[dict[str, Any]]:
        return self.client.view_history(group)

    def status(self, group: str) -> dict[str, Any]:
        """``GET /groups/{group}``: the view, the change in flight, and each rank's state."""
        return self.client.group(group)

    def rank(self, group: str, rank: int) -> dict[str, Any]:
        ranks = self.status(group)["ranks"]
        return next(r for r in ranks if r["rank"] == rank)


def start_coordinator(tmp: Path, port: int | None = None, store_port: int = 0) -> Coordinator:
    """A server on ``tmp/log.db``; a given ``port`` restarts one where a previous one served
    (``store_port``: its rendezvous store's, 0 for any free one).

    Waits for uvicorn's "running" line on the server's output (an event, not a poll); the
    output goes to ``tmp/coordinator.log`` (``Coordinator.output``).
    """
    port = port or free_port()
    db = tmp / "log.db"
    log_path = tmp / "coordinator.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "foldplane.coordinator", "serve", "--db", str(db), "--host", "127.0.0.1",
         "--port", str(port), "--store-port", str(store_port)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    output = ServerOutput(process, log_path)
    if not output.wait_for("Uvicorn running on", 90):  # False at once if the server exited
        process.kill()
        raise RuntimeError(f"the coordinator did not start: {log_path.read_text()}")
    url = f"http://127.0.0.1:{port}"
    return Coordinator(url, db, process, CoordinatorClient(url, timeout_s=30.0), log_path, output)


class ServerOutput:
    """A server's output, copied line by line to ``path`` by a thread of its own, where a line's
    arrival is an event: ``wait_for`` a line instead of polling the file."""

    def __init__(self, process: subprocess.Popen[bytes], path: Path) -> None:
        self.path = path
        self._lines: list[bytes] = []
        self._ended = False  # the server closed its output (it exited)
        self._cond = threading.Condition()
        threading.Thread(target=self._copy, args=(process,), daemon=True).start()

    def wait_for(self, text: str, timeout: float) -> bool:
        """True once a line holding ``text`` was written; False if the output ended without
        one, or at ``timeout``."""
        needle = text.encode()
        looked = 0  # the lines looked at so far

        def found() -> bool:
            nonlocal looked
            while looked < len(self._lines):
                if needle in self._lines[looked]:
                    return True
                looked += 1
            return self._ended

        with self._cond:
            self._cond.wait_for(found, timeout)
            return looked < len(self._lines)

    def _copy(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        with open(self.path, "wb") as out:
            for line in process.stdout:
                out.write(line)
                out.flush()
                with self._cond:
                    self._lines.append(line)
                    self._cond.notify_all()
        with self._cond:
            self._ended = True
            self._cond.notify_all()


def stop_coordinator(c: Coordinator) -> None:
    c.client.close()
    c.process.terminate()
    try:
        c.process.wait(10)
    except subprocess.TimeoutExpired:
        c.process.kill()
        c.process.wait()


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[Coordinator]:
    c = start_coordinator(tmp_path)
    yield c
    stop_coordinator(c)


@pytest.fixture(scope="module")
def module_coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Coordinator]:
    """One server for a whole module, for tests that each use groups of their own."""
    c = start_coordinator(tmp_path_factory.mktemp("coordinator"))
    yield c
    stop_coordinator(c)


@dataclass
class Workers:
    """Worker processes of one group, started by the real launcher, driven over stdin/stdout."""

    coordinator: Coordinator
    group: str
    world_size: int
    collective_timeout_s: float = 5.0
    script: Path = WORKER
    #: keep each process's stderr (``stderr_of``) instead of passing it through
    capture_stderr: bool = False
    launcher: Launcher = field(init=False)
    events: dict[int, queue.Queue[dict[str, Any]]] = field(default_factory=dict)
    exits: queue.Queue[WorkerExit] = field(default_factory=queue.Queue)
    #: what each process wrote to stderr, by pid (with ``capture_stderr``)
    stderr: dict[int, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.launcher = Launcher(
            [sys.executable, str(self.script), str(self.collective_timeout_s)],
            coordinator=self.coordinator.url,
            group=self.group,
            ranks=range(self.world_size),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if self.capture_stderr else None,
            on_exit=self.exits.put,
            env={"PYTHONPATH": str(ROOT), **_base_env()},
        )

    def start(self, ranks: list[int] | None = None) -> None:
        for rank in range(self.world_size) if ranks is None else ranks:
            self.spawn(rank)

    def spawn(self, rank: int) -> str:
        """Start (or replace) ``rank``; returns the new incarnation."""
        worker = self.launcher.spawn(rank)
        q: queue.Queue[dict[str, Any]] = queue.Queue()
        self.events[rank] = q
        threading.Thread(target=_read_events, args=(worker.process, q), daemon=True).start()
        if self.capture_stderr:
            lines = self.stderr.setdefault(worker.process.pid, [])
            threading.Thread(target=_read_lines, args=(worker.process, lines), daemon=True).start()
        return worker.incarnation

    def stderr_of(self, rank: int) -> str:
        """What the process now serving ``rank`` wrote to stderr so far."""
        return "".join(self.stderr[self.launcher.worker(rank).process.pid])

    def send(self, targets: int | list[int], cmd: str, **args: Any) -> None:
        for rank in [targets] if isinstance(targets, int) else targets:
            stdin = self.launcher.worker(rank).process.stdin
            assert stdin is not None
            stdin.write((json.dumps({"cmd": cmd, **args}) + "\n").encode())
            stdin.flush()

    def expect(self, rank: int, event: str, timeout: float = 60.0) -> dict[str, Any]:
        """The next event ``event`` from ``rank`` (an ``error`` event fails the test)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"rank {rank}: no {event!r} event within {timeout} s")
            try:
                got = self.events[rank].get(timeout=left)
            except queue.Empty:
                continue
            if got["event"] == "error":
                raise AssertionError(
                    f"rank {rank}: {got['cmd']} failed: {got['error']}\n{got.get('tb', '')}"
                )
            if got["event"] == "exited":
                raise AssertionError(f"rank {rank} exited while waiting for {event!r}")
            if got["event"] == event:
                return got

    def ask(
        self, targets: list[int], cmd: str, event: str, timeout: float = 60.0, **args: Any
    ) -> dict[int, dict[str, Any]]:
        """Send ``cmd`` to every rank of ``targets`` at once, then collect each one's ``event``."""
        self.send(targets, cmd, **args)
        return {r: self.expect(r, event, timeout) for r in targets}

    def stop(self) -> None:
        for rank in list(self.events):
            with contextlib.suppress(OSError, ValueError):
                self.send(rank, "close")
        with contextlib.suppress(TimeoutError):
            self.launcher.wait(timeout=15)
        self.launcher.stop(grace_s=5)


def _base_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("FOLDPLANE_")}


def _read_lines(process: subprocess.Popen[bytes], lines: list[str]) -> None:
    assert process.stderr is not None
    for raw in process.stderr:
        lines.append(raw.decode(errors="replace"))


def _read_events(process: subprocess.Popen[bytes], q: queue.Queue[dict[str, Any]]) -> None:
    assert process.stdout is not None
    for raw in process.stdout:
        line = raw.decode(errors="replace").strip()
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                q.put(json.loads(line))
    q.put({"event": "exited"})


@pytest.fixture
def workers(coordinator: Coordinator) -> Iterator[Any]:
    """A factory: ``workers("g", 4)`` creates the group and starts its 4 workers."""
    made: list[Workers] = []

    def make(
        group: str,
        world_size: int,
        *,
        start: bool = True,
        collective_timeout_s: float = 5.0,
        script: Path = WORKER,
        capture_stderr: bool = False,
        **config: Any,
    ) -> Workers:
        coordinator.create_group(group, world_size, **config)
        w = Workers(coordinator, group, world_size, collective_timeout_s, script, capture_stderr)
        made.append(w)
        if start:
            w.start()
        return w

    yield make
    for w in made:
        w.stop()
