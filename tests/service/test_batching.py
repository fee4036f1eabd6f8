"""What may share a group commit: the host's batching rule, on a real SQLite file.

The fold pre-checks a batch against the state before it, so an input that changes what is
accepted from its rank (a join of a new incarnation) must not share a batch with that rank's
other inputs; plain reports of one rank may.
"""

from __future__ import annotations

from foldplane.coordinator.host.loop import Appended, Host, Refusal
from foldplane.eventlog import NewRecord

CALM = {"heartbeat_timeout_s": 3600.0}


def rec(kind: str, rank: int, **payload) -> NewRecord:
    return NewRecord(kind=kind, group="b", rank=rank, payload=payload)


async def test_a_new_incarnation_fences_the_old_one_before_the_append(tmp_path):
    host = await Host.open(str(tmp_path / "log.db"))
    try:
        created = await host.submit(
            NewRecord(kind="group_created", group="b", payload={"world_size": 2, "config": CALM})
        )
        assert isinstance(created, Appended)
        assert isinstance(await host.submit(rec("join", 0, incarnation="old")), Appended)
        head = host.machine.offset
        join, beat = await host.submit_many(
            [rec("join", 0, incarnation="new"), rec("heartbeat", 0, incarnation="old")]
        )
        assert isinstance(join, Appended)
        assert isinstance(beat, Refusal) and beat.code == "stale_incarnation"
        assert beat.offset is None  # refused by the pre-check: never appended
        assert host.machine.offset == head + 1
    finally:
        await host.close()


async def test_reports_of_one_rank_share_a_group_commit(tmp_path):
    # heartbeat_flush_s=0: beats share the record of the batch they arrive in, not a later one
    host = await Host.open(str(tmp_path / "log.db"), heartbeat_flush_s=0)
    try:
        await host.submit(
            NewRecord(kind="group_created", group="b", payload={"world_size": 2, "config": CALM})
        )
        await host.submit_many([rec("join", 0, incarnation="a"), rec("join", 1, incarnation="c")])
        before = host.metrics.append_batches
        outcomes = await host.submit_many(
            [
                rec("heartbeat", 0, incarnation="a"),
                rec("links", 0, incarnation="a", down=[1], self_ready=True),
                rec("heartbeat", 0, incarnation="a"),
                rec("heartbeat", 1, incarnation="c"),
            ]
        )
        assert all(isinstance(o, Appended) for o in outcomes), outcomes
        assert host.metrics.append_batches == before + 1
        beat0, links, beat0_again, beat1 = (o.offset for o in outcomes)
        # the three beats share one record, appended ahead of the batch's other inputs
        assert beat0 == beat0_again == beat1 == links - 1
        [shared] = await host.log.read(after=beat0 - 1, limit=1)
        assert (shared.kind, shared.rank, shared.payload) == (
            "heartbeat",
            None,
            {"ranks": [[0, 1]]},
        )
    finally:
        await host.close()
