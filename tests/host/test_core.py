"""The host core (``coordinator/host/core.py``): one core that the service's loop and the
simulator both drive.

- Driven by hand, with no event loop, log or clock: a cycle admits, steps, carries out and
  answers, and the API's read model moves only when the driver says the cycle is carried out.
- Admission: an input the fold refuses is answered at once with its code and never appended;
  a batch's inputs are appended in order and each answered once (the decisions before the
  shared heartbeat records); an input that a record folded before it fenced is answered with
  the refusal and its offset.
- A fold that raises stops the cycle at that record (``FoldFailed``) with nothing applied,
  published or woken; a Ready not carried out publishes nothing either.
- The read model after each cycle is what folding the log afresh gives.
- Time is the driver's: beats wait ``heartbeat_flush_s`` for a shared record, a tick flushes
  them ahead of it, and a tick's record time (not the host's) passes the fold's deadlines.
- The service's :class:`Host` and the simulator's coordinator are drivers of a
  :class:`HostCore`: neither keeps the fold, the journals or the queue of its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from foldplane.coordinator.fold.machine import Coordinator
from foldplane.coordinator.host.core import FoldFailed, HostCore
from foldplane.coordinator.host.inputs import Appended, Input, Refusal, queue_submission
from foldplane.coordinator.host.loop import Host
from foldplane.coordinator.host.reads import ReadsPublisher
from foldplane.coordinator.host.ready import HostState
from foldplane.eventlog.record import NewRecord, Record
from foldplane.sim.world import World
from foldplane.wire import ranks as rank_sets
from foldplane.wire.codes import INVALID_EVENT, STALE_INCARNATION, UNKNOWN_GROUP

S = 1_000_000_000
T0 = 1_764_000_000 * S


class _Answers:
    """A submission's answers, one per input (what a request would be sent)."""

    def __init__(self, n: int) -> None:
        self.results: list[Any] = [None] * n
        #: the inputs in the order they were answered
        self.order: list[int] = []

    def set(self, index: int, outcome: Any) -> None:
        assert self.results[index] is None, f"input {index} answered twice"
        self.results[index] = outcome
        self.order.append(index)

    def set_many(self, indices: list[int], outcome: Any) -> None:
        for index in indices:
            self.set(index, outcome)

    def fail(self, exc: BaseException) -> None:
        raise AssertionError(f"failed: {exc}")

    def done(self) -> bool:
        return None not in self.results


def _cycle(core: HostCore, log: list[Record], now: float) -> None:
    """One cycle as a driver runs it, the log a list."""
    accepted = core.admit(core.take(64), now)
    records = [
        Record(len(log) + 1 + i, T0 + len(log) + i, 1, *_fields(item.record), 0)
        for i, item in enumerate(accepted)
    ]
    log.extend(records)
    ready = core.step(records, projected=0)
    core.publish_updates(ready)
    assert core.reads.offset < ready.offset  # not yet carried out: the API reads the last cycle
    core.carried_out(ready)
    core.answer(accepted, [r.offset for r in records], ready, now)


def _fields(rec: NewRecord) -> tuple[Any, ...]:
    return rec.kind, rec.group, rec.rank, rec.payload


def test_a_cycle_driven_by_hand_admits_steps_publishes_and_answers() -> None:
    core = HostCore(Coordinator(), HostState(), heartbeat_flush_s=0)
    log: list[Record] = []
    created = _Answers(1)
    queue_submission(
        core.queue,
        [NewRecord(kind="group_created", group="g", payload={"world_size": 2, "config": {}})],
        created,  # type: ignore[arg-type]
        None,
        None,
        0.0,
        normalized=False,
    )
    _cycle(core, log, 0.0)
    assert created.results == [Appended(1)]
    assert core.reads.offset == 1 and core.reads.group_status("g") is not None
    joins = _Answers(2)
    queue_submission(
        core.queue,
        [
            NewRecord(kind="join", group="g", rank=r, payload={"incarnation": f"i{r}"})
            for r in (0, 1)
        ],
        joins,  # type: ignore[arg-type]
        None,
        None,
        1.0,
        normalized=False,
    )
    _cycle(core, log, 1.0)
    assert joins.results == [Appended(2), Appended(3)]
    assert core.applied == 3
    status = core.reads.group_status("g")
    assert status is not None and [r["state"] for r in status["ranks"]] == ["SYNCED", "SYNCED"]
    # rank 0's long poll: what the journal holds for it since the start
    answer = core.updates_now("g", (0,), 0)
    assert answer is not None and answer.next_after >= 1


