"""Protocol 2's long poll on a real SQLite file: one poll for several ranks of a host, the
resync of a reader past the log's head, and a resync that leaves out the view its reader holds.

The host runs in-process; the HTTP answers come from the ASGI application itself (both the
long-poll fast path and the framework route), so the JSON an agent reads is checked too.
"""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from foldplane.api.app import create_app
from foldplane.api.channel import accept
from foldplane.api.errors import ApiError
from foldplane.coordinator.host.loop import Appended, Host
from foldplane.eventlog import NewRecord
from foldplane.wire.protocol import apply_view_update, view_update
from foldplane.wire.updates import AgentUpdate, RankStateUpdate, ViewCommittedUpdate
from tests.service.conftest import asgi_client

GROUP = "w"
WORLD = 4
CONFIG = {"heartbeat_timeout_s": 3600.0, "reconcile_window_s": 0.0}


def rec(kind: str, rank: int, **payload) -> NewRecord:
    return NewRecord(
        kind=kind, group=GROUP, rank=rank, payload={"incarnation": f"i{rank}", **payload}
    )


async def _formed(host: Host) -> int:
    """Group ``w`` of 4 ranks, every rank joined, ready and ACKed into view 1; the head."""
    created = await host.submit(
        NewRecord(
            kind="group_created", group=GROUP, payload={"world_size": WORLD, "config": CONFIG}
        )
    )
    assert isinstance(created, Appended)
    for kind, fields in (("join", {}), ("links", {"self_ready": True, "version": 0})):
        outcomes = await host.submit_many([rec(kind, r, **fields) for r in range(WORLD)])
        assert all(isinstance(o, Appended) for o in outcomes), outcomes
    assert host.machine.current_view(GROUP) is None
    acks = await host.submit_many([rec("ack", r, version=1) for r in range(WORLD)])
    assert all(isinstance(o, Appended) for o in acks), acks
    view = host.machine.current_view(GROUP)
    assert view is not None and view.version == 1 and view.active_ranks == (0, 1, 2, 3)
    return host.applied_offset


def _group_updates(updates: list[AgentUpdate]) -> list[AgentUpdate]:
    return [u for u in updates if not isinstance(u, RankStateUpdate)]


def _states(updates: list[AgentUpdate]) -> list[tuple[int, int, str]]:
    return [(u.offset, u.rank, u.state) for u in updates if isinstance(u, RankStateUpdate)]


async def test_a_poll_for_several_ranks_gets_the_groups_updates_once_and_each_ranks_own(host):
    head = await _formed(host)
    one = await host.updates(GROUP, (1,), 0, timeout=0)
    two = await host.updates(GROUP, (2,), 0, timeout=0)
    both = await host.updates(GROUP, (1, 2), 0, timeout=0)
    assert not both.resync and both.next_after == one.next_after == two.next_after == head
    # the group's updates once: the prepare and the commit, as each rank alone reads them
    group = _group_updates(both.updates)
    assert [u.type for u in group] == ["view_prepare", "view_committed"]
    assert group == _group_updates(one.updates) == _group_updates(two.updates)
    # each rank's own states, and no other rank's
    assert _states(both.updates) == sorted(_states(one.updates) + _states(two.updates))
    assert {rank for _, rank, _ in _states(both.updates)} == {1, 2}
    assert (1, "HEALTHY") in {(r, s) for _, r, s in _states(both.updates)}
    offsets = [u.offset for u in both.updates]
    assert offsets == sorted(offsets)
    # the committed update is a delta from nothing that folds into the coordinator's view
    [commit] = [u for u in group if isinstance(u, ViewCommittedUpdate)]
    assert commit.base == 0
    assert apply_view_update(None, commit, WORLD) == host.machine.current_view(GROUP)

    async with asgi_client(host) as client:
        for via in ({}, {"via": "framework"}):  # the fast path, and the documented route
            r = await client.get(
                "/agents/updates",
                params={"group": GROUP, "ranks": "1-2", "timeout": 0, "protocol": 2, **via},
            )
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["updates"] == msgspec.to_builtins(both.updates)
            assert body["next_after"] == head
            assert body["resync"] is False and "restored" not in body


async def test_a_reader_past_the_logs_head_is_resynced_and_told_restored(host):
    """Its offsets came from a newer copy of the log than this one: start it afresh."""
    head = await _formed(host)
    current = host.machine.current_view(GROUP)
    # even a reader that names the version it holds gets the full view: that version may
    # name another view in the copy it came from
    answer = await host.updates(GROUP, (0, 3), head + 100, timeout=30, view=1)
    assert answer.resync and answer.restored and answer.next_after == head
    assert [u for u in answer.updates if isinstance(u, ViewCommittedUpdate)] == [
        view_update(None, current)
    ]
    states = [u for u in answer.updates if isinstance(u, RankStateUpdate)]
    assert sorted((u.rank, u.state) for u in states) == [
        (0, "HEALTHY"),
        (3, "HEALTHY"),
    ]
    async with asgi_client(host) as client:
        r = await client.get(
            "/agents/updates",
            params={"group": GROUP, "rank": 0, "after": head + 1, "timeout": 0, "protocol": 2},
        )
        assert r.status_code == 200, r.text
        assert r.json()["resync"] is True and r.json()["restored"] is True
        assert r.json()["next_after"] == head


