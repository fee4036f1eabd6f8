"""What a benchmark's workers print, and how the benchmark reads it back.

A worker is the benchmark's own module run as a script (``python benchmarks/NAME.py MODE``);
it prints one JSON object a line on stdout per event (:func:`emit`), with wall-clock times
(``time.time()``): one clock on one machine, the clock of the kill and of the log's records.
The benchmark follows every worker's stdout (every incarnation's, through the launcher's
``on_spawn``) into one :class:`Lines`, and waits on it.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

_emitting = threading.Lock()


def emit(**fields: Any) -> None:
    """One JSON line on stdout, written whole (a worker may emit from several threads)."""
    line = json.dumps(fields) + "\n"
    with _emitting:
        sys.stdout.write(line)
        sys.stdout.flush()


def start_agent(timeout_s: float = 30.0, **options: Any) -> Any:
    """The worker's ``Agent`` from its launcher's environment, started, holding its first view:
    heartbeats every 0.5 s, collectives and point-to-point ops bounded by ``timeout_s``;
    ``options`` are more of the Agent's. Its log goes to stderr at ``$BENCH_LOG_LEVEL``
    (ERROR unless set)."""
    from ...agent import Agent

    logging.basicConfig(
        level=os.environ.get("BENCH_LOG_LEVEL", "ERROR"),
        format="%(asctime)s %(process)d %(name)s %(message)s",
    )
    agent = Agent(
        heartbeat_interval_s=0.5, collective_timeout_s=timeout_s, p2p_timeout_s=timeout_s, **options
    )
    agent.start(timeout_s=300)
    agent.wait_for_view(timeout=300)
    return agent


def all_reduce_loop(agent: Any, report: Callable[[int], object], pause_s: float) -> None:
    """All-reduce 1,024 floats on the agent's group forever, ``pause_s`` between steps;
    ``report(version)`` at this rank's first success on each view it is active in; after a
    failure, wait for the next view."""
    import torch

    pg = agent.process_group()
    t = torch.ones(1024)
    pause = threading.Event()
    reported = 0
    while True:
        t.fill_(1.0)
        # The view the op runs on is the one installed when it is issued: a newer view may be
        # installed while it runs, and waiting for "the view after the current one" would then
        # wait for a view that never comes.
        version, active = pg.version, agent.rank in pg.active_ranks
        ok = pg.all_reduce(t, async_op=True).wait()
        if ok and version != reported and active:
            reported = version
            report(version)
        if not ok:
            agent.wait_for_view(version + 1, timeout=120)
        pause.wait(pause_s)


def abba(
    blocks: int, steps: int, systems: Sequence[str], step: Callable[[str, int], object]
) -> Iterator[tuple[int, str, list[float]]]:
    """Two systems in the same processes, in blocks of ``steps`` steps each, the order flipped
    every block (ABBA, so drift in the machine's speed falls on both alike):
    ``step(system, n)`` is the n-th step overall; yields ``(block, system, seconds of each of
    its steps)`` after each block of one system."""
    n = 0
    for b in range(blocks):
        for system in systems if b % 2 == 0 else list(reversed(systems)):
            times = []
            for _ in range(steps):
                n += 1
                t0 = time.perf_counter()
                step(system, n)
                times.append(time.perf_counter() - t0)
            yield b, system, times


def say(bench: str) -> Callable[[str], None]:
    """How benchmark ``bench`` reports progress: ``# bench: text`` lines on stderr."""

    def log(text: str) -> None:
        print(f"# {bench}: {text}", file=sys.stderr, flush=True)

    return log


class Lines:
    """The JSON lines of every process followed, merged into one queue; every line read is
    kept in :attr:`seen`, in the order read."""

    def __init__(self) -> None:
        self.queue: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        #: Lines that began as a JSON object and were not one (two processes' lines run
        #: together in a shared pipe): a timeout names them.
        self.garbled: list[str] = []

    def follow(self, source: Any) -> None:
        """Read ``source``'s stdout (a ``Popen``, or a launcher's worker that has a
        ``.process``) in a thread of its own; lines that are not JSON objects are skipped."""
        process: subprocess.Popen[bytes] = getattr(source, "process", source)

        def read() -> None:
            assert process.stdout is not None
            with process.stdout:  # closed at EOF: nobody else reads it
                for raw in process.stdout:
                    line = raw.decode(errors="replace").strip()
                    if line.startswith("{"):
                        try:
                            self.queue.put(json.loads(line))
                        except ValueError:
                            self.garbled.append(line)

        threading.Thread(target=read, daemon=True).start()

    def until(self, done: Callable[[dict[str, Any]], bool], timeout: float, what: str) -> None:
        """Read lines, each passed to ``done``, until it returns True for one."""
        deadline = time.monotonic() + timeout
        while not done(self._next(deadline, timeout, what)):
            pass

    def wait_for(self, holds: Callable[[], bool], timeout: float, what: str) -> None:
        """Read lines until ``holds()`` (a condition on :attr:`seen`) is true; at once if it
        already is."""
        deadline = time.monotonic() + timeout
        while not holds():
            self._next(deadline, timeout, what)

    def drain(self) -> None:
        """Read every line already queued, without waiting (:attr:`seen` is then current)."""
        while True:
            try:
                self.seen.append(self.queue.get_nowait())
            except queue.Empty:
                return

    def _next(self, deadline: float, timeout: float, what: str) -> dict[str, Any]:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                garbled = f"; lines not read as JSON: {self.garbled[-4:]}" if self.garbled else ""
                raise TimeoutError(
                    f"{what}: not within {timeout:.0f} s; last: {self.seen[-4:]}{garbled}"
                )
            try:
                line = self.queue.get(timeout=left)
            except queue.Empty:
                continue
            self.seen.append(line)
            return line