async def test_the_service_and_the_simulator_drive_one_core(tmp_path: Path) -> None:
    host = await Host.open(str(tmp_path / "log.db"))
    try:
        assert isinstance(host.core, HostCore)
        assert host.machine is host.core.machine and host.journals is host.core.journals
        assert host.queue is host.core.queue and host.published is host.core.published
    finally:
        await host.close()
    coordinator = next(c for seed in range(20) if (c := World(seed, 200).run().coord) is not None)
    assert isinstance(coordinator.core, HostCore)
    assert coordinator.machine is coordinator.core.machine
    assert coordinator.core.applied == coordinator.machine.offset


# -- driving the core by hand, time injected --------------------------------------------------


class _Driver:
    """A driver of one :class:`HostCore` as the simulator is: the log a list, every record's
    time and the clock given by the test."""

    def __init__(self, *, flush_s: float = 0.0) -> None:
        self.core = HostCore(Coordinator(), HostState(), heartbeat_flush_s=flush_s)
        self.log: list[Record] = []

    def submit(self, *records: NewRecord, now: float = 0.0) -> _Answers:
        answers = _Answers(len(records))
        queue_submission(
            self.core.queue,
            list(records),
            answers,
            None,
            None,
            now,
            normalized=False,  # type: ignore[arg-type]
        )
        return answers

    def append(self, accepted: list[Input], ts: int) -> list[Record]:
        """What the driver's log does: each accepted input durable at the next offset."""
        records = [
            Record(len(self.log) + 1 + i, ts, 1, *_fields(item.record), 0)
            for i, item in enumerate(accepted)
        ]
        self.log.extend(records)
        return records

    def cycle(self, now: float, *, ts: int | None = None) -> list[Record]:
        """One whole cycle at ``now`` (records stamped ``ts``): what it appended."""
        core = self.core
        accepted = core.admit(core.take(64), now)
        if not accepted:
            return []
        records = self.append(accepted, T0 + int(now * S) if ts is None else ts)
        ready = core.step(records, projected=0)
        core.publish_updates(ready)
        core.carried_out(ready)
        core.answer(accepted, [r.offset for r in records], ready, now)
        return records


def _rec(kind: str, rank: int | None = None, group: str | None = "g", **payload: Any) -> NewRecord:
    return NewRecord(kind=kind, group=group, rank=rank, payload=payload)


def _formed(world_size: int = 2, *, flush_s: float = 0.0) -> _Driver:
    """A driver whose group ``g`` has every rank joined (incarnation ``i<rank>``) at T0."""
    driver = _Driver(flush_s=flush_s)
    driver.submit(_rec("group_created", world_size=world_size, config={}))
    driver.cycle(0.0, ts=T0)
    driver.submit(*(_rec("join", r, incarnation=f"i{r}") for r in range(world_size)))
    driver.cycle(0.0, ts=T0)
    return driver


def _kinds(records: list[Record]) -> list[tuple[str, int | None]]:
    return [(r.kind, r.rank) for r in records]


def test_admission_answers_what_the_fold_refuses_at_once_and_appends_nothing_of_it() -> None:
    driver = _formed()
    core, before = driver.core, len(driver.log)
    answers = driver.submit(
        _rec("join", 0, group="nope", incarnation="x"),  # no such group
        _rec("join", 0, incarnation="old"),  # a new incarnation of rank 0: accepted
        _rec("no_such_kind", 1),  # a kind no part of the fold takes: invalid
    )
    # invalid on arrival: answered before any cycle, never queued
    assert isinstance(answers.results[2], Refusal) and answers.results[2].code == INVALID_EVENT
    assert [i.index for i in core.queue] == [0, 1]
    accepted = core.admit(core.take(64), 1.0)
    assert [i.index for i in accepted] == [1]
    refused = answers.results[0]
    assert isinstance(refused, Refusal) and refused.code == UNKNOWN_GROUP
    assert refused.offset is None and "nope" in refused.detail
    assert answers.results[1] is None  # not answered before it is durable
    records = driver.append(accepted, T0 + S)
    ready = core.step(records, projected=0)
    core.publish_updates(ready)
    core.carried_out(ready)
    core.answer(accepted, [r.offset for r in records], ready, 1.0)
    assert _kinds(driver.log[before:]) == [("join", 0)]
    assert answers.results[1] == Appended(before + 1)
    assert core.metrics.fenced[UNKNOWN_GROUP] == 1


