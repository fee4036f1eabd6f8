"""The fold: throughput on a realistic mix, and replay of a SQLite log end to end.

The mix comes from a simulated cluster driven by the fold's own effects, as a host would see it:
4 groups of 256 ranks heartbeat once a second; every 30 s (per group) a rank dies, four peers
report it in ``failed_ranks_hint``, half the time a launcher reports the death, the survivors
ACK the auto-deactivation, a replacement joins, reports ready, and eight ranks propose the same
``activate``; the host appends a ``tick`` whenever ``next_deadline()`` has passed. About 93% of
the records are heartbeats.

Metrics:
- fold throughput (records/s on one core; target >= 300,000), stepping pre-built records;
- one group of 8,192 ranks: forming it, a heartbeat step, ``next_deadline()``, and a death
  report up to its ``view_prepare`` (the costs that must not grow with the group);
- replay of a log of 1,000,000 such records (200,000 with ``--quick``) from a SQLite file:
  read, verify, decode and fold (target <= 5 s for 1M), against reading and decoding alone
  (the baseline, measured in the same run, shows what the fold adds).
"""

from __future__ import annotations

import asyncio
import heapq
import random
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec

from ..coordinator.fold.effects import RankState, ViewPrepare
from ..coordinator.fold.machine import Coordinator
from ..eventlog import READ_PAGE, open_log
from ..eventlog.record import NewRecord, Record
from .harness import Result, lower_is_better_ratio, median

S = 1_000_000_000
T0 = 1_764_000_000 * S


