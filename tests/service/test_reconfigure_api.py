"""torch's reconfigure through ``POST /proposals`` on a real server (docs/reconfigure.md): the
members' calls make one proposal and one view, ``replay`` reproduces it, the story names who
called, and bad or hostile calls get a clear error (never a 5xx) and leave the log whole.

The ranks are simulated agent hosts (``agent.simhost``: the real ``AgentMachine`` per rank over
HTTP), which ACK the view change as real agents do.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from foldplane.agent.simhost import SimulatedCluster
from foldplane.wire.auth import agent_token
from foldplane.wire.codes import status_of
from tests.service.conftest import make_server, replay
from tests.service.test_scenarios import HEARTBEAT_S, create_group, on_version

SECRET = "reconfigure-secret"
OPERATOR = "reconfigure-operator"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = make_server(
        tmp_path_factory.mktemp("reconfigure"),
        env={"FOLDPLANE_SECRET": SECRET, "FOLDPLANE_TOKEN": OPERATOR},
    )
    try:
        srv.start()
        yield srv
    finally:
        srv.stop()


@pytest.fixture
async def client(server) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"authorization": f"Bearer {OPERATOR}"}
    async with httpx.AsyncClient(base_url=server.url, timeout=30, headers=headers) as c:
        yield c


@pytest.fixture
def address(server) -> tuple[str, int]:
    return ("127.0.0.1", server.port)


async def formed(client: httpx.AsyncClient, address: tuple[str, int], n: int) -> SimulatedCluster:
    """A group of ``n`` simulated ranks, each with its own agent token, formed."""
    group = await create_group(client, n)
    tokens = {r: agent_token(SECRET, group, r) for r in range(n)}
    sim = SimulatedCluster(address, group, n, heartbeat_interval_s=HEARTBEAT_S, tokens=tokens)
    await sim.start()
    await on_version(sim, 1)
    return sim


def inc(sim: SimulatedCluster, rank: int) -> str:
    return sim.machine(rank).config.incarnation


def body(sim: SimulatedCluster, caller: int, uuid: int, ranks: list[int], **kw: Any) -> dict:
    return {
        "group": sim.group,
        "op": "reconfigure",
        "ranks": ranks,
        "incarnations": [inc(sim, r) for r in ranks],
        "uuid": uuid,
        "caller": caller,
        **kw,
    }


def as_rank(sim: SimulatedCluster, rank: int) -> dict[str, str]:
    return {"authorization": f"Bearer {agent_token(SECRET, sim.group, rank)}"}


async def call(
    client: httpx.AsyncClient,
    sim: SimulatedCluster,
    caller: int,
    uuid: int,
    ranks: list[int],
    *,
    wait: float = 0,
    **kw: Any,
) -> httpx.Response:
    """Rank ``caller``'s own call, with its own agent token."""
    return await client.post(
        "/proposals",
        params={"wait": wait},
        json=body(sim, caller, uuid, ranks, **kw),
        headers=as_rank(sim, caller),
    )


def clear_error(r: httpx.Response, status: int, code: str, *words: str) -> None:
    assert r.status_code == status, r.text
    err = r.json()
    assert err["error"] == code and status_of(code) == status, err
    for w in words:
        assert w in err["detail"], (w, err["detail"])


async def test_the_members_calls_commit_one_view_that_replay_and_the_story_show(
    client, address, server
):
    sim = await formed(client, address, 3)
    try:
        first = await call(client, sim, 0, 41, [2, 0, 1])
        assert first.status_code == 202, first.text
        pid = first.json()["id"]
        assert first.json()["callers"] == [0]
        second = await call(client, sim, 2, 41, [2, 0, 1], call="rank-2-call")
        assert second.status_code == 202 and second.json()["id"] == pid
        assert second.json()["callers"] == [0, 2]
        last = await call(client, sim, 1, 41, [2, 0, 1], wait=15)
        assert last.status_code == 200, last.text
        p = last.json()
        assert (p["id"], p["status"], p["version"], p["callers"]) == (pid, "applied", 2, [0, 2, 1])
        assert p["ranks"] == [2, 0, 1] and p["uuid"] == 41
        view = await on_version(sim, 2)
        assert view.cause["kind"] == "reconfigure"
        assert view.cause["uuid"] == 41 and view.cause["order"] == [2, 0, 1]
        # the same call sent again (a lost answer) is answered with the proposal, appending
        # nothing; another call of a member with that uuid is a reused uuid
        head = (await client.get("/events", params={"limit": 1000})).json()["next_after"]
        again = await call(client, sim, 2, 41, [2, 0, 1], call="rank-2-call")
        assert again.status_code == 200 and again.json()["id"] == pid
        assert again.json()["calls"] == [None, "rank-2-call", None]
        clear_error(
            await call(client, sim, 2, 41, [2, 0, 1], call="rank-2-later"),
            409,
            "reconfigure_uuid_used",
            "rank 2 already called reconfigure uuid 41",
        )
        assert (await client.get("/events", params={"after": head, "kind": "proposal"})).json()[
            "events"
        ] == []
        # the log says who reconfigured: each member's call is a record
        events = (
            await client.get("/events", params={"group": sim.group, "kind": "proposal"})
        ).json()["events"]
        assert [(e["payload"]["caller"], e["payload"]["proposer"]) for e in events] == [
            (0, "rank:0"),
            (2, "rank:2"),
            (1, "rank:1"),
        ]
        story = (await client.get(f"/groups/{sim.group}/ranks/1/story")).json()
        told = [e for e in story["entries"] if e.get("uuid") == 41]
        assert [e["callers"] for e in told] == [[0], [0, 2], [0, 2, 1], [0, 2, 1]]
        assert "reconfigure uuid 41 to members [2, 0, 1] (in that order)" in told[0]["reason"]
        assert told[-1]["status"] == "applied"
        # a shrink: rank 1 is left out, does not call, and the view names the order
        await call(client, sim, 2, 42, [2, 0])
        shrunk = await call(client, sim, 0, 42, [2, 0], wait=15)
        assert shrunk.json()["status"] == "applied", shrunk.text
        view = await on_version(sim, 3)
        assert view.active_ranks == (0, 2) and view.cause["order"] == [2, 0]
    finally:
        await sim.stop()
    done = replay(server.db, "--json", "--group", sim.group)
    assert done.returncode == 0, done.stderr
    views = json.loads(done.stdout)["views"]
    assert [(v["version"], v["cause"]["kind"], v["cause"].get("uuid")) for v in views] == [
        (1, "formation", None),
        (2, "reconfigure", 41),
        (3, "reconfigure", 42),
    ]