def test_a_batchs_inputs_are_appended_in_order_and_each_answered_once_decisions_first() -> None:
    driver = _formed(4, flush_s=0.5)
    before = len(driver.log)
    beats = driver.submit(_rec("heartbeat", 2, incarnation="i2"), now=1.0)
    driver.cycle(1.0)  # the beat waits for its shared record
    assert beats.results == [None]
    exits = driver.submit(
        _rec("exit", 3, incarnation="i3"),
        _rec("exit", 1, incarnation="i1"),
        _rec("exit", 0, incarnation="i0"),
        now=1.5,
    )
    appended = driver.cycle(1.5)
    # the beats that fell due in front (checked against the state before the batch), then
    # the inputs in arrival order
    assert _kinds(appended) == [("heartbeat", None), ("exit", 3), ("exit", 1), ("exit", 0)]
    assert list(rank_sets.decode(appended[0].payload["ranks"], 4)) == [2]
    assert exits.results == [Appended(before + 2), Appended(before + 3), Appended(before + 4)]
    assert beats.results == [Appended(before + 1)]
    assert exits.order == [0, 1, 2]  # each once (``_Answers.set`` checks), in append order
    assert driver.core.metrics.append_batches == 3  # the creation, the joins, this one


def test_the_decisions_of_a_batch_are_answered_before_its_shared_heartbeat_record() -> None:
    driver = _formed(2, flush_s=0.5)
    answered: list[str] = []

    class _Named(_Answers):
        def __init__(self, name: str) -> None:
            super().__init__(1)
            self.name = name

        def set(self, index: int, outcome: Any) -> None:
            super().set(index, outcome)
            answered.append(self.name)

    beat, exit_ = _Named("beat"), _Named("exit")
    core = driver.core
    queue_submission(
        core.queue,
        [_rec("heartbeat", 1, incarnation="i1")],
        beat,
        None,
        None,
        1.0,
        normalized=False,
    )  # type: ignore[arg-type]
    queue_submission(
        core.queue, [_rec("exit", 0, incarnation="i0")], exit_, None, None, 1.5, normalized=False
    )  # type: ignore[arg-type]
    appended = driver.cycle(1.5)
    assert _kinds(appended) == [("heartbeat", None), ("exit", 0)]
    assert answered == ["exit", "beat"]


def test_an_input_fenced_by_a_record_folded_before_it_gets_the_refusal_and_its_offset() -> None:
    driver = _formed()
    core = driver.core
    answers = driver.submit(_rec("exit", 0, incarnation="i0"))
    accepted = core.admit(core.take(64), 1.0)
    assert len(accepted) == 1  # i0 is current when admitted
    # another writer appended a new incarnation of rank 0 first: the log holds both
    foreign = NewRecord(kind="join", group="g", rank=0, payload={"incarnation": "i0b"})
    driver.append([Input(foreign, b"", _Answers(1), 0, None, None, 1.0)], T0 + S)  # type: ignore[arg-type]
    ours = driver.append(accepted, T0 + S)
    ready = core.step(driver.log[-2:], projected=0)
    core.publish_updates(ready)
    core.carried_out(ready)
    core.answer(accepted, [r.offset for r in ours], ready, 1.0)
    refused = answers.results[0]
    assert isinstance(refused, Refusal) and refused.code == STALE_INCARNATION
    assert refused.offset == ours[0].offset and "i0b" in refused.detail
    assert core.metrics.fenced[STALE_INCARNATION] == 1


def test_a_fold_that_raises_stops_at_its_record_with_nothing_applied_or_published() -> None:
    driver = _formed()
    core = driver.core
    reads, applied = core.reads, core.applied
    answers = driver.submit(_rec("exit", 0, incarnation="i0"))
    accepted = core.admit(core.take(64), 1.0)
    records = driver.append(accepted, T0 + S)
    # a record the fold has already stepped (the fold raises: records go in offset order)
    again = driver.log[1]
    with pytest.raises(FoldFailed) as failed:
        core.step([*records, again], projected=0)
    assert failed.value.offset == again.offset
    assert isinstance(failed.value.cause, ValueError)
    assert f"offset {again.offset}" in str(failed.value)
    # no Ready: nothing carried out, the read model, the journals and the answer unchanged
    assert core.applied == applied and core.reads is reads
    assert core.updates_now("g", (0,), applied) is None
    assert answers.results == [None]


def test_a_ready_not_carried_out_is_not_seen_by_the_api_or_the_polls() -> None:
    driver = _formed()
    core = driver.core
    reads, applied = core.reads, core.applied
    driver.submit(_rec("exit", 0, incarnation="i0"))
    accepted = core.admit(core.take(64), 1.0)
    records = driver.append(accepted, T0 + S)
    ready = core.step(records, projected=0)
    core.publish_updates(ready)
    # the driver's rows are not written yet
    assert core.reads is reads and core.applied == applied
    assert core.updates_now("g", (0,), applied) is None
    # a reader past what is carried out has seen a log this one is not (restored from an
    # older copy): it resyncs, told so, as of the applied offset
    ahead = core.updates_now("g", (0,), ready.offset)
    assert ahead is not None and ahead.resync and ahead.restored
    assert ahead.next_after == applied
    core.carried_out(ready)
    assert core.applied == ready.offset == records[-1].offset
    assert core.reads.offset == ready.offset
    answer = core.updates_now("g", (0,), applied)
    assert answer is not None and answer.next_after == ready.offset