class SimulatedCluster:
    """Agents, a launcher and an operator-less recovery loop, reacting to the fold's effects."""

    def __init__(
        self, groups: int = 4, world: int = 256, fail_every_s: float = 30.0, seed: int = 7
    ):
        self.rnd = random.Random(seed)
        self.m = Coordinator()
        self.records: list[Record] = []
        self.world = world
        self.groups = [f"job{i}" for i in range(groups)]
        self.inc: dict[tuple[str, int], str] = {}
        self.alive: set[tuple[str, int]] = set()
        self.epoch = 0
        self.queue: list[tuple[int, int, str, str | None, int | None, dict[str, Any]]] = []
        self.seq = 0
        self.fail_every = round(fail_every_s * S)

    def at(self, t: int, kind: str, group: str | None, rank: int | None, **payload: Any) -> None:
        self.seq += 1
        heapq.heappush(self.queue, (t, self.seq, kind, group, rank, payload))

    def start_process(self, t: int, group: str, rank: int) -> None:
        self.epoch += 1
        self.inc[(group, rank)] = f"{group}-{rank}-{self.epoch:08x}"
        self.alive.add((group, rank))
        self.at(t, "join", group, rank)
        self.at(t + S // 2, "ready", group, rank)
        self.at(t + self.rnd.randrange(S), "beat", group, rank)

    def run(self, n_records: int) -> list[Record]:
        for g in self.groups:
            self.append(T0, "group_created", g, None, {"world_size": self.world, "config": {}})
            for r in range(self.world):
                self.start_process(T0 + self.rnd.randrange(S), g, r)
            self.at(T0 + 20 * S + self.rnd.randrange(self.fail_every), "fail", g, None)
        while len(self.records) < n_records:
            t, _, kind, group, rank, extra = heapq.heappop(self.queue)
            self.act(t, kind, group, rank, extra)
        return self.records[:n_records]

    def act(self, t: int, kind: str, g: Any, r: Any, extra: dict[str, Any]) -> None:
        key = (g, r)
        if kind == "fail":
            self.at(t + self.fail_every, "fail", g, None)
            view = self.m.current_view(g)
            victims = [x for x in view.active_ranks if (g, x)] if view else []
            if not victims:
                return
            r = self.rnd.choice(victims)
            self.alive.discard((g, r))
            if self.rnd.random() < 0.5:
                self.at(t + 2 * S, "death", g, r, incarnation=self.inc[(g, r)])
            for peer in self.rnd.sample(range(self.world), 4):
                if peer != r:
                    self.at(t + S // 20, "hint", g, peer, about=r)
            self.at(t + 12 * S, "replace", g, r)
            return
        if kind == "replace":
            self.start_process(t, g, r)
            for proposer in self.rnd.sample(range(self.world), 8):
                self.at(t + 2 * S, "propose", g, proposer, about=r)
            return
        if kind == "propose":
            payload = {"op": "activate", "ranks": [extra["about"]], "proposer": f"rank:{r}"}
            self.append(t, "proposal", g, None, payload)
            return
        if key not in self.alive:
            return  # a dead process does nothing
        inc = self.inc[key]
        if kind == "beat":
            self.append(t, "heartbeat", g, r, {"incarnation": inc})
            self.at(t + S + self.rnd.randrange(-S // 10, S // 10), "beat", g, r)
        elif kind == "join":
            self.append(t, "join", g, r, {"incarnation": inc, "host": f"node{r // 8}", "pid": r})
        elif kind == "ready":
            self.append(t, "links", g, r, {"incarnation": inc, "peers": {}, "self_ready": True})
        elif kind == "hint":
            about = extra["about"]
            self.append(
                t,
                "links",
                g,
                r,
                {
                    "incarnation": inc,
                    "peers": {str(about): "down"},
                    "self_ready": True,
                    "failed_ranks_hint": [about],
                },
            )
        elif kind == "ack":
            self.append(t, "ack", g, r, {"incarnation": inc, "version": extra["version"]})
        elif kind == "death":
            self.append(t, "death_reported", g, r, {"incarnation": extra["incarnation"]})

    def append(self, t: int, kind: str, group: Any, rank: Any, payload: dict[str, Any]) -> None:
        """The host: tick every deadline that passed first, then append and step the input."""
        while (due := self.m.next_deadline()) is not None and due <= t:
            self._step(due, "tick", None, None, {})
        self._step(t, kind, group, rank, payload)

    def _step(self, t: int, kind: str, group: Any, rank: Any, payload: dict[str, Any]) -> None:
        rec = Record(
            offset=len(self.records) + 1,
            ts=t,
            term=1,
            kind=kind,
            group=group,
            rank=rank,
            payload=payload,
            checksum=0,
        )
        self.records.append(rec)
        for e in self.m.step(rec):
            if isinstance(e, ViewPrepare):
                for p in e.participants:
                    self.at(
                        t + S // 500 + self.rnd.randrange(S // 100),
                        "ack",
                        e.group,
                        p,
                        version=e.version,
                    )
            elif (
                isinstance(e, RankState)
                and e.state == "OFFLINE"
                and (e.group, e.rank) in self.alive
            ):
                self.alive.discard((e.group, e.rank))  # fenced out: the agent would restart
                self.at(t + S, "replace", e.group, e.rank)


def fold_all(records: list[Record]) -> tuple[float, Coordinator]:
    """Step every record through a fresh fold; return the CPU seconds it took (CPU time, not
    wall time, because the machine is shared: waiting for a core is not the fold's cost)."""
    m = Coordinator()
    step = m.step
    t0 = time.process_time()
    for rec in records:
        step(rec)
    return time.process_time() - t0, m


async def _build_log(path: Path, records: list[Record]) -> None:
    log = await open_log(path)
    try:
        for i in range(0, len(records), 5000):
            await log.append(
                [
                    NewRecord(kind=r.kind, group=r.group, rank=r.rank, payload=r.payload, ts=r.ts)
                    for r in records[i : i + 5000]
                ]
            )
    finally:
        await log.close()


async def _replay(path: Path, fold: bool) -> tuple[float, float, Coordinator | None, int]:
    """Wall seconds and CPU seconds (all threads) to replay the log, the fold, the count."""
    t0 = time.perf_counter()
    c0 = time.process_time()
    log = await open_log(path, create=False)
    m = Coordinator() if fold else None
    count = 0
    after = 0
    try:
        while True:
            page = await log.read(after, READ_PAGE)
            if not page:
                break
            if m is not None:
                step = m.step
                for rec in page:
                    step(rec)
            after = page[-1].offset
            count += len(page)
    finally:
        await log.close()
    return time.perf_counter() - t0, time.process_time() - c0, m, count


def run(quick: bool) -> list[Result]:
    n_mix = 200_000 if quick else 500_000
    trials = 3 if quick else 5
    records = SimulatedCluster().run(n_mix)
    mix = Counter(r.kind for r in records)
    times = []
    for _ in range(trials):
        elapsed, m = fold_all(records)
        times.append(elapsed)
    rates = [len(records) / t for t in times]
    results = [
        Result(
            bench="fold",
            metric="fold throughput, realistic mix",
            unit="records/s (CPU)",
            median=median(rates),
            target=">= 300,000",
            extra={
                "records": len(records),
                "trials": trials,
                "heartbeat_share": round(mix["heartbeat"] / len(records), 3),
                "mix": dict(sorted(mix.items())),
                "views_committed": sum(m.current_view(g).version for g in m.groups()),
            },
        )
    ]
    results += _large_group(quick)
    results += _replay_results(quick)
    return results


class _Feeder:
    """Steps hand-made records into a fold (offsets and incarnations kept here)."""

    def __init__(self) -> None:
        self.m = Coordinator()
        self.offset = 0

    def step(self, t: int, kind: str, group: Any, rank: Any, payload: dict[str, Any]) -> list[Any]:
        self.offset += 1
        rec = Record(
            offset=self.offset,
            ts=t,
            term=1,
            kind=kind,
            group=group,
            rank=rank,
            payload=payload,
            checksum=0,
        )
        return self.m.step(rec)


def _large_group(quick: bool) -> list[Result]:
    n = 8192
    f = _Feeder()
    t0 = time.process_time()
    f.step(T0, "group_created", "big", None, {"world_size": n, "config": {}})
    for r in range(n):
        f.step(T0, "join", "big", r, {"incarnation": f"i{r}"})
    for r in range(n):
        f.step(T0, "links", "big", r, {"incarnation": f"i{r}", "peers": {}, "self_ready": True})
    for r in range(n):
        f.step(T0, "ack", "big", r, {"incarnation": f"i{r}", "version": 1})
    formed_s = time.process_time() - t0
    assert f.m.current_view("big").version == 1
    beats = [
        Record(
            offset=0,
            ts=0,
            term=1,
            kind="heartbeat",
            group="big",
            rank=r,
            payload={"incarnation": f"i{r}"},
            checksum=0,
        )
        for r in range(n)
    ]
    beat_us, deadline_us, failure_ms = [], [], []
    rounds = 3 if quick else 10
    for i in range(rounds):
        t = T0 + (i + 1) * S
        recs = [
            msgspec.structs.replace(b, offset=f.offset + k + 1, ts=t) for k, b in enumerate(beats)
        ]
        f.offset += n
        t0 = time.process_time()
        for rec in recs:
            f.m.step(rec)
        beat_us.append((time.process_time() - t0) / n * 1e6)
        t0 = time.process_time()
        for _ in range(1000):
            f.m.next_deadline()
        deadline_us.append((time.process_time() - t0) / 1000 * 1e6)
        victim = 1 + i
        t0 = time.process_time()
        effects = f.step(t, "death_reported", "big", victim, {"reporter": "bench"})
        failure_ms.append((time.process_time() - t0) * 1e3)
        prepare = next(e for e in effects if isinstance(e, ViewPrepare))
        for p in prepare.participants:
            f.step(t, "ack", "big", p, {"incarnation": f"i{p}", "version": prepare.version})
    return [
        Result(
            bench="fold",
            metric=f"{n}-rank group: form it (joins, ready reports, ACKs)",
            unit="s (CPU)",
            median=formed_s,
        ),
        Result(
            bench="fold",
            metric=f"{n}-rank group: one heartbeat step",
            unit="us (CPU)",
            median=median(beat_us),
            extra={"rounds": rounds},
        ),
        Result(
            bench="fold",
            metric=f"{n}-rank group: next_deadline()",
            unit="us (CPU)",
            median=median(deadline_us),
            extra={"rounds": rounds},
        ),
        Result(
            bench="fold",
            metric=f"{n}-rank group: death report to view_prepare",
            unit="ms (CPU)",
            median=median(failure_ms),
            extra={"rounds": rounds},
        ),
    ]


def _replay_results(quick: bool) -> list[Result]:
    n = 200_000 if quick else 1_000_000
    trials = 1 if quick else 3
    records = SimulatedCluster(seed=11).run(n)
    _, expected = fold_all(records)
    with tempfile.TemporaryDirectory(prefix="foldplane-bench-") as tmp:
        path = Path(tmp) / "replay.db"
        t0 = time.perf_counter()
        asyncio.run(_build_log(path, records))
        build_s = time.perf_counter() - t0
        asyncio.run(_replay(path, fold=False))  # warm the page cache: time the work, not the disk
        full, read_only, full_cpu, read_cpu = [], [], [], []
        for _ in range(trials):
            elapsed, cpu, _, count = asyncio.run(_replay(path, fold=False))
            assert count == n
            read_only.append(elapsed)
            read_cpu.append(cpu)
            elapsed, cpu, m, count = asyncio.run(_replay(path, fold=True))
            assert count == n and m is not None
            assert msgspec.json.encode(m.snapshot()) == msgspec.json.encode(expected.snapshot())
            full.append(elapsed)
            full_cpu.append(cpu)
    ours, base = median(full), median(read_only)
    return [
        Result(
            bench="fold",
            metric=f"replay of a {n:,}-record SQLite log (read, verify, decode, fold)",
            unit="s",
            median=ours,
            baseline="read, verify and decode only",
            baseline_median=base,
            ratio=lower_is_better_ratio(ours, base),
            target="<= 5 s for 1,000,000 records",
            extra={
                "records": n,
                "trials": trials,
                "records_per_s": round(n / ours),
                "fold_share_s": round(ours - base, 2),
                "cpu_s": round(median(full_cpu), 2),
                "baseline_cpu_s": round(median(read_cpu), 2),
                "log_build_s": round(build_s, 1),
            },
        )
    ]
