"""A ``shutdown_with_save`` reaches its checkpoint rank before the group's other ranks.

The rank that saves must hear of the shutdown while the others still hold their state. Through a
real server on a SQLite file: rank 0, the lowest rank and so the checkpoint rank of view 1,
dies; that spends the failure budget (``max_failure`` 1), and the directive names the failover
rank, 1. Rank 2's poll sees nothing of it until rank 1's poll has been handed it; then rank 2
gets it too. A checkpoint rank that never polls holds the others back only ``shutdown_lead_s``
(the host test below, with an injected bound instead of a wait).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from foldplane.coordinator.host.loop import Appended, Host
from foldplane.eventlog import NewRecord
from tests.service.conftest import FAST, make_server

GROUP = "save"
#: nobody's heartbeats time out during the test: only the death report takes a rank out
CALM = {**FAST, "heartbeat_timeout_s": 600.0, "max_failure": 1}


def _events(client: httpx.Client, *events: dict[str, Any]) -> None:
    r = client.post("/agents/events", json={"events": list(events)})
    assert r.status_code == 200, r.text
    assert all("offset" in res for res in r.json()["results"]), r.text


def _poll(client: httpx.Client, rank: int, after: int, timeout: float) -> dict[str, Any]:
    r = client.get(
        "/agents/updates",
        params={"group": GROUP, "rank": rank, "after": after, "timeout": timeout, "protocol": 2},
    )
    assert r.status_code == 200, r.text
    return r.json()


def _until(client: httpx.Client, rank: int, after: int, kind: str) -> tuple[dict[str, Any], int]:
    """Rank ``rank``'s first update of ``kind`` after ``after``, and where to resume."""
    for _ in range(50):
        body = _poll(client, rank, after, 10)
        after = body["next_after"]
        for update in body["updates"]:
            if update["type"] == kind:
                return update, after
    raise AssertionError(f"rank {rank} got no {kind}")


def test_the_checkpoint_rank_is_handed_the_shutdown_before_the_other_ranks(tmp_path):
    srv = make_server(tmp_path, args=["--shutdown-lead-s", "120"]).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as client:
            r = client.post("/groups", json={"group": GROUP, "world_size": 3, **CALM})
            assert r.status_code == 201, r.text
            ranks = range(3)
            base = {"group": GROUP}
            _events(
                client,
                *({**base, "type": "join", "rank": r, "incarnation": f"i{r}"} for r in ranks),
            )
            _events(
                client,
                *(
                    {**base, "type": "links", "rank": r, "incarnation": f"i{r}", "self_ready": True}
                    for r in ranks
                ),
            )
            _until(client, 0, 0, "view_prepare")
            _events(
                client,
                *(
                    {**base, "type": "ack", "rank": r, "incarnation": f"i{r}", "version": 1}
                    for r in ranks
                ),
            )
            view, formed = _until(client, 0, 0, "view_committed")
            assert (view["version"], view["checkpoint_rank"]) == (1, 0)

            died = client.post("/agents/deaths", json={"group": GROUP, "rank": 0})
            assert died.status_code == 200, died.text
            # Rank 2 asks first: the directive is held for the checkpoint rank, and the empty
            # answer does not move rank 2 past it.
            early = _poll(client, 2, formed, 1.0)
            assert "shutdown_with_save" not in [u["type"] for u in early["updates"]], early
            shutdown, _ = _until(client, 1, formed, "shutdown_with_save")
            assert (shutdown["reason"], shutdown["checkpoint_rank"]) == ("max_failure_exceeded", 1)
            assert early["next_after"] < shutdown["offset"]
            # Rank 1 has it: rank 2 gets it now, from where its empty answer left it.
            late = _poll(client, 2, early["next_after"], 10)
            assert shutdown in late["updates"], late
    finally:
        srv.stop()


# -- the bound, on the host itself (a real SQLite file) ----------------------------------------


def _rec(kind: str, rank: int | None, **payload: Any) -> NewRecord:
    if rank is not None:
        payload = {"incarnation": f"i{rank}", **payload}
    return NewRecord(kind=kind, group=GROUP, rank=rank, payload=payload)


async def _formed(host: Host) -> int:
    """Group ``save`` of 3 ranks, formed; the offset after view 1."""
    created = await host.submit(
        NewRecord(kind="group_created", group=GROUP, payload={"world_size": 3, "config": CALM})
    )
    assert isinstance(created, Appended)
    await host.submit_many([_rec("join", r) for r in range(3)])
    await host.submit_many([_rec("links", r, self_ready=True, version=0) for r in range(3)])
    await host.submit_many([_rec("ack", r, version=1) for r in range(3)])
    assert host.machine.current_view(GROUP).version == 1
    return host.applied_offset


async def test_a_checkpoint_rank_that_never_polls_holds_the_others_back_only_the_lead(tmp_path):
    host = await Host.open(str(tmp_path / "log.db"), shutdown_lead_s=0.2)
    try:
        formed = await _formed(host)
        waiting = asyncio.create_task(host.updates(GROUP, (2,), formed, timeout=30))
        await host.submit(_rec("death_reported", 0))
        answer = await asyncio.wait_for(waiting, 10)  # rank 1 never polls
        assert "shutdown_with_save" in [u["type"] for u in answer.updates]
    finally:
        await host.close()


async def test_twin_a_poll_of_the_checkpoint_rank_is_answered_at_once(tmp_path):
    """Rank 1's own poll, and a host's poll that carries rank 1, are never held."""
    host = await Host.open(str(tmp_path / "log.db"), shutdown_lead_s=120)
    try:
        formed = await _formed(host)
        await host.submit(_rec("death_reported", 0))
        for ranks in ((1,), (1, 2)):
            answer = await asyncio.wait_for(host.updates(GROUP, ranks, formed, timeout=30), 10)
            assert "shutdown_with_save" in [u["type"] for u in answer.updates]
    finally:
        await host.close()
