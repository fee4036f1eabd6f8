"""Heartbeats share records (coordinator/fold/heartbeats.py), on a real SQLite file and the real
Host: every beat is in the log, each beat is checked again right before its record is
appended, and a tick never overtakes a waiting beat."""

from __future__ import annotations

import asyncio

from foldplane.coordinator.host.loop import Appended, Host, Refusal
from foldplane.eventlog import NewRecord

CALM = {"heartbeat_timeout_s": 3600.0}


def rec(kind: str, rank: int | None, **payload) -> NewRecord:
    return NewRecord(kind=kind, group="h", rank=rank, payload=payload)


async def _group(host: Host, n: int) -> None:
    await host.submit(
        NewRecord(kind="group_created", group="h", payload={"world_size": n, "config": CALM})
    )
    joined = await host.submit_many([rec("join", r, incarnation=f"i{r}") for r in range(n)])
    assert all(isinstance(o, Appended) for o in joined)


async def test_beats_that_arrive_together_share_one_record_naming_every_rank(tmp_path):
    host = await Host.open(str(tmp_path / "log.db"), heartbeat_flush_s=0.05)
    try:
        await _group(host, 6)
        head = host.machine.offset
        outcomes = await asyncio.gather(
            *(host.submit(rec("heartbeat", r, incarnation=f"i{r}")) for r in (0, 2, 3, 4, 5))
        )
        assert {type(o) for o in outcomes} == {Appended}
        assert len({o.offset for o in outcomes}) == 1  # one record for the five beats
        [shared] = await host.log.read(after=head, limit=10)
        assert (shared.kind, shared.rank) == ("heartbeat", None)
        assert shared.payload == {"ranks": [0, [2, 5]]}
        assert host.metrics.heartbeats == 5
        g = host.machine._groups["h"]
        assert all(g.alive[r] == shared.ts for r in (0, 2, 3, 4, 5))
        assert g.alive[1] < shared.ts  # rank 1 did not beat
    finally:
        await host.close()


async def test_a_beat_made_stale_while_it_waits_is_refused_not_written(tmp_path):
    host = await Host.open(str(tmp_path / "log.db"), heartbeat_flush_s=30.0)
    try:
        await _group(host, 2)
        head = host.machine.offset
        # both queued now (``enqueue_many`` queues before it returns), waiting for a record
        stale = host.enqueue_many([rec("heartbeat", 0, incarnation="i0")])
        current = host.enqueue_many([rec("heartbeat", 1, incarnation="i1")])
        # a replacement of rank 0 joins while its old incarnation's beat waits
        assert isinstance(await host.submit(rec("join", 0, incarnation="new")), Appended)
        assert not stale.done() and not current.done()
        # a tick flushes the waiting beats first, checked against the state they meet now
        assert isinstance(
            await host.submit(NewRecord(kind="tick", group=None, payload={})), Appended
        )
        [refused], [written] = await stale, await current
        assert isinstance(refused, Refusal) and refused.code == "stale_incarnation"
        assert isinstance(written, Appended)
        records = await host.log.read(after=head, limit=10)
        kinds = [(r.kind, r.rank, r.payload) for r in records]
        assert kinds == [
            ("join", 0, {"incarnation": "new"}),
            ("heartbeat", None, {"ranks": [1]}),  # only the current beat, ahead of the tick
            ("tick", None, {}),
        ]
    finally:
        await host.close()


async def test_a_decision_sharing_an_append_with_beats_is_answered_before_them(tmp_path):
    host = await Host.open(str(tmp_path / "log.db"), heartbeat_flush_s=30.0)
    try:
        await _group(host, 2)
        head = host.machine.offset
        order: list[str] = []
        beat = host.enqueue_many([rec("heartbeat", 0, incarnation="i0")])
        beat.add_done_callback(lambda _: order.append("beat"))
        # queued (``enqueue_many`` queues before it returns): it waits for a shared record
        # a tick flushes the beat into this append, ahead of the tick and the links
        tick = host.enqueue_many([NewRecord(kind="tick", group=None, payload={})])
        tick.add_done_callback(lambda _: order.append("tick"))
        links = host.enqueue_many([rec("links", 1, incarnation="i1", self_ready=True)])
        links.add_done_callback(lambda _: order.append("links"))
        outcomes = [(await f)[0] for f in (beat, tick, links)]
        records = await host.log.read(after=head, limit=10)
        assert [(r.kind, r.offset) for r in records] == [
            ("heartbeat", head + 1),
            ("tick", head + 2),
            ("links", head + 3),
        ]
        assert outcomes == [Appended(head + 1), Appended(head + 2), Appended(head + 3)]
        assert order == ["tick", "links", "beat"]  # one append; the decisions answered first
    finally:
        await host.close()


async def test_twin_without_a_tick_a_waiting_beat_stays_in_the_buffer(tmp_path):
    host = await Host.open(str(tmp_path / "log.db"), heartbeat_flush_s=30.0)
    try:
        await _group(host, 2)
        head = host.machine.offset
        beat = host.enqueue_many([rec("heartbeat", 1, incarnation="i1")])  # queued at once
        other = await host.submit(rec("links", 0, incarnation="i0", self_ready=True))
        assert isinstance(other, Appended) and not beat.done()
        assert [r.kind for r in await host.log.read(after=head, limit=10)] == ["links"]
    finally:
        await host.close()
        assert beat.done()  # answered (closed) when the host stops, never left hanging


async def test_a_refused_beat_is_answered_at_once_and_never_waits(tmp_path):
    host = await Host.open(str(tmp_path / "log.db"), heartbeat_flush_s=30.0)
    try:
        await _group(host, 2)
        # the flush is 30 s away: a refusal that waited for it would miss this bound
        outcome = await asyncio.wait_for(
            host.submit(rec("heartbeat", 0, incarnation="someone-else")), 5.0
        )
        assert isinstance(outcome, Refusal) and outcome.code == "stale_incarnation"
    finally:
        await host.close()
