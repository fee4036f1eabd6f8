"""The read model (``coordinator/host/reads.py``): published once per cycle, copy-on-write per
group, never the live fold.

- Every read of a published model equals the same read of a model captured afresh from the
  fold at that offset, over the logs of simulator seeds folded in batches of every size (the
  per-group reuse is exactly what a full capture gives), and a published model keeps its
  answers while later cycles are folded.
- A group no record of a cycle named is shared, rendered answers included; a cycle of
  heartbeats alone recaptures only the last beats.
- Each facet's read model (``Facet.read_model``) is published with the rest: never its fold
  object, and read by read equal to one built from scratch, over the simulator's logs (epochs)
  and the logs of every scenario of the facets' fold tests (refits, rendezvous, lighthouse).
- On a real host over a SQLite log, a read while a cycle is carried out (its projection rows
  being written) sees the previous cycle's model, and the next cycle's once it is done.
- A carry-out that fails otherwise than the log (a bug) stops the host (``carry_out_failed``):
  nothing is admitted against a read model that lags the fold.
"""

from __future__ import annotations

import asyncio
import inspect
import random
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec
import pytest

from foldplane.coordinator.fold.machine import Coordinator
from foldplane.coordinator.host.inputs import HostUnavailable
from foldplane.coordinator.host.loop import Appended, Host
from foldplane.coordinator.host.reads import Reads, ReadsPublisher
from foldplane.eventlog.record import NewRecord, Record
from foldplane.sim.world import World
from foldplane.wire.codes import CARRY_OUT_FAILED

S = 1_000_000_000
T0 = 1_764_000_000 * S


def _answers(reads: Reads) -> bytes:
    """Every read the API makes, for every group and proposal, as one document."""
    out: list[object] = [reads.offset, reads.groups(), reads.group_list()]
    for group in reads.groups():
        out += [
            reads.group_deleted(group),
            reads.group_config(group),
            reads.current_view(group),
            reads.group_status(group),
            reads.group_overview(group),
        ]
    for pid in range(1, 64):
        out.append(reads.proposal(pid))
    for uuid in range(1, 8):
        out.append(reads.proposal_by_uuid("g", uuid))
    return msgspec.json.encode([out, _facet_answers(reads)])


def _facet_answers(reads: Reads) -> list[Any]:
    """Every read the facets' routes make of their read models."""
    epochs = reads.facet("epochs")
    out: list[Any] = []
    for group in [*reads.groups(), "nowhere"]:
        out += [epochs.planned(group), epochs.changes(group), epochs.status(group)]
    refits = reads.facet("refits")
    out.append(refits.names())
    for name in [*refits.names(), "nowhere"]:
        out += [refits.exists(name), refits.status(name)]
    rdzv = reads.facet("rendezvous")
    out += [rdzv.names(), rdzv.lines()]
    for job in [*rdzv.names(), "nowhere"]:
        out.append(rdzv.status(job))
    lh = reads.facet("lighthouse")
    out.append(
        [
            lh.settings,
            lh.quorum_id,
            lh.status,
            lh.verdicts,
            lh.last,
            [(r.replica_id, r.step, r.offset, r.joined_ts) for r in lh.requests],
            lh.heartbeats,
            lh.lost,
        ]
    )
    return out


