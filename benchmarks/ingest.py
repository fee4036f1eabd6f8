"""Ingest: 64 simulated hosts x 8 ranks heartbeating while proposals run.

One group of 512 ranks on a real coordinator with a SQLite log (WAL, ``synchronous=FULL``). The
agents are simulated hosts (``agent.simhost``): the real ``AgentMachine`` for every rank, each host
on its channel (``GET /agents/channel``), its beats batched into one message on their own lane and
its other events on another. Every heartbeat is durable before it is answered. What a rank waits for
an event runs from the moment its machine hands the event to its host's lane to the answer
(``benchmarks.kit.simulated.TimedHost``).

For the latency measurement the simulator (this process: the 64 hosts, the proposer, the
lateness probe) and the coordinator (a process of its own) run on cores of their own where the
machine has two or more: each is pinned to half of the cores this process may use
(``benchmarks.kit.simulated.split_cores``; the split is in the non-heartbeat row's ``extra.cores``),
so neither takes the other's core in a view change's burst, though other jobs of the machine
still may. The saturation measurement leaves both unpinned: there the coordinator's loop and its
log's writer thread are both busy, and may use whichever core is free. The simulator's long-lived objects (the 512 agent machines)
are frozen out of its garbage collector once the group has formed, and it runs with the
server's GC thresholds, as ``benchmarks.scale`` does: in a real job each agent is a process of
its own, whose collector never walks the other agents, and a full collection of all 512 here
would stall the generator (and every ACK of the barrier it falls in) for tens of milliseconds.

- **saturation**: the coordinator runs with ``--heartbeat-flush-s 0`` (every batch of beats is
  appended at once, a record per batch), and every machine's beat falls due again every 20 ms,
  so each rank sends its next beat as soon as the last one is answered (a machine keeps one beat
  in flight); the figure is acknowledged heartbeats per second over the window. All 512 machines
  run in this one process, so the generator bounds it too.
- **latency at the target rate**: the coordinator runs with the default flush interval (beats
  share a record for up to 0.5 s), and every machine's beat falls due so that 10,000 beats/s
  are offered. A heartbeat's wait is made of: the wait behind the host's beat batch in
  flight; the message; the wait for its shared record, which the coordinator appends
  ``heartbeat_flush_s`` after the first beat of the group that it holds arrived (a tick appends
  it sooner); the record's durable append; the answer. A machine keeps one beat in flight and
  the newest beat due replaces the one waiting, so a rank's beats are as frequent as its
  answers allow, and the rate acknowledged is reported beside the offered one. The other
  events (mostly the ACKs of the view changes below) wait for none of this: they have a lane
  of their own, share an append with beats only when a shared record falls due in it, and are
  answered ahead of the beats of their append; their wait is the second latency row, per kind
  in its extra. It runs from the machine's hand-over to the simulator reading the answer, so
  it includes the simulator's own work: the answer is read when the generator gets to it,
  after the other hosts' pushes and answers that arrived with it. Beside them, the load
  generator's own lateness over the same window: all 64 hosts share this process, so an event
  due while the generator is busy is handed over late, and its answer is read late.

Meanwhile a proposer alternates ``deactivate [511]`` / ``activate [511]``, one a second; each is
a full barrier over 512 ranks, ACKed by their machines, so view changes and heartbeats share the
host loop.

Baseline, measured in the same run: the log alone (``eventlog`` SQLite store, in this process),
64 concurrent producers appending batches of 8 records; the ratio says how much of the log's
raw group-commit rate survives HTTP, validation, the fold and the answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import tempfile
import time
from pathlib import Path

from ..eventlog import NewRecord, open_log
from .harness import Result, higher_is_better_ratio, median, percentile
from .kit.service import Service
from .kit.simulated import (
    TimedCluster,
    form_group,
    pin,
    run_with_server_gc,
    split_cores,
)

HOSTS, PER_HOST = 64, 8
RANKS = HOSTS * PER_HOST
TARGET_RATE = 10_000
#: ``serve``'s default: how long beats wait to share a record in the latency measurement.
FLUSH_S = 0.5
#: How often each machine's beat falls due in the saturation measurement (closed loop).
SATURATION_INTERVAL_S = 0.02
#: One view change of the 512-rank group a second: far more churn than a real job sees, and
#: each one is a full barrier (64 hosts' pushes, twice, 512 ACKs).
PROPOSAL_INTERVAL_S = 1.0
CONFIG = {
    "heartbeat_timeout_s": 30.0,
    "ack_timeout_s": 30.0,
    "admission_timeout_s": 30.0,
    "reconcile_window_s": 0.0,
}
HEARTBEAT = "heartbeat"


async def _proposer(
    coordinator: Service, group: str, stop: asyncio.Event, done: list[float]
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
                {"group": group, "op": op, "ranks": [RANKS - 1]},
            )
            if status == 200 and body["status"] == "applied":
                done.append((time.perf_counter() - t0) * 1000)
            i += 1
            await asyncio.sleep(PROPOSAL_INTERVAL_S)
    finally:
        await conn.close()


async def _lateness(stop: asyncio.Event, out: list[float]) -> None:
    """How late this process's event loop wakes a 1 ms timer, sampled until ``stop`` (ms).

    The 64 simulated hosts share this process, so when a view change answers all their long
    polls at once the load generator itself falls behind; an event due meanwhile is handed over
    late, and its answer comes later too."""
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


async def _measure(
    flush_s: float,
    interval_s: float,
    window: float,
    trials: int,
    lateness: list[float] | None,
    *,
    pinned: bool,
) -> tuple[list[dict], list[float]]:
    """Form the group on a fresh coordinator, then per trial: the waits recorded over
    ``window`` (by kind), the heartbeats acknowledged per second and the coordinator's CPU per
    heartbeat. Also every applied proposal's latency (ms). ``pinned``: the simulator and the
    coordinator on cores of their own (see the module docstring)."""
    coordinator = Service("--heartbeat-flush-s", str(flush_s), name="ingest").start()
    proposals: list[float] = []
    windows: list[dict] = []
    own_cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    try:
        if pinned and (cores := split_cores()) is not None:
            pin(0, cores[0])
            pin(coordinator.pid, cores[1])
        cluster: TimedCluster = await form_group(
            coordinator,
            "ingest",
            RANKS,
            per_host=PER_HOST,
            heartbeat_interval_s=interval_s,
            **CONFIG,
        )
        gc.collect()
        gc.freeze()  # the agent machines: see the module docstring
        stop = asyncio.Event()
        proposer = asyncio.get_running_loop().create_task(
            _proposer(coordinator, "ingest", stop, proposals)
        )
        try:
            await asyncio.sleep(1.0)  # warm up
            for _ in range(trials):
                cluster.take_waits()
                cpu0 = coordinator.cpu_s()
                done = asyncio.Event()
                monitor = (
                    asyncio.get_running_loop().create_task(_lateness(done, lateness))
                    if lateness is not None
                    else None
                )
                cluster.record(True)
                t0 = time.perf_counter()
                await asyncio.sleep(window)
                cluster.record(False)
                elapsed = time.perf_counter() - t0
                cpu = coordinator.cpu_s() - cpu0
                done.set()
                if monitor is not None:
                    await monitor
                waits = cluster.take_waits()
                beats = len(waits.get(HEARTBEAT, ()))
                windows.append(
                    {"rate": beats / elapsed, "cpu_us": cpu / max(beats, 1) * 1e6, "waits": waits}
                )
        finally:
            stop.set()
            with contextlib.suppress(Exception):
                await proposer
            await cluster.stop()
        if cluster.stopped:
            raise RuntimeError(f"agents stopped during the run: {cluster.stopped}")
    finally:
        gc.unfreeze()
        coordinator.close()
        if own_cores is not None:
            pin(0, own_cores)
    return windows, proposals


async def _run_async(quick: bool) -> list[Result]:
    window = 4.0 if quick else 10.0
    trials = 2 if quick else 3
    generator: list[float] = []
    saturated, proposals_saturated = await _measure(
        0.0, SATURATION_INTERVAL_S, window, trials, generator, pinned=False
    )
    lateness: list[float] = []
    offered, proposals = await _measure(
        FLUSH_S, RANKS / TARGET_RATE, window, trials, lateness, pinned=True
    )
    baseline = [await _log_alone(window / 2) for _ in range(trials)]
    return [
        *_saturation_rows(saturated, baseline, generator, window),
        *_offered_rows(offered, lateness, proposals, proposals_saturated),
    ]


def _saturation_rows(
    saturated: list[dict], baseline: list[float], generator: list[float], window: float
) -> list[Result]:
    """The rate the coordinator makes heartbeats durable at when beats are always due, and
    its CPU per heartbeat."""
    rates = [w["rate"] for w in saturated]
    cpu_per_event = [w["cpu_us"] for w in saturated]
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
            extra={
                "trials": rates,
                "window_s": window,
                "heartbeat_flush_s": 0.0,
                "beat_due_every_s": SATURATION_INTERVAL_S,
                "generator_lateness_ms": {
                    "median": _time_weighted(generator, 50),
                    "p99": _time_weighted(generator, 99),
                },
                "why": "512 real agent machines in this process beside the coordinator: when "
                "the generator is late most of the time, it, not the coordinator, bounds the "
                "rate (the CPU row says what the coordinator spends)",
            },
        ),
        Result(
            bench="ingest",
            metric="coordinator CPU per durable heartbeat (all threads)",
            unit="us",
            median=median(cpu_per_event),
            extra={
                "heartbeats_per_cpu_second": 1e6 / median(cpu_per_event),
                "heartbeat_flush_s": 0.0,
                "why": "the machine is shared: the rate above depends on how much CPU other jobs "
                "leave; this says what the coordinator spends per heartbeat (contention raises "
                "it too, but less than it lowers the rate)",
            },
        ),
    ]


def _offered_rows(
    offered: list[dict],
    lateness: list[float],
    proposals: list[float],
    proposals_saturated: list[float],
) -> list[Result]:
    """What the heartbeats, the other events and a view change wait at the offered rate."""
    beats = [ms for w in offered for ms in w["waits"].get(HEARTBEAT, ())]
    others: dict[str, list[float]] = {}
    for w in offered:
        for kind, waits in w["waits"].items():
            if kind != HEARTBEAT:
                others.setdefault(kind, []).extend(waits)
    events = [ms for waits in others.values() for ms in waits]
    cores = _cores()
    return [
        Result(
            bench="ingest",
            metric=f"heartbeat request latency at {TARGET_RATE:,}/s offered",
            unit="ms",
            median=median(beats) if beats else float("nan"),
            p99=percentile(beats, 99),
            target=f"p99 <= {FLUSH_S * 1000:.0f} ms flush + 50 ms",
            extra={
                "heartbeats": len(beats),
                "acked_per_s": [w["rate"] for w in offered],
                "heartbeat_flush_s": FLUSH_S,
                "made_of": "wait behind the host's beat batch in flight + its message + wait "
                "for the shared record (up to heartbeat_flush_s) + durable append + answer",
            },
        ),
        Result(
            bench="ingest",
            metric=f"non-heartbeat event ack latency at {TARGET_RATE:,}/s offered heartbeats",
            unit="ms",
            median=median(events) if events else float("nan"),
            p99=percentile(events, 99),
            target="p99 <= 50 ms",
            extra={
                "by_kind": {
                    kind: {
                        "events": len(waits),
                        "median": median(waits),
                        "p99": percentile(waits, 99),
                    }
                    for kind, waits in sorted(others.items())
                },
                "cores": cores,
                "why": "joins, links, ACKs and exits travel in their own lane, never wait for "
                "a shared heartbeat record and are answered ahead of the beats of their append; "
                "the wait includes the simulator reading the answer (its lateness row)",
            },
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
                "why": "part of every latency above: an event due while the generator is "
                "late is handed over late",
            },
        ),
        Result(
            bench="ingest",
            metric="view change (512 ranks) during ingest",
            unit="ms",
            median=median(proposals) if proposals else float("nan"),
            p99=percentile(proposals, 99) if proposals else None,
            extra={
                "view_changes": len(proposals),
                "heartbeat_flush_s": FLUSH_S,
                "during_saturation_median": median(proposals_saturated)
                if proposals_saturated
                else None,
            },
        ),
    ]


def _cores() -> dict[str, list[int]] | str:
    """Where the simulator and the coordinator run, for the rows' ``extra``."""
    cores = split_cores()
    if cores is None:
        return "one core: the simulator and the coordinator share it"
    return {"simulator": sorted(cores[0]), "coordinator": sorted(cores[1])}


def run(quick: bool) -> list[Result]:
    return run_with_server_gc(lambda: _run_async(quick))
