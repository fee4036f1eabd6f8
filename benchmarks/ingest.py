"""Ingest: 64 simulated hosts x 8 ranks heartbeating (batched per host) while proposals run.

One group of 512 ranks on a real coordinator with a SQLite log (WAL, ``synchronous=FULL``).
Every heartbeat is durable before its request is answered. Two measurements:

- **saturation**: every host sends its next batch as soon as the last one is answered (closed
  loop); the figure is acknowledged heartbeats per second over the window.
- **latency at the target rate**: hosts send on a fixed schedule (open loop) so that 10,000
  heartbeats/s are offered; a request's latency runs from its *scheduled* time to its answer, so
  a stall also counts for the requests it delayed (no coordinated omission). Beside it, the
  load generator's own lateness over the same window: all 64 hosts share this process, so a
  heartbeat due while the generator is busy is sent late, and that counts in its latency too.

Meanwhile a proposer alternates ``deactivate [511]`` / ``activate [511]``, one a second; each is
a full barrier over 512 ranks, ACKed by the hosts, so view changes and heartbeats share the
host loop.

Baseline, measured in the same run: the log alone (``eventlog`` SQLite store, in this process),
64 concurrent producers appending batches of 8 records; the ratio says how much of the log's
raw group-commit rate survives HTTP, validation, the fold and the answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from pathlib import Path

from benchmarks._cluster import Coordinator, SimHost, form_group
from benchmarks.harness import Result, higher_is_better_ratio, median, percentile
from coordinator.cli import loop_factory
from eventlog import NewRecord, open_log

HOSTS, PER_HOST = 64, 8
TARGET_RATE = 10_000
#: One view change of the 512-rank group a second: far more churn than a real job sees, and
#: each one is a full barrier (64 long-poll wake-ups, 512 ACKs, a 512-rank view document).
PROPOSAL_INTERVAL_S = 1.0
CONFIG = {
    "heartbeat_timeout_s": 30.0,
    "ack_timeout_s": 30.0,
    "admission_timeout_s": 30.0,
    "reconcile_window_s": 0.0,
}


async def _proposer(
    coordinator: Coordinator, group: str, stop: asyncio.Event, done: list[float]
) -> None:
    conn = await coordinator.connect()
    try:
        i = 0
        while not stop.is_set():
            op = "deactivate" if i % 2 == 0 else "activate"
            t0 = time.perf_counter()
            status, body = await conn.request(
                "POST",
                "/proposals?wait=30",
                {"group": group, "op": op, "ranks": [HOSTS * PER_HOST - 1]},
            )
            if status == 200 and body["status"] == "applied":
                done.append((time.perf_counter() - t0) * 1000)
            i += 1
            await asyncio.sleep(PROPOSAL_INTERVAL_S)
    finally:
        await conn.close()


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all threads (Linux ``/proc``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _closed_loop(hosts: list[SimHost], seconds: float) -> int:
    """Acknowledged heartbeats in ``seconds`` with every host sending back to back."""
    deadline = time.perf_counter() + seconds
    counts = [0] * len(hosts)

    async def drive(i: int, host: SimHost) -> None:
        while time.perf_counter() < deadline:
            results = await host.heartbeat()
            counts[i] += sum(1 for r in results if "offset" in r)

    await asyncio.gather(*(drive(i, h) for i, h in enumerate(hosts)))
    return sum(counts)


async def _lateness(stop: asyncio.Event, out: list[float]) -> None:
    """How late this process's event loop wakes a 1 ms timer, sampled until ``stop`` (ms).

    The 64 simulated hosts share this process, so when a view change answers all their long
    polls at once the load generator itself falls behind; a heartbeat due meanwhile is sent
    late, and its latency (measured from when it was due) counts that delay too."""
    while not stop.is_set():
        t0 = time.perf_counter()
        await asyncio.sleep(0.001)
        out.append(max(0.0, (time.perf_counter() - t0) * 1000 - 1.0))


def _time_weighted(lateness: list[float], q: float) -> float:
    """The ``q``-th percentile of the generator's lateness over time rather than over samples."""
    ordered = sorted(lateness)
    total = sum(1.0 + x for x in ordered)
    seen = 0.0
    for x in ordered:
        seen += 1.0 + x
        if seen >= total * q / 100:
            return x
    return ordered[-1]


async def _open_loop(
    hosts: list[SimHost], rate: float, seconds: float, lateness: list[float]
) -> tuple[list[float], float]:
    """Latencies (ms, from the scheduled send time) at ``rate`` offered heartbeats per second,
    and the rate actually acknowledged (lower than offered when the coordinator falls behind);
    the load generator's own lateness meanwhile goes to ``lateness``."""
    interval = len(hosts) * PER_HOST / rate
    latencies: list[float] = []
    acked = [0]
    start = time.perf_counter() + 0.05
    stop = asyncio.Event()
    monitor = asyncio.get_running_loop().create_task(_lateness(stop, lateness))

    async def drive(i: int, host: SimHost) -> None:
        k = 0
        offset = interval * i / len(hosts)  # spread the hosts over the interval
        while True:
            scheduled = start + offset + k * interval
            if scheduled - start > seconds:
                return
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            results = await host.heartbeat()
            latencies.append((time.perf_counter() - scheduled) * 1000)
            acked[0] += sum(1 for r in results if "offset" in r)
            k += 1

    try:
        await asyncio.gather(*(drive(i, h) for i, h in enumerate(hosts)))
    finally:
        stop.set()
        await monitor
    return latencies, acked[0] / (time.perf_counter() - start)


