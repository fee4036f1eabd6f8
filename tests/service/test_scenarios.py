"""The SPEC's scenarios, end to end: a real server on a SQLite file, simulated agent hosts
(``agent.simhost``: the real ``AgentMachine`` per rank) over HTTP.

Each test uses its own group on one server per module. Waiting is on what the ranks' machines
install (the simulated hosts wake the test), never on a fixed sleep. A rank's faults are the
simulator's: a muted direction (``"beats"``: it stops beating; ``"updates"``: it hears nothing,
so it never ACKs), a kill, a death report.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterable

import httpx
import msgspec
import pytest

from foldplane.agent.simhost import SimulatedCluster
from foldplane.wire.protocol import PROTOCOL, View
from tests.service.conftest import FAST, Server

#: How often the simulated ranks beat (the groups' heartbeat timeout is 2 s).
HEARTBEAT_S = 0.25


@pytest.fixture
async def client(shared_server: Server) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=shared_server.url, timeout=30) as c:
        yield c


@pytest.fixture
def address(shared_server: Server) -> tuple[str, int]:
    return ("127.0.0.1", shared_server.port)


async def create_group(client: httpx.AsyncClient, world_size: int, **config) -> str:
    group = f"g-{uuid.uuid4().hex[:10]}"
    r = await client.post(
        "/groups", json={"group": group, "world_size": world_size, **FAST, **config}
    )
    assert r.status_code == 201, r.text
    return group


Cluster = SimulatedCluster


def cluster(address: tuple[str, int], group: str, world_size: int) -> Cluster:
    return Cluster(address, group, world_size, heartbeat_interval_s=HEARTBEAT_S)


async def formed(
    client: httpx.AsyncClient, address: tuple[str, int], world_size: int, **config
) -> Cluster:
    sim = cluster(address, await create_group(client, world_size, **config), world_size)
    await sim.start()
    await on_version(sim, 1)
    return sim


async def on_version(
    sim: SimulatedCluster, version: int, ranks: Iterable[int] | None = None
) -> View:
    """Wait until every rank named (every live rank by default) holds ``version``; the view
    they all hold (the same one: each rank folded the same deltas)."""
    named = sim.live_ranks if ranks is None else list(ranks)
    await sim.wait_until(lambda: sim.all_on(version, named), 20)
    views = {r: sim.view(r) for r in named}
    assert all(v is not None and v.version == version for v in views.values()), views
    first = views[named[0]]
    assert all(v == first for v in views.values()), views
    assert first is not None
    return first


def doc(view: View) -> dict:
    """A view the way the coordinator serves it (``GET /views/current``)."""
    return json.loads(msgspec.json.encode(view))


async def propose(client: httpx.AsyncClient, group: str, op: str, ranks: list[int], **kw):
    return await client.post(
        "/proposals", params={"wait": 15}, json={"group": group, "op": op, "ranks": ranks, **kw}
    )


async def test_formation_commits_view_1_once_every_rank_is_healthy(client, address):
    sim = await formed(client, address, 4)
    try:
        view = (await client.get("/views/current", params={"group": sim.group})).json()
        assert view["version"] == 1
        assert view["active_ranks"] == [0, 1, 2, 3]
        assert view["healthy_set"] == [0, 1, 2, 3]
        assert view["cause"]["kind"] == "formation"
        assert sorted(view["acked_ranks"]) == [0, 1, 2, 3]
        held = await on_version(sim, 1)
        assert held.active_ranks == (0, 1, 2, 3)
        assert doc(held) == view  # every rank folded the same view the coordinator serves
        status = (await client.get(f"/groups/{sim.group}")).json()
        assert status["config"]["world_size"] == 4
        again = await client.post("/groups", json={"group": sim.group, "world_size": 4, **FAST})
        assert again.status_code == 200, again.text
        conflict = await client.post("/groups", json={"group": sim.group, "world_size": 5, **FAST})
        assert conflict.status_code == 409
        assert conflict.json()["error"] == "group_conflict"
    finally:
        await sim.stop()


async def test_deactivate_goes_through_the_barrier_and_is_applied(client, address):
    sim = await formed(client, address, 4)
    try:
        r = await propose(client, sim.group, "deactivate", [3], proposer="scheduler")
        assert r.status_code == 200, r.text
        proposal = r.json()
        assert proposal["status"] == "applied"
        assert proposal["version"] == 2
        view = await on_version(sim, 2)
        assert view.active_ranks == (0, 1, 2)
        history = (await client.get("/views/history", params={"group": sim.group})).json()
        v2 = history["views"][-1]
        assert v2 == doc(view)
        assert v2["version"] == 2
        assert v2["cause"]["kind"] == "proposal"
        assert v2["cause"]["proposals"] == [proposal["id"]]
        assert sorted(v2["acked_ranks"]) == [0, 1, 2, 3]  # the leaving rank is a participant too
        again = (await client.get(f"/proposals/{proposal['id']}")).json()
        assert again == proposal
    finally:
        await sim.stop()


async def test_activating_an_unhealthy_rank_is_rejected_with_its_state(client, address):
    sim = await formed(client, address, 4)
    try:
        assert (await propose(client, sim.group, "deactivate", [3])).json()["status"] == "applied"
        # it sends nothing more (no beat, no join, no ACK) but still hears its updates
        sim.mute(3, "beats", "events")
        await sim.wait_until(lambda: sim.host_of[3].states.get(3) == "OFFLINE", 20)
        r = await propose(client, sim.group, "activate", [3])
        assert r.status_code == 200, r.text
        rejected = r.json()
        assert rejected["status"] == "rejected"
        assert "3" in rejected["reason"] and "OFFLINE" in rejected["reason"]
        view = (await client.get("/views/current", params={"group": sim.group})).json()
        assert view["version"] == 2 and view["active_ranks"] == [0, 1, 2]
        # well-formed but invalid proposals are in the log, for audits
        events = (
            await client.get("/events", params={"group": sim.group, "kind": "proposal"})
        ).json()
        assert rejected["id"] in [e["offset"] for e in events["events"]]
    finally:
        await sim.stop()


async def test_eight_identical_proposals_make_one_view_change(client, address):
    sim = await formed(client, address, 8)
    try:
        assert (await propose(client, sim.group, "deactivate", [7])).json()["version"] == 2
        answers = await asyncio.gather(
            *(propose(client, sim.group, "activate", [7], proposer=f"rank:{r}") for r in range(8))
        )
        outcomes = [a.json() for a in answers]
        assert [o["status"] for o in outcomes] == ["applied"] * 8
        assert {o["version"] for o in outcomes} == {3}
        assert len({o["id"] for o in outcomes}) == 8  # eight proposals, one change
        history = (await client.get("/views/history", params={"group": sim.group})).json()
        assert [v["version"] for v in history["views"]] == [1, 2, 3]
        assert history["views"][-1]["active_ranks"] == list(range(8))
        assert doc(await on_version(sim, 3)) == history["views"][-1]
    finally:
        await sim.stop()


async def test_idempotency_key_returns_the_same_proposal_or_a_conflict(client, address):
    sim = await formed(client, address, 3)
    try:
        body = {"idempotency_key": "k-1", "proposer": "scheduler"}
        first = (await propose(client, sim.group, "deactivate", [2], **body)).json()
        second = await propose(client, sim.group, "deactivate", [2], **body)
        assert second.status_code == 200 and second.json() == first
        conflict = await propose(client, sim.group, "deactivate", [1], **body)
        assert conflict.status_code == 409
        assert conflict.json()["error"] == "idempotency_conflict"
        assert str(first["id"]) in conflict.json()["detail"]
    finally:
        await sim.stop()


async def test_ack_timeout_drops_the_silent_rank(client, address):
    sim = await formed(client, address, 4)
    try:
        # hung: it keeps beating but hears nothing more and never ACKs (its ACKs are lost too:
        # the long poll already in flight when it hangs may still bring it the prepare)
        sim.mute(3, "updates", "events")
        r = await propose(client, sim.group, "deactivate", [2])
        assert r.status_code == 200, r.text
        outcome = r.json()
        assert outcome["status"] == "applied_with_dropped_ranks"
        assert outcome["dropped_ranks"] == [3]
        view = await on_version(sim, 2, [0, 1, 2])
        assert view.active_ranks == (0, 1)
        assert view.rank_states[3] == "OFFLINE"
        assert sim.view(3) is not None and sim.view(3).version == 1  # it heard nothing
        history = (await client.get("/views/history", params={"group": sim.group})).json()
        assert history["views"][-1]["dropped_ranks"] == [3]
        assert history["views"][-1] == doc(view)
    finally:
        await sim.stop()


async def test_heartbeat_timeout_auto_deactivates_the_rank(client, address):
    sim = await formed(client, address, 4)
    try:
        # it stops beating, and nothing else it sends arrives either: it cannot join again
        # in place when it hears it is OFFLINE (which a live agent would do at once)
        sim.mute(1, "beats", "events")
        view = await on_version(sim, 2, [0, 2, 3])
        assert view.active_ranks == (0, 2, 3)
        assert view.rank_states[1] == "OFFLINE"
        current = (await client.get("/views/current", params={"group": sim.group})).json()
        assert current["cause"]["kind"] == "auto_deactivation"
        metrics = (await client.get("/metrics")).text
        assert f'foldplane_view_changes_total{{group="{sim.group}"}} 2.0\n' in metrics
    finally:
        await sim.stop()


async def test_a_stale_incarnation_is_fenced_and_not_logged(client, address):
    sim = await formed(client, address, 2)
    try:
        head = (await client.get("/healthz")).json()["head"]
        stale = {"type": "heartbeat", "group": sim.group, "rank": 1, "incarnation": "not-the-one"}
        busy = {"type": "join", "group": sim.group, "rank": 1, "incarnation": "a-new-process"}
        answer = await client.post("/agents/events", json={"events": [stale, busy]})
        assert answer.status_code == 200, answer.text
        [fenced, refused] = answer.json()["results"]
        assert fenced["error"] == "stale_incarnation"
        assert (
            sim.machine(1).config.incarnation in fenced["detail"]
            and "not-the-one" in fenced["detail"]
        )
        assert "offset" not in fenced
        assert refused["error"] == "rank_busy"
        death = await client.post(
            "/agents/deaths", json={"group": sim.group, "rank": 1, "incarnation": "not-the-one"}
        )
        assert death.status_code == 409 and death.json()["error"] == "stale_incarnation"
        logged = (
            await client.get("/events", params={"after": head, "group": sim.group, "limit": 1000})
        ).json()
        incarnations = {e["payload"].get("incarnation") for e in logged["events"]}
        assert "not-the-one" not in incarnations and "a-new-process" not in incarnations
        metrics = (await client.get("/metrics")).text
        assert 'foldplane_fenced_inputs_total{code="stale_incarnation"}' in metrics
    finally:
        await sim.stop()


async def test_a_reported_death_takes_the_rank_offline_through_the_death_chain(client, address):
    sim = await formed(client, address, 3)
    try:
        incarnation = sim.machine(2).config.incarnation
        sim.kill(2)  # the process dies; its launcher reports it
        r = await client.post(
            "/agents/deaths",
            json={
                "group": sim.group,
                "rank": 2,
                "incarnation": incarnation,
                "reporter": "launcher",
            },
        )
        assert r.status_code == 200, r.text
        assert r.json()["offset"] > 0
        view = await on_version(sim, 2)
        assert sim.live_ranks == [0, 1]
        assert view.active_ranks == (0, 1)
        assert view.rank_states[2] == "OFFLINE"
    finally:
        await sim.stop()


async def test_updates_resume_after_an_offset_without_gaps_or_repeats(client, address):
    sim = await formed(client, address, 2)
    try:
        poll = {"group": sim.group, "rank": 0, "timeout": 0, "protocol": PROTOCOL}
        first = (await client.get("/agents/updates", params={**poll, "after": 0})).json()
        offsets = [u["offset"] for u in first["updates"]]
        assert offsets == sorted(offsets)
        assert {u["type"] for u in first["updates"]} >= {
            "view_prepare",
            "view_committed",
            "rank_state",
        }
        assert first["store"] is not None and first["store"]["port"] > 0
        again = await client.get("/agents/updates", params={**poll, "after": first["next_after"]})
        assert again.status_code == 200, again.text
        assert again.json()["updates"] == []
        middle = offsets[len(offsets) // 2]
        tail = await client.get("/agents/updates", params={**poll, "after": middle})
        assert tail.status_code == 200, tail.text
        assert [u["offset"] for u in tail.json()["updates"]] == [o for o in offsets if o > middle]
    finally:
        await sim.stop()


async def _read_events(client: httpx.AsyncClient, n: int, **kw) -> list[dict]:
    """The first ``n`` server-sent events of ``/events/stream``."""
    events: list[dict] = []
    current: dict = {}
    async with client.stream("GET", "/events/stream", **kw) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        async for line in r.aiter_lines():
            if line.startswith("id: "):
                current["id"] = int(line[4:])
            elif line.startswith("event: "):
                current["event"] = line[7:]
            elif line.startswith("data: "):
                current["data"] = json.loads(line[6:])
            elif line == "" and "data" in current:
                events.append(current)
                current = {}
                if len(events) == n:
                    return events
    return events


async def test_the_event_stream_follows_the_log_and_resumes_after_an_id(client, address):
    group = await create_group(client, 2)
    events = await asyncio.wait_for(_read_events(client, 1, params={"group": group}), 30)
    assert [e["event"] for e in events] == ["group_created"]
    assert events[0]["data"]["group"] == group and events[0]["data"]["offset"] == events[0]["id"]
    sim = cluster(address, group, 2)
    await sim.start()  # both ranks' joins go first, in one batch
    try:
        resumed = await asyncio.wait_for(
            _read_events(
                client, 2, params={"group": group}, headers={"Last-Event-ID": str(events[0]["id"])}
            ),
            30,
        )
    finally:
        await sim.stop()
    assert [e["event"] for e in resumed] == ["join", "join"]
    assert resumed[0]["id"] > events[0]["id"]
    assert {e["data"]["rank"] for e in resumed} == {0, 1}
    bad = await client.get("/events/stream", headers={"Last-Event-ID": "yesterday"})
    assert bad.status_code == 422