def test_the_read_model_after_each_cycle_is_the_fold_of_the_log_so_far() -> None:
    driver = _Driver(flush_s=0.0)
    inputs = [
        [_rec("group_created", world_size=3, config={})],
        [_rec("join", r, incarnation=f"i{r}") for r in range(3)],
        [_rec("exit", 1, incarnation="i1"), _rec("join", 0, group="nope", incarnation="x")],
        [_rec("heartbeat", 2, incarnation="i2")],
        [_rec("tick", group=None)],
    ]
    for n, batch in enumerate(inputs):
        driver.submit(*batch, now=float(n))
        driver.cycle(float(n), ts=T0 + (n if n < 4 else 15) * S)  # the tick: past the timeouts
        refold = Coordinator()
        for rec in driver.log:
            refold.step(rec)
        fresh = ReadsPublisher(refold).current
        reads = driver.core.reads
        assert reads.offset == len(driver.log) == driver.core.applied
        assert reads.groups() == fresh.groups()
        assert reads.group_status("g") == fresh.group_status("g")
        assert reads.group_list() == fresh.group_list()
    status = driver.core.reads.group_status("g")
    assert status is not None
    assert [r["state"] for r in status["ranks"]] == ["OFFLINE", "OFFLINE", "OFFLINE"]


def test_beats_wait_their_flush_interval_of_the_drivers_clock_for_one_shared_record() -> None:
    driver = _formed(3, flush_s=0.5)
    driver.submit(_rec("group_created", group="h", world_size=1, config={}))
    driver.cycle(0.0, ts=T0)
    driver.submit(_rec("join", 0, group="h", incarnation="h0"))
    driver.cycle(0.0, ts=T0)
    core, before = driver.core, len(driver.log)
    first = driver.submit(_rec("heartbeat", 0, incarnation="i0"), now=10.0)
    assert driver.cycle(10.0) == [] and core.admission.beats.deadline() == 10.5
    second = driver.submit(
        _rec("heartbeat", 1, incarnation="i1"), _rec("heartbeat", 0, incarnation="i0"), now=10.3
    )
    other = driver.submit(_rec("heartbeat", 0, group="h", incarnation="h0"), now=10.3)
    assert driver.cycle(10.3) == []
    assert core.admission.beats.deadline() == 10.5  # the oldest beat's arrival decides
    assert driver.cycle(10.49) == [] and first.results == [None]
    (shared,) = driver.cycle(10.5)
    assert shared.kind == "heartbeat" and shared.rank is None
    assert list(rank_sets.decode(shared.payload["ranks"], 3)) == [0, 1]
    assert first.results == [Appended(before + 1)]
    assert second.results == [Appended(before + 1), Appended(before + 1)]
    assert other.results == [None]  # group h's beat is due at its own arrival's flush
    assert core.admission.beats.deadline() == 10.8
    (shared,) = driver.cycle(10.8)
    assert shared.group == "h" and other.results == [Appended(before + 2)]
    assert core.admission.beats.deadline() is None


def test_a_tick_flushes_the_waiting_beats_ahead_of_it() -> None:
    driver = _formed(2, flush_s=0.5)
    beats = driver.submit(_rec("heartbeat", 1, incarnation="i1"), now=10.0)
    driver.cycle(10.0)
    driver.submit(_rec("tick", group=None), now=10.1)
    appended = driver.cycle(10.1)  # before the beats fall due
    assert _kinds(appended) == [("heartbeat", None), ("tick", None)]
    assert beats.results == [Appended(appended[0].offset)]


def test_a_tick_passes_the_folds_deadlines_by_its_record_time_not_the_drivers_clock() -> None:
    driver = _formed(2)
    core = driver.core
    deadline = core.machine.next_deadline()
    assert deadline is not None and deadline > T0
    driver.submit(_rec("tick", group=None), now=1_000.0)  # the driver's clock: irrelevant
    driver.cycle(1_000.0, ts=deadline - 1)  # not yet at it
    status = core.reads.group_status("g")
    assert status is not None and {r["state"] for r in status["ranks"]} == {"SYNCED"}
    assert core.machine.next_deadline() == deadline
    driver.submit(_rec("tick", group=None), now=0.0)
    driver.cycle(0.0, ts=deadline)
    status = core.reads.group_status("g")
    assert status is not None and {r["state"] for r in status["ranks"]} == {"OFFLINE"}
    assert core.machine.next_deadline() != deadline
