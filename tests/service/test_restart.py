"""Restart cost is bounded by the snapshot interval, not by the log's length.

The host runs in-process on a real SQLite file. A "crash" closes the log without the final
snapshot, so the restart has to replay the tail since the last periodic snapshot.
"""

from __future__ import annotations

import uuid

import pytest

from foldplane.coordinator.host.loop import Appended, Host, HostUnavailable
from foldplane.eventlog import NewRecord


async def _heartbeating_group(host: Host, group: str, world_size: int) -> dict[int, str]:
    created = await host.submit(
        NewRecord(
            kind="group_created", group=group, payload={"world_size": world_size, "config": {}}
        )
    )
    assert isinstance(created, Appended)
    inc = {r: uuid.uuid4().hex for r in range(world_size)}
    joins = [
        NewRecord(kind="join", group=group, rank=r, payload={"incarnation": inc[r]}) for r in inc
    ]
    assert all(isinstance(o, Appended) for o in await host.submit_many(joins))
    return inc


async def test_restart_replays_only_the_tail_after_the_last_snapshot(tmp_path):
    db = str(tmp_path / "log.db")
    # heartbeat_flush_s=0: the beats of each batch share one record, appended at once
    host = await Host.open(db, snapshot_every=50, heartbeat_flush_s=0)
    inc = await _heartbeating_group(host, "big", 8)
    for _ in range(400):  # 3,200 heartbeats in batches of 8: 400 shared records
        beats = [
            NewRecord(kind="heartbeat", group="big", rank=r, payload={"incarnation": inc[r]})
            for r in inc
        ]
        outcomes = await host.submit_many(beats)
        assert all(isinstance(o, Appended) for o in outcomes), outcomes
        assert len({o.offset for o in outcomes}) == 1  # one record for the batch's beats
    head = host.machine.offset
    assert head > 400
    status_before = host.machine.group_status("big")
    assert host.metrics.snapshots >= 5
    await host.close(snapshot=False)  # as if killed: no final snapshot

    again = await Host.open(db, snapshot_every=50)
    try:
        assert again.machine.offset == head
        # the tail, not the whole log: at most snapshot_every, plus the batches that arrived
        # while the last snapshot was being written
        assert 0 < again.replayed_on_start <= 2 * 50
        assert again.machine.group_status("big") == status_before
        assert again.journals.since("big", [0], 0) is None  # older updates: resync
        answer = await again.updates("big", (0,), 0, timeout=0)
        assert answer.resync and answer.next_after == head and not answer.restored
        assert [u.type for u in answer.updates] == ["rank_state"]
        assert answer.updates[0].incarnation == inc[0]
        both = await again.updates("big", (0, 5), 0, timeout=0)
        assert both.resync and both.next_after == head
        assert sorted((u.type, u.rank, u.incarnation) for u in both.updates) == [
            ("rank_state", 0, inc[0]),
            ("rank_state", 5, inc[5]),
        ]
        offsets = [u.offset for u in both.updates]
        assert offsets == sorted(offsets)
    finally:
        await again.close()

    clean = await Host.open(db)
    try:
        assert clean.replayed_on_start == 0  # a graceful close snapshots at the head
    finally:
        await clean.close()


async def test_inputs_after_close_are_refused_with_a_clear_reason(tmp_path):
    host = await Host.open(str(tmp_path / "log.db"))
    await host.close()
    with pytest.raises(HostUnavailable, match="shutting down"):
        await host.submit(NewRecord(kind="tick", payload={}))
