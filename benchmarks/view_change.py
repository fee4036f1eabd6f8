"""View change latency: ``POST /proposals?wait=`` until ``applied``, with 4, 64 and 512 agents.

Each trial is one full barrier on a real coordinator with a SQLite log: the proposal is appended
(durable), the fold admits it and prepares version v+1, the prepare is pushed to every participant's
host and each rank ACKs (durable), the fold commits, the projections are written, and only then does
the waiting ``POST`` answer. Trials alternate ``deactivate [last]`` / ``activate [last]`` so each
one really changes the view. The agents are simulated hosts (``agent.simhost``: the real
``AgentMachine`` per rank), 8 ranks to a host (4 agents: one host), each on its channel: its ACKs
batched in one message, its ranks' updates pushed to it.

Baseline, measured in the same run: torchft's lighthouse (torchft-nightly, the ``bench``
extra) forming a quorum of the same number of replicas, each replica a thread calling
``LighthouseClient.quorum`` at once; a round is timed from the first call to the last answer.
The lighthouse keeps its state in memory only (nothing is made durable), and it answers a
quorum, not a two-phase barrier with ACKs, so it is a floor to compare against, not a twin. Its
replicas are threads of one process, as the simulated agents are coroutines of one: at 512 the
round includes what 512 blocking client threads cost that process.

Beside the rows, in the same run, the floor every barrier stands on: one durable SQLite append
(``fsync floor``, ``Log.append`` of one record with its fsync; a view change makes at least two,
the proposal and the ACKs, and the lighthouse none).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from collections.abc import Iterator

from ..coordinator.runtime import loop_factory
from .harness import Result, lower_is_better_ratio, median, percentile
from .kit.baselines import quorum_rounds
from .kit.floors import fsync_floor
from .kit.service import Service
from .kit.simulated import form_group

SIZES = (4, 64, 512)
TARGETS = {4: ">= 1.0x torchft", 64: ">= 2.0x torchft", 512: ">= 2.0x torchft"}
CONFIG = {
    "heartbeat_timeout_s": 30.0,
    "ack_timeout_s": 30.0,
    "admission_timeout_s": 30.0,
    "reconcile_window_s": 0.0,
}


async def _measure(coordinator: Service, size: int, trials: int) -> list[float]:
    group = f"vc{size}"
    cluster = await form_group(coordinator, group, size, per_host=8, **CONFIG)
    conn = await coordinator.connect()
    latencies: list[float] = []
    try:
        for i in range(trials + 2):  # the first two warm up
            op = "deactivate" if i % 2 == 0 else "activate"
            t0 = time.perf_counter()
            status, body = await conn.request(
                "POST", "/proposals?wait=30", {"group": group, "op": op, "ranks": [size - 1]}
            )
            elapsed = time.perf_counter() - t0
            if status != 200 or body["status"] != "applied":
                raise RuntimeError(f"{op} [{size - 1}] in {group}: {status} {body}")
            if i >= 2:
                latencies.append(elapsed * 1000)
    finally:
        await conn.close()
        await cluster.stop()
    return latencies


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """The lighthouse logs every quorum at INFO from native code; keep it off the table."""
    saved = os.dup(2)
    with open(os.devnull, "wb") as null:
        os.dup2(null.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _lighthouse(replicas: int, rounds: int) -> tuple[list[float] | None, str]:
    """Quorum latency of torchft's lighthouse, or None and the reason it could not run."""
    with _quiet_stderr():
        return _lighthouse_rounds(replicas, rounds)


def _lighthouse_rounds(replicas: int, rounds: int) -> tuple[list[float] | None, str]:
    try:
        from torchft._torchft import LighthouseServer
    except ImportError as exc:
        return None, f"torchft not installed ({exc}); pip install -c constraints-dev.txt '.[bench]'"
    server = LighthouseServer(
        bind="[::]:0", min_replicas=replicas, join_timeout_ms=60_000, quorum_tick_ms=1
    )
    try:
        return quorum_rounds(server.address(), replicas, rounds), (
            "in-memory quorum, quorum_tick_ms=1"
        )
    finally:
        server.shutdown()


async def _run_async(quick: bool) -> list[Result]:
    trials = 15 if quick else 50
    results: list[Result] = []
    coordinator = Service(name="view-change").start()
    try:
        measured = {
            size: await _measure(coordinator, size, trials if size < 512 else trials // 2)
            for size in SIZES
        }
    finally:
        coordinator.close()
    for size in SIZES:
        lat = measured[size]
        rounds = trials if size < 512 else trials // 2
        baseline, note = await asyncio.to_thread(_lighthouse, size, rounds)
        ours = median(lat)
        theirs = median(baseline) if baseline else None
        results.append(
            Result(
                bench="view_change",
                metric=f"proposal to applied, {size} agents",
                unit="ms",
                median=ours,
                p99=percentile(lat, 99),
                baseline=f"torchft lighthouse quorum, {size} replicas",
                baseline_median=theirs,
                ratio=lower_is_better_ratio(ours, theirs) if theirs else None,
                target=TARGETS.get(size),
                extra={"trials": len(lat), "baseline_note": note} if note else {"trials": len(lat)},
            )
        )
    with tempfile.TemporaryDirectory(prefix="foldplane-bench-fsync-") as tmp:
        fsync = await fsync_floor(f"{tmp}/floor.db", trials)
    results.append(
        Result(
            bench="view_change",
            metric="fsync floor (one durable SQLite append)",
            unit="ms",
            median=median(fsync),
            p99=percentile(fsync, 99),
            extra={"appends": len(fsync)},
        )
    )
    return results


def run(quick: bool) -> list[Result]:
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(_run_async(quick))