async def test_twin_a_reader_at_the_head_is_neither_resynced_nor_restored(host):
    head = await _formed(host)
    answer = await host.updates(GROUP, (0, 3), head, timeout=0, view=1)
    assert not answer.resync and not answer.restored
    assert answer.updates == [] and answer.next_after == head
    async with asgi_client(host) as client:
        r = await client.get(
            "/agents/updates",
            params={"group": GROUP, "rank": 0, "after": head, "timeout": 0, "protocol": 2},
        )
        assert r.status_code == 200 and r.json()["resync"] is False
        assert "restored" not in r.json()


async def test_a_resync_leaves_out_the_view_its_reader_holds_and_sends_any_other(tmp_path):
    db = str(tmp_path / "log.db")
    first = await Host.open(db, heartbeat_flush_s=0)
    try:
        head = await _formed(first)
        current = first.machine.current_view(GROUP)
    finally:
        await first.close()
    host = await Host.open(db)  # the journals start at the snapshot: a poll from 0 resyncs
    try:
        full = view_update(None, current)
        holding = await host.updates(GROUP, (2,), 0, timeout=0, view=1)
        assert holding.resync and not holding.restored and holding.next_after == head
        [state] = holding.updates
        assert isinstance(state, RankStateUpdate)
        assert state.rank == 2 and state.state == "HEALTHY"
        for view in (None, 0):  # nothing held, or an older version
            answer = await host.updates(GROUP, (2,), 0, timeout=0, view=view)
            assert answer.resync
            assert [u for u in answer.updates if u.type == "view_committed"] == [full]
            assert [u for u in answer.updates if u.type != "view_committed"] == holding.updates
        async with asgi_client(host) as client:
            params = {"group": GROUP, "rank": 2, "timeout": 0, "protocol": 2}
            held = (await client.get("/agents/updates", params={**params, "view": 1})).json()
            fresh = (await client.get("/agents/updates", params=params)).json()
        assert held["resync"] is True and fresh["resync"] is True
        assert [u["type"] for u in held["updates"]] == ["rank_state"]
        assert sorted(u["type"] for u in fresh["updates"]) == ["rank_state", "view_committed"]
        assert [u for u in fresh["updates"] if u["type"] == "view_committed"] == [
            msgspec.to_builtins(full)
        ]
    finally:
        await host.close()


async def test_a_batch_being_projected_is_not_read_and_no_reader_is_taken_as_restored(host):
    """The journals hold a batch's updates from its fold on, while its projection rows are
    still being written; they are handed out only once the rows are written. So a reader
    polling meanwhile gets nothing new, is never told the log was restored, and then gets the
    update (whose view /views/history can already show)."""
    head = await _formed(host)
    writing, finish = asyncio.Event(), asyncio.Event()
    write_projections = host.log.write_projections

    async def slow_write(*args, **kwargs):
        writing.set()
        await finish.wait()
        return await write_projections(*args, **kwargs)

    host.log.write_projections = slow_write  # type: ignore[method-assign]
    leaving = asyncio.create_task(host.submit(rec("exit", 3)))
    try:
        await asyncio.wait_for(writing.wait(), 10)
        during = await host.updates(GROUP, (3,), head, timeout=0)
        assert during.updates == [] and not during.resync and not during.restored
        assert during.next_after <= host.applied_offset
        again = await host.updates(GROUP, (3,), during.next_after, timeout=0)
        assert not again.restored and not again.resync
    finally:
        finish.set()
        assert isinstance(await leaving, Appended)
    after = await host.updates(GROUP, (3,), head, timeout=5)
    assert after.updates and not after.resync


async def test_a_reader_that_does_not_name_data_moves_is_refused_once_its_group_reads_epochs(
    host,
) -> None:
    """An agent built before ``data_moves`` (protocol 2, no ``features``) would ignore every data
    decision and never see the work it is given: once its group has an epoch plan, its long
    poll and its host channel are refused ``protocol_mismatch`` naming the revision, as a
    protocol-1 agent is; one that names it reads on. Before any plan nothing it reads changed,
    and it is answered."""
    await _formed(host)
    app = create_app(host)
    opening = [(b"sec-websocket-version", b"13"), (b"sec-websocket-key", b"a" * 22 + b"==")]
    channel = b"/agents/channel?group=w&ranks=2&protocol=2"
    limits = {"max_message": 1 << 16, "max_depth": 32, "frame_timeout_s": 5.0, "idle_s": 60.0}
    async with asgi_client(host) as client:
        old = {"group": GROUP, "rank": 2, "timeout": 0, "protocol": 2}
        assert (await client.get("/agents/updates", params=old)).status_code == 200
        accept(app.state, "GET", channel, opening, **limits)  # no plan yet: opened
        plan = await client.post(f"/groups/{GROUP}/epochs", json={"epoch": 0, "dataset_size": 99})
        assert plan.status_code == 201, plan.text
        for params in (old, {**old, "features": "something_else"}):
            r = await client.get("/agents/updates", params=params)
            assert r.status_code == 400, r.text
            assert r.json()["error"] == "protocol_mismatch" and "data_moves" in r.json()["detail"]
        with pytest.raises(ApiError) as refused:
            accept(app.state, "GET", channel, opening, **limits)
        assert refused.value.code == "protocol_mismatch" and "data_moves" in refused.value.detail
        new = {**old, "features": "data_moves"}
        r = await client.get("/agents/updates", params=new)
        assert r.status_code == 200 and "epoch_plan" in [u["type"] for u in r.json()["updates"]]
        accept(app.state, "GET", channel + b"&features=data_moves", opening, **limits)