async def _log_alone(seconds: float) -> float:
    """Records/s that 64 producers appending batches of 8 get from the SQLite log itself."""
    with tempfile.TemporaryDirectory() as tmp:
        log = await open_log(str(Path(tmp) / "log.db"))
        try:
            batch = [
                NewRecord(kind="heartbeat", group="g", rank=r, payload={"incarnation": "x"})
                for r in range(PER_HOST)
            ]
            deadline = time.perf_counter() + seconds
            count = [0]

            async def produce() -> None:
                while time.perf_counter() < deadline:
                    # await first: ``count[0] += len(await ...)`` reads the count before the
                    # await and so loses every other producer's appends made meanwhile
                    offsets = await log.append(batch)
                    count[0] += len(offsets)

            t0 = time.perf_counter()
            await asyncio.gather(*(produce() for _ in range(HOSTS)))
            return count[0] / (time.perf_counter() - t0)
        finally:
            await log.close()


async def _run_async(quick: bool) -> list[Result]:
    window = 4.0 if quick else 10.0
    trials = 2 if quick else 3
    coordinator = Coordinator().start()
    rates: list[float] = []
    cpu_per_event: list[float] = []
    latencies: list[float] = []
    lateness: list[float] = []
    offered_acked: list[float] = []
    proposals: list[float] = []
    try:
        hosts = await form_group(
            coordinator, "ingest", HOSTS * PER_HOST, per_host=PER_HOST, **CONFIG
        )
        stop = asyncio.Event()
        proposer = asyncio.get_running_loop().create_task(
            _proposer(coordinator, "ingest", stop, proposals)
        )
        try:
            await _closed_loop(hosts, 1.0)  # warm up
            pid = coordinator.process.pid
            for _ in range(trials):
                cpu0 = _cpu_seconds(pid)
                acked = await _closed_loop(hosts, window)
                cpu_per_event.append((_cpu_seconds(pid) - cpu0) / acked * 1e6)
                rates.append(acked / window)
                lat, acked_rate = await _open_loop(hosts, TARGET_RATE, window, lateness)
                latencies.extend(lat)
                offered_acked.append(acked_rate)
        finally:
            stop.set()
            with contextlib.suppress(Exception):
                await proposer
            await asyncio.gather(*(h.stop() for h in hosts))
    finally:
        coordinator.stop()
    baseline = [await _log_alone(window / 2) for _ in range(trials)]
    ours = median(rates)
    return [
        Result(
            bench="ingest",
            metric="durable heartbeats/s, 64 hosts x 8 ranks, saturation",
            unit="events/s",
            median=ours,
            baseline="eventlog SQLite append alone, 64 producers x 8",
            baseline_median=median(baseline),
            ratio=higher_is_better_ratio(ours, median(baseline)),
            target=">= 10,000",
            extra={"trials": rates, "window_s": window},
        ),
        Result(
            bench="ingest",
            metric="coordinator CPU per durable heartbeat (all threads)",
            unit="us",
            median=median(cpu_per_event),
            extra={
                "heartbeats_per_cpu_second": 1e6 / median(cpu_per_event),
                "why": "the machine is shared: the rate above depends on how much CPU other jobs "
                "leave; this says what the coordinator spends per heartbeat (contention raises "
                "it too, but less than it lowers the rate)",
            },
        ),
        Result(
            bench="ingest",
            metric=f"heartbeat request latency at {TARGET_RATE:,}/s offered",
            unit="ms",
            median=median(latencies),
            p99=percentile(latencies, 99),
            target="p99 <= 50 ms",
            extra={"requests": len(latencies), "acked_per_s": offered_acked},
        ),
        Result(
            bench="ingest",
            metric="load generator's own lateness meanwhile (1 ms timer, all 64 hosts' loop)",
            unit="ms",
            median=_time_weighted(lateness, 50),
            p99=_time_weighted(lateness, 99),
            extra={
                "max": max(lateness),
                "weighting": "each sample counts for the time it covers (1 ms + its lateness), "
                "so a long stall weighs as much as the heartbeats it delays",
                "why": "part of every latency above: a heartbeat due while the generator is "
                "late is sent late",
            },
        ),
        Result(
            bench="ingest",
            metric="view change (512 ranks) during ingest",
            unit="ms",
            median=median(proposals) if proposals else float("nan"),
            p99=percentile(proposals, 99) if proposals else None,
            extra={"view_changes": len(proposals)},
        ),
    ]


def run(quick: bool) -> list[Result]:
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(_run_async(quick))