async def test_bad_and_hostile_calls_get_clear_errors_and_leave_the_log_whole(
    client, address, server
):
    sim = await formed(client, address, 3)
    try:
        ok = await call(client, sim, 0, 7, [0, 1, 2], timeout_s=120.0)
        assert ok.status_code == 202, ok.text
        head = (await client.get("/events", params={"limit": 1000})).json()["next_after"]

        def raw(payload: dict, rank: int | None = None):
            headers = as_rank(sim, rank) if rank is not None else {}
            return client.post("/proposals", json=payload, headers=headers)

        good = body(sim, 1, 7, [0, 1, 2])
        # malformed: the request's own shape
        for payload, words in [
            ({k: v for k, v in good.items() if k != "uuid"}, "a reconfigure needs uuid"),
            ({k: v for k, v in good.items() if k != "incarnations"}, "incarnations"),
            ({**good, "uuid": 2**64}, "uuid"),
            ({**good, "uuid": "7"}, "uuid"),
            ({**good, "caller": -1}, "caller"),
            ({**good, "incarnations": ["x" * 200, "y", "z"]}, "incarnations"),
            ({**good, "timeout_s": 0}, "timeout_s"),
            ({**good, "idempotency_key": "k"}, "no idempotency_key"),
            ({"group": sim.group, "op": "activate", "ranks": [1], "uuid": 3}, "uuid belong"),
            ({**good, "op": "reshape"}, "op"),
            ({**good, "call": ""}, "call"),
        ]:
            r = await raw(payload)
            assert r.status_code == 422, (payload, r.text)
            assert r.json()["error"] == "invalid_request" and words in r.json()["detail"], r.text
        # well-formed, refused by the fold: never logged
        clear_error(
            await raw({**good, "incarnations": [inc(sim, 0), "x", inc(sim, 2)]}, 1),
            409,
            "stale_incarnation",
            f"rank 1 is now incarnation {inc(sim, 1)}",
        )
        clear_error(
            await raw(body(sim, 2, 8, [0, 1]), 2), 422, "invalid_event", "caller 2 is not one"
        )
        clear_error(
            await raw(body(sim, 1, 7, [1, 0, 2]), 1),
            409,
            "idempotency_conflict",
            "already names proposal",
        )
        clear_error(await raw({**good, "ranks": [0, 1, 5]}, 1), 409, "idempotency_conflict", "5 as")
        # an agent calls only for its own rank; a foreign group's token is refused
        clear_error(await raw(good, 2), 403, "forbidden", "may not call reconfigure for rank 1")
        other = {"authorization": f"Bearer {agent_token(SECRET, 'elsewhere', 1)}"}
        r = await client.post("/proposals", json=good, headers=other)
        clear_error(r, 403, "forbidden")
        clear_error(await raw({**good, "group": "nope"}), 404, "unknown_group")
        assert (await client.get("/events", params={"after": head, "kind": "proposal"})).json()[
            "events"
        ] == []
        for r in (1, 2):
            assert (await call(client, sim, r, 7, [0, 1, 2])).status_code in (200, 202)
        await on_version(sim, 2)
        clear_error(
            await call(client, sim, 0, 7, [0]),
            409,
            "reconfigure_uuid_used",
            "applied in version 2",
        )
        # well-formed but invalid: logged and rejected, so audits see it
        dup = await call(client, sim, 1, 9, [1, 1], wait=10)
        assert dup.status_code == 200 and dup.json()["status"] == "rejected"
        assert "named more than once" in dup.json()["reason"]
        far = {**body(sim, 1, 10, [1]), "ranks": [1, 5], "incarnations": [inc(sim, 1), "x"]}
        out = await client.post(
            "/proposals", params={"wait": 10}, json=far, headers=as_rank(sim, 1)
        )
        assert out.status_code == 200 and out.json()["status"] == "rejected", out.text
        assert "ranks [5] are not in 0..2" in out.json()["reason"]
        # the uuid of a proposal that is over cannot be used again
        clear_error(
            await call(client, sim, 0, 9, [0]), 409, "reconfigure_uuid_used", "already used"
        )
    finally:
        await sim.stop()
    done = replay(server.db, "--group", sim.group)
    assert done.returncode == 0, done.stdout + done.stderr
