"""What may share a batch and what of it is appended (coordinator/host/batching.py), alone."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from foldplane.coordinator.fold.heartbeats import HeartbeatBuffer
from foldplane.coordinator.host.batching import Admission, decisions_first, take_batch
from foldplane.coordinator.host.inputs import Appended, Input, Refusal, Reply, queue_submission
from foldplane.coordinator.host.metrics import HostMetrics
from foldplane.eventlog import NewRecord
from foldplane.eventlog.record import validate
from foldplane.wire import ranks as rank_sets
from tests.fold.script import Script


def queued(*records: NewRecord, key: tuple[Any, ...] | None = None, at: float = 0.0) -> list[Input]:
    """The inputs of one submission that arrived ``at`` (the loop's clock)."""
    reply = Reply(asyncio.get_running_loop().create_future(), len(records))
    return [Input(rec, validate(rec), reply, i, key, None, at) for i, rec in enumerate(records)]


def rec(kind: str, rank: int | None = None, group: str = "g", **payload: Any) -> NewRecord:
    return NewRecord(kind=kind, group=group, rank=rank, payload=payload)


def kinds(batch: list[Input]) -> list[tuple[str, int | None]]:
    return [(i.record.kind, i.record.rank) for i in batch]


async def test_reports_of_one_rank_share_a_batch() -> None:
    queue = deque(queued(rec("heartbeat", 0), rec("links", 0), rec("ack", 0), rec("heartbeat", 1)))
    assert kinds(take_batch(queue, 100)) == [
        ("heartbeat", 0),
        ("links", 0),
        ("ack", 0),
        ("heartbeat", 1),
    ]
    assert not queue


async def test_a_join_shares_no_batch_with_its_rank_and_what_follows_waits_behind_it() -> None:
    queue = deque(
        queued(rec("heartbeat", 0), rec("join", 0), rec("heartbeat", 0), rec("heartbeat", 1))
    )
    assert kinds(take_batch(queue, 100)) == [("heartbeat", 0), ("heartbeat", 1)]
    assert kinds(list(queue)) == [("join", 0), ("heartbeat", 0)]  # in arrival order
    assert kinds(take_batch(queue, 100)) == [("join", 0)]
    assert kinds(take_batch(queue, 100)) == [("heartbeat", 0)]


async def test_a_second_input_with_the_same_key_waits_for_the_first() -> None:
    first = queued(rec("proposal", op="activate", ranks=[1]), key=("g", "k"))
    second = queued(rec("proposal", op="activate", ranks=[1]), key=("g", "k"))
    other = queued(rec("proposal", op="activate", ranks=[2]), key=("g", "other"))
    queue = deque(first + second + other)
    assert take_batch(queue, 100) == first + other
    assert take_batch(queue, 100) == second


async def test_a_second_start_of_the_same_refit_transfer_waits_for_the_first() -> None:
    """Both publishers ask for the transfer at once: in one batch the second would be checked
    against the state before the first, and folded as a retry (attempt 2)."""

    def start(rank: int | None, name: str, key: tuple[Any, ...] | None = None) -> list[Input]:
        fields = {"refit": "rl", "key": name} | ({"epoch": 3} if rank is not None else {})
        group = "train" if rank is not None else None
        record = NewRecord(kind="transfer", group=group, rank=rank, payload=fields)
        queue: deque[Input] = deque()  # keyed on arrival, as the host queues every submission
        reply = Reply(asyncio.get_running_loop().create_future(), 1)
        queue_submission(queue, [record], reply, key, None, 0.0, normalized=False)
        return list(queue)

    first, second = start(0, "step-1"), start(1, "step-1")
    operator = start(None, "step-1", key=("transfer", "rl", "step-1"))  # the route's key
    other = start(None, "step-2", key=("transfer", "rl", "step-2"))
    queue = deque(first + second + operator + other)
    assert take_batch(queue, 100) == first + other
    assert take_batch(queue, 100) == second
    assert take_batch(queue, 100) == operator


async def test_anything_for_a_group_waits_for_the_batch_that_creates_it() -> None:
    queue = deque(
        queued(
            rec("group_created", world_size=2, config={}),
            rec("join", 0, incarnation="a"),
            rec("heartbeat", 0, group="other"),
        )
    )
    assert kinds(take_batch(queue, 100)) == [("group_created", None), ("heartbeat", 0)]
    assert kinds(take_batch(queue, 100)) == [("join", 0)]


async def test_a_batch_is_bounded_and_abandoned_inputs_are_dropped() -> None:
    gone = queued(rec("heartbeat", 9))
    gone[0].reply.fail(RuntimeError("the caller went away"))
    queue = deque(gone + queued(*(rec("heartbeat", r) for r in range(5))))
    assert kinds(take_batch(queue, 3)) == [("heartbeat", 0), ("heartbeat", 1), ("heartbeat", 2)]
    assert kinds(take_batch(queue, 3)) == [("heartbeat", 3), ("heartbeat", 4)]


def admission(script: Script) -> Admission:
    return Admission(script.m, HeartbeatBuffer(0.5), HostMetrics())


async def test_a_refused_input_is_answered_at_once_and_not_appended() -> None:
    script = Script()
    script.form("g", 2)
    admit = admission(script)
    [join] = queued(rec("join", 0, incarnation="g-0-b"))  # rank 0 is healthy as g-0-a
    assert admit.admit([join], now=0.0) == []
    outcome = (await join.reply.future)[0]
    assert isinstance(outcome, Refusal) and outcome.code == "rank_busy"
    assert outcome.offset is None
    assert admit.metrics.fenced["rank_busy"] == 1


async def test_beats_wait_for_a_shared_record_a_tick_flushes_them_in_front() -> None:
    script = Script()
    script.form("g", 2)
    admit = admission(script)
    beats = queued(rec("heartbeat", 0, incarnation="g-0-a")) + queued(
        rec("heartbeat", 1, incarnation="g-1-a")
    )
    assert admit.admit(beats, now=0.0) == []  # buffered
    assert admit.beats.deadline() == 0.5
    [tick] = queued(NewRecord(kind="tick", group=None, payload={}))
    accepted = admit.admit([tick], now=0.1)
    assert [i.record.kind for i in accepted] == ["heartbeat", "tick"]
    shared = accepted[0]
    assert shared.record.rank is None and shared.record.group == "g"
    shared.answer(Appended(42))  # the shared record's outcome is every beat's
    assert [(await b.reply.future)[0] for b in beats] == [Appended(42), Appended(42)]
    assert admit.metrics.heartbeats == 2


async def test_an_append_answers_its_decisions_before_its_shared_beats() -> None:
    script = Script()
    script.form("g", 2)
    admit = admission(script)
    admit.admit(queued(rec("heartbeat", 0, incarnation="g-0-a")), now=0.0)
    [tick] = queued(NewRecord(kind="tick", group=None, payload={}))
    [links] = queued(rec("links", 1, incarnation="g-1-a", self_ready=True))
    accepted = admit.admit([tick, links], now=0.6)  # the shared record falls due: it goes first
    assert [i.record.kind for i in accepted] == ["heartbeat", "tick", "links"]
    assert decisions_first(accepted) == [1, 2, 0]  # answered after them, appended before


async def test_twin_an_append_without_beats_is_answered_in_append_order() -> None:
    accepted = queued(rec("ack", 0), rec("links", 1), rec("ack", 1))
    assert decisions_first(accepted) == [0, 1, 2]


async def test_the_shared_beats_never_go_ahead_of_the_resumed_tick() -> None:
    script = Script()
    script.form("g", 2)
    admit = admission(script)
    admit.admit(queued(rec("heartbeat", 0, incarnation="g-0-a")), now=0.0)
    [resumed] = queued(NewRecord(kind="tick", group=None, payload={"resumed": True}))
    accepted = admit.admit([resumed], now=0.1)
    assert [(i.record.kind, i.record.payload.get("resumed")) for i in accepted] == [
        ("tick", True),
        ("heartbeat", None),
    ]


async def test_a_beat_stale_by_the_time_its_record_is_built_is_refused() -> None:
    script = Script()
    script.form("g", 2)
    admit = admission(script)
    [beat] = queued(rec("heartbeat", 0, incarnation="g-0-a"))
    admit.admit([beat], now=0.0)
    script.exit(0)  # the rank exited meanwhile: its beat is checked again
    assert admit.admit([], now=1.0) == []
    outcome = (await beat.reply.future)[0]
    assert isinstance(outcome, Refusal) and outcome.code == "rank_offline"
    assert admit.beats.deadline() is None  # nothing left waiting


async def test_a_waiting_beat_is_checked_again_only_if_its_group_changed_meanwhile() -> None:
    script = Script()
    script.form("g", 3)
    admit = admission(script)
    checks: list[int | None] = []
    check, not_current = script.m.check, script.m.beats_not_current

    def counted(kind: str, group: str | None, rank: int | None, payload: Any) -> Any:
        checks.append(rank)
        return check(kind, group, rank, payload)

    def counted_beats(group: str, ranks: list[int], payloads: list[Any]) -> list[int]:
        checks.extend(ranks)  # the check's first test, alone (a current rank's beat), for each
        return not_current(group, ranks, payloads)

    script.m.check = counted  # type: ignore[method-assign]
    script.m.beats_not_current = counted_beats  # type: ignore[method-assign]
    beats = queued(rec("heartbeat", 0, incarnation="g-0-a")) + queued(
        rec("heartbeat", 1, incarnation="g-1-a")
    )
    admit.admit(beats, now=0.0)
    assert checks == [0, 1]  # the first check of each
    [shared] = admit.admit([], now=1.0)  # nothing any check reads changed: not checked again
    assert checks == [0, 1] and shared.record.payload["ranks"] == rank_sets.encode([0, 1])
    later = queued(rec("heartbeat", 0, incarnation="g-0-a"), at=2.0) + queued(
        rec("heartbeat", 1, incarnation="g-1-a"), at=2.0
    )
    admit.admit(later, now=2.0)
    script.exit(2)  # rank 2 left: the group's fence epoch moved on
    [shared] = admit.admit([], now=3.0)
    assert checks == [0, 1, 0, 1, 0, 1]  # both checked again before the record is built
    assert shared.record.payload["ranks"] == rank_sets.encode([0, 1])