def _published_equals_fresh(log: list[Record], rng: random.Random, what: str) -> None:
    """Fold ``log`` in batches of random sizes, publishing after each: every published model
    reads as one built from scratch, and keeps its answers while later cycles are folded."""
    machine = Coordinator()
    publisher = ReadsPublisher(machine)
    kept: list[tuple[Reads, bytes]] = []
    at = 0
    while at < len(log):
        batch = log[at : at + rng.choice((1, 1, 2, 3, 8, 40))]
        at += len(batch)
        for rec in batch:
            machine.step(rec)
        published = publisher.publish()
        fresh = ReadsPublisher(machine).current
        assert _answers(published) == _answers(fresh), f"{what} at offset {machine.offset}"
        for facet in machine.facets:
            assert published.facet(facet.name) is not facet, f"{facet.name}: the live fold"
        kept.append((published, _answers(published)))
    for reads, answers in kept[:: max(1, len(kept) // 20)]:
        assert _answers(reads) == answers, f"{what}: the model of offset {reads.offset} changed"


@pytest.mark.parametrize("seed", [3, 11, 17, 29])
def test_a_published_model_reads_as_a_fresh_capture_and_keeps_its_answers(seed: int) -> None:
    log = World(seed, 600).run().log
    assert log, "the seed appended nothing"
    _published_equals_fresh(log, random.Random(seed), f"seed {seed}")


def _scenario_logs(module: ModuleType) -> Iterator[tuple[str, list[Record]]]:
    """The records each test of ``module`` (one without arguments) stepped into a fold that
    began empty, one log per fold."""
    stepped: dict[int, list[Record]] = {}
    fresh: set[int] = set()
    machines: list[Coordinator] = []  # alive, so that no two share an id
    step = Coordinator.step

    def noting(machine: Coordinator, record: Record) -> Any:
        key = id(machine)
        if key not in stepped:
            machines.append(machine)
            stepped[key] = []
            if machine.offset == 0:
                fresh.add(key)
        effects = step(machine, record)  # a record the fold refused to step is not logged
        stepped[key].append(record)
        return effects

    for name, test in inspect.getmembers(module, inspect.isfunction):
        if not name.startswith("test_") or inspect.signature(test).parameters:
            continue
        stepped.clear()
        fresh.clear()
        machines.clear()
        Coordinator.step = noting  # type: ignore[method-assign]
        try:
            test()
        finally:
            Coordinator.step = step  # type: ignore[method-assign]
        for key, log in stepped.items():
            if key in fresh:
                yield name, log


@pytest.mark.parametrize("facet", ["refits", "rendezvous", "lighthouse"])
def test_a_facet_publishes_a_read_model_that_reads_as_one_built_afresh(facet: str) -> None:
    import importlib

    module = importlib.import_module(f"tests.fold.test_{facet}")
    logs = list(_scenario_logs(module))
    kinds = {r.kind for _, log in logs for r in log}
    assert kinds & Coordinator().facet(facet).kinds, f"no scenario of {facet} stepped its records"
    for i, (name, log) in enumerate(logs):
        _published_equals_fresh(log, random.Random(i), f"{module.__name__}::{name}")


class _Feed:
    def __init__(self) -> None:
        self.machine = Coordinator()
        self.publisher = ReadsPublisher(self.machine)
        self.offset = 0

    def cycle(self, *records: tuple[str, str | None, int | None, dict]) -> Reads:
        for kind, group, rank, payload in records:
            self.offset += 1
            rec = Record(self.offset, T0 + self.offset, 1, kind, group, rank, payload, 0)
            self.machine.step(rec)
        return self.publisher.publish()


def _formed(feed: _Feed, group: str, n: int) -> None:
    feed.cycle(("group_created", group, None, {"world_size": n, "config": {}}))
    feed.cycle(*[("join", group, r, {"incarnation": f"i{r}"}) for r in range(n)])
    feed.cycle(
        *[
            ("links", group, r, {"incarnation": f"i{r}", "peers": {}, "self_ready": True})
            for r in range(n)
        ]
    )
    feed.cycle(*[("ack", group, r, {"incarnation": f"i{r}", "version": 1}) for r in range(n)])


def test_an_unchanged_group_is_shared_and_beats_alone_recapture_only_the_last_beats() -> None:
    """What a cycle did not change is shared with the model before, rendered answers and all;
    what it changed is captured again (``capture.FoldChanges``)."""
    feed = _Feed()
    _formed(feed, "a", 4)
    _formed(feed, "b", 4)
    before = feed.publisher.current
    a_status, b_status, b_line = (
        before.group_status("a"),
        before.group_status("b"),
        before.group_list()[1],
    )
    assert before.current_view("a") is not None and before.current_view("a").version == 1
    after = feed.cycle(("heartbeat", "a", 2, {"incarnation": "i2"}))
    assert after.offset == before.offset + 1
    # b: no record named it, so its model is the one before, rendered answers and all
    assert after.group_status("b") is b_status and after.group_list()[1] is b_line
    # a: its beats moved, nothing else did
    got = after.group_status("a")
    assert got is not a_status
    assert got["ranks"][2]["last_heartbeat_ts"] == T0 + after.offset
    assert {**got, "ranks": None} == {**a_status, "ranks": None}
    # the earlier model still says what it said
    assert before.group_status("a") is a_status
    assert a_status["ranks"][2]["last_heartbeat_ts"] != T0 + after.offset
    # a tick with no deadline due changes no group: both are shared, and the proposals too
    a_now = after.group_status("a")
    ticked = feed.cycle(("tick", None, None, {}))
    assert ticked.group_status("b") is b_status and ticked.group_status("a") is a_now
    assert ticked.proposal(1) is None and ticked._proposals is after._proposals  # noqa: SLF001
    # a tick past a's heartbeat deadlines recaptures a alone (its silent ranks go OFFLINE)
    feed.offset += 1
    late = T0 + feed.offset + 3600 * S
    feed.machine.step(Record(feed.offset, late, 1, "tick", None, None, {}, 0))
    expired = feed.publisher.publish()
    assert expired.group_status("a")["ranks"][0]["state"] == "OFFLINE"  # type: ignore[index]
    assert expired.group_status("b") is not b_status  # b's deadlines fell due too
    # a resumed tick restarts every group's deadlines: both are captured again
    resumed = feed.cycle(("tick", None, None, {"resumed": True}))
    assert resumed.group_status("a") is not expired.group_status("a")


async def test_a_read_during_a_cycle_sees_the_previous_cycle(tmp_path: Path) -> None:
    host = await Host.open(str(tmp_path / "log.db"), heartbeat_flush_s=0)
    try:
        created = await host.submit(
            NewRecord(kind="group_created", group="g", payload={"world_size": 2, "config": {}})
        )
        assert isinstance(created, Appended)
        assert host.reads.group_status("g") is not None
        # hold the next cycle in its carry-out, where it writes its projection rows
        log = host.log
        write = log.write_projections
        writing, release = asyncio.Event(), asyncio.Event()

        async def held_write(*args: object, **kwargs: object) -> None:
            writing.set()
            await release.wait()
            await write(*args, **kwargs)  # type: ignore[arg-type]

        log.write_projections = held_write  # type: ignore[method-assign]
        before = host.reads
        join = asyncio.ensure_future(
            host.submit(NewRecord(kind="join", group="g", rank=0, payload={"incarnation": "i0"}))
        )
        try:
            await asyncio.wait_for(writing.wait(), 10)
            # the fold has stepped the join; the API's reads have not moved
            assert host.machine.offset == before.offset + 1
            assert host.reads is before
            status = host.reads.group_status("g")
            assert status["ranks"][0]["state"] == "OFFLINE"  # type: ignore[index]
        finally:
            release.set()  # a failed check above must not leave the write (and close) held
        outcome = await asyncio.wait_for(join, 10)
        assert isinstance(outcome, Appended)
        after = host.reads
        assert after is not before and after.offset == outcome.offset
        assert after.group_status("g")["ranks"][0]["state"] == "SYNCED"  # type: ignore[index]
        assert before.group_status("g")["ranks"][0]["state"] == "OFFLINE"  # type: ignore[index]
    finally:
        await host.close()


async def test_a_failed_carry_out_stops_the_host_instead_of_admitting_on_a_lagging_model(
    tmp_path: Path,
) -> None:
    host = await Host.open(str(tmp_path / "log.db"), heartbeat_flush_s=0)
    try:
        created = await host.submit(
            NewRecord(kind="group_created", group="g", payload={"world_size": 2, "config": {}})
        )
        assert isinstance(created, Appended)
        log = host.log
        write = log.write_projections

        async def broken(*args: object, **kwargs: object) -> None:
            raise RuntimeError("a bug while writing the rows")

        log.write_projections = broken  # type: ignore[method-assign]
        try:
            with pytest.raises(HostUnavailable) as failed:
                await host.submit(
                    NewRecord(kind="join", group="g", rank=0, payload={"incarnation": "i0"})
                )
        finally:
            log.write_projections = write  # type: ignore[method-assign]
        assert failed.value.code == CARRY_OUT_FAILED, failed.value
        assert "a bug while writing the rows" in failed.value.detail
        # the fold stepped the join, its carry-out did not end: the read model lags the fold,
        # so the host takes nothing more (its prechecks would read the lagging model)
        assert host.machine.offset == created.offset + 1
        assert host.reads.offset == created.offset
        stopped = host.available()
        assert stopped is not None and stopped.code == CARRY_OUT_FAILED
        with pytest.raises(HostUnavailable) as later:
            await host.submit(
                NewRecord(kind="join", group="g", rank=1, payload={"incarnation": "i1"})
            )
        assert later.value.code == CARRY_OUT_FAILED
    finally:
        await host.close()


def test_a_facet_without_a_read_model_is_named_when_the_host_starts() -> None:
    class Bare:
        name = "bare"

    machine = Coordinator()
    machine.facets = (*machine.facets, Bare())  # type: ignore[assignment]
    with pytest.raises(TypeError, match="facet 'bare' publishes no read model"):
        ReadsPublisher(machine)
