"""The data plane on torch's reconfigurable gloo: a view's backend reconfigured, or built fresh.

Two groups of 4 gloo worker processes run side by side over one TCPStore (hosted here, as the
coordinator hosts it), each worker looping on a 4 KB all_reduce (5 ms between steps):
- **reconfigure**: ``DataPlane(gloo_reconfigure=True)``: every view reconfigures one
  ``ProcessGroupGloo(enable_reconfigure=True)`` per rank (torch >= 2.14; docs/dataplane.md);
- **fresh** (the baseline, the path of every torch before 2.14): a new ``ProcessGroupGloo``
  per view.

Each cycle SIGKILLs one rank (ranks 3, 2, 1 in turn) of one group while the others loop, and
commits the survivors' view at the kill (as the launcher's death report lets the coordinator do
within milliseconds); measured is the time from the kill until every survivor has finished an
all_reduce on that view. The victim's replacement is then started and a view of all 4 committed
(``rejoin``: from that commit until every member has finished an all_reduce on it). The cycles
alternate between the groups (ABBA), so that the shared machine's noise hits both alike.
Row: ``recovery reconfigure gloo kill 1 of 4 -> first all_reduce``, ratio fresh / reconfigure
(above 1: reconfiguring is faster). Skipped, saying why, on a torch without gloo's reconfigure.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import threading
import time
import uuid
import warnings
from datetime import timedelta
from typing import Any

from .harness import Result, lower_is_better_ratio, median, percentile
from .kit.workers import say

BENCH = "reconfigure"
WORLD = 4
NUMEL = 1024  # 4 KB of float32: the build, not the bytes, is what differs
STEP_PAUSE_S = 0.005
PATHS = {"reconfigure": True, "fresh": False}
METRIC = "recovery reconfigure gloo kill 1 of 4 -> first all_reduce"
REPLY_S = 120.0

_log = say(BENCH)


def _worker(rank: int, port: int, path: str, conn: Any, out: Any) -> None:
    """A rank of group ``path``: installs the views it is sent, loops on all_reduce, and puts
    ``(path, rank, version, t)`` on ``out`` at its first success on each view."""
    warnings.filterwarnings("ignore")
    import torch

    from ..agent.dataplane import DataPlane

    dp = DataPlane(
        rank,
        WORLD,
        "127.0.0.1",
        port,
        incarnation=uuid.uuid4().hex,
        store_prefix=f"{path}/",
        gloo_reconfigure=PATHS[path],
        collective_timeout_s=10.0,
        p2p_timeout_s=10.0,
        liveness_period_s=0.05,
        liveness_window_periods=3,
    )
    pg = dp.process_group()
    stop = threading.Event()

    def loop() -> None:
        t = torch.ones(NUMEL)
        reported = 0
        while not stop.is_set():
            try:
                version = pg.version
                ok = pg.all_reduce(t, async_op=True).wait()
            except Exception:  # no view yet
                ok, version = False, 0
            if ok and version > reported:
                reported = version
                out.put((path, rank, version, time.time()))
            stop.wait(STEP_PAUSE_S)

    conn.send("up")
    looping = threading.Thread(target=loop, daemon=True)
    while True:
        cmd, arg = conn.recv()
        if cmd == "install":
            dp.install_view(*arg)
            if not looping.is_alive():
                looping.start()
            conn.send(None)
        elif cmd == "stop":
            stop.set()
            looping.join(5) if looping.is_alive() else None
            counts = None if dp.persistent_gloo is None else dp.persistent_gloo.built
            dp.close()
            conn.send(counts)
            return


class _Group:
    """One group of 4 workers (one path) and its views."""

    def __init__(self, ctx: Any, port: int, path: str, out: Any) -> None:
        self.ctx, self.port, self.path, self.out = ctx, port, path, out
        self.procs: dict[int, Any] = {}
        self.conns: dict[int, Any] = {}
        self.version = 0
        for r in range(WORLD):
            self.spawn(r)

    def spawn(self, rank: int) -> None:
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(
            target=_worker, args=(rank, self.port, self.path, child, self.out), daemon=True
        )
        proc.start()
        self.procs[rank], self.conns[rank] = proc, parent
        if not parent.poll(REPLY_S) or parent.recv() != "up":
            raise RuntimeError(f"{self.path} rank {rank} did not start")

    def commit(self, members: list[int]) -> int:
        self.version += 1
        for r in self.procs:
            self.conns[r].send(("install", (self.version, members)))
        for r in self.procs:
            if not self.conns[r].poll(REPLY_S):
                raise RuntimeError(f"{self.path} rank {r} did not install view {self.version}")
            self.conns[r].recv()
        return self.version

    def kill(self, rank: int) -> None:
        os.kill(self.procs.pop(rank).pid, signal.SIGKILL)
        self.conns.pop(rank).close()

    def stop(self) -> dict[int, Any]:
        built = {}
        for r in list(self.procs):
            self.conns[r].send(("stop", None))
        for r in list(self.procs):
            built[r] = self.conns[r].recv() if self.conns[r].poll(30) else "no answer"
            self.procs[r].join(10)
        return built


def _wait_for(out: Any, path: str, version: int, ranks: set[int], timeout: float) -> float:
    """The time of the last of ``ranks`` to report a success on ``version`` of ``path``."""
    seen: dict[int, float] = {}
    deadline = time.monotonic() + timeout
    while set(seen) != ranks:
        try:
            p, rank, v, t = out.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError(
                f"{path}: ranks {sorted(ranks - set(seen))} never finished an all_reduce on "
                f"view {version} within {timeout} s"
            ) from None
        if p == path and v == version and rank in ranks:
            seen.setdefault(rank, t)
    return max(seen.values())


def run(quick: bool) -> list[Result]:
    from torch.distributed import TCPStore

    from ..agent.dataplane.persistent import SUPPORTED

    if not SUPPORTED:
        import torch

        _log(f"skipped: torch {torch.__version__} has no reconfigurable gloo (torch >= 2.14)")
        return []
    cycles = 4 if quick else 60
    store = TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60)
    )
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    groups = {path: _Group(ctx, store.port, path, out) for path in PATHS}
    everyone = list(range(WORLD))
    for g in groups.values():
        v = g.commit(everyone)
        _wait_for(out, g.path, v, set(everyone), REPLY_S)
    recovery: dict[str, list[float]] = {p: [] for p in PATHS}
    rejoin: dict[str, list[float]] = {p: [] for p in PATHS}
    order = list(PATHS)
    for cycle in range(cycles):
        victim = WORLD - 1 - cycle % (WORLD - 1)  # 3, 2, 1, 3, ...
        survivors = [r for r in everyone if r != victim]
        for path in order if cycle % 2 == 0 else order[::-1]:  # ABBA
            g = groups[path]
            time.sleep(0.2)  # the loop runs steadily on the full view
            killed = time.time()
            g.kill(victim)
            v = g.commit(survivors)
            recovery[path].append(_wait_for(out, path, v, set(survivors), REPLY_S) - killed)
            g.spawn(victim)
            committed = time.time()
            v = g.commit(everyone)
            rejoin[path].append(_wait_for(out, path, v, set(everyone), REPLY_S) - committed)
            _log(
                f"cycle {cycle + 1}/{cycles} {path}: kill of rank {victim} -> "
                f"{recovery[path][-1] * 1e3:.1f} ms; rejoin {rejoin[path][-1] * 1e3:.1f} ms"
            )
    built = {path: g.stop() for path, g in groups.items()}
    ms = lambda xs: [x * 1e3 for x in xs]  # noqa: E731
    ours, theirs = ms(recovery["reconfigure"]), ms(recovery["fresh"])
    return [
        Result(
            BENCH,
            METRIC,
            "ms",
            median(ours),
            p99=percentile(ours, 99),
            baseline="a fresh ProcessGroupGloo per view (gloo_reconfigure=False), same run",
            baseline_median=median(theirs),
            ratio=lower_is_better_ratio(median(ours), median(theirs)),
            extra={
                "cycles": cycles,
                "samples_ms": [round(x, 1) for x in ours],
                "baseline_samples_ms": [round(x, 1) for x in theirs],
                "rejoin_ms": round(median(ms(rejoin["reconfigure"])), 1),
                "baseline_rejoin_ms": round(median(ms(rejoin["fresh"])), 1),
                # backends each surviving original rank built (1: every view reconfigured it)
                "reconfigure_backends_built": built["reconfigure"],
            },
        )
    ]
