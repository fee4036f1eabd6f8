"""Refits over HTTP on both stores (a SQLite file and a real PostgreSQL schema): the operator's
routes, the workers' events with their own agent tokens, every gate and review finding where a
request meets it, hostile bodies, and a restart that restores the refit from the log.

The app is the real one over a real ``Host`` (in process, auth on); the fold's rules are
covered one by one in tests/fold/test_refits.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from foldplane.api.app import create_app
from foldplane.coordinator.auth import Authenticator
from foldplane.coordinator.host.loop import Host
from foldplane.wire.auth import agent_token
from tests.eventlog.conftest import pg_schema
from tests.service.conftest import FAST

__all__ = ["pg_schema"]  # the fixture, for the PostgreSQL target

SECRET = "refit-secret"
OPERATOR = "refit-operator"
OP = {"Authorization": f"Bearer {OPERATOR}"}
D1 = "1" * 64
D2 = "2" * 64
SLOTS = {"train": 2, "gen": 4}


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def target(request: pytest.FixtureRequest, tmp_path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "log.db")
    from tests.eventlog.conftest import schema_url

    return schema_url(request.getfixturevalue("pg_url"), request.getfixturevalue("pg_schema"))


def client(host: Host) -> httpx.AsyncClient:
    app = create_app(host, Authenticator(operator_token=OPERATOR, secret=SECRET))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


async def send(c: httpx.AsyncClient, group: str, rank: int, kind: str, **fields: Any) -> dict:
    """One event of ``group``/``rank`` with that rank's own token; its result."""
    event = {"type": kind, "group": group, "rank": rank, "incarnation": f"{group}-{rank}"}
    headers = {"Authorization": f"Bearer {agent_token(SECRET, group, rank)}"}
    r = await c.post("/agents/events", json={"events": [{**event, **fields}]}, headers=headers)
    assert r.status_code == 200, r.text
    return r.json()["results"][0]


async def form(c: httpx.AsyncClient, group: str, size: int) -> None:
    r = await c.post("/groups", json={"group": group, "world_size": size, **FAST}, headers=OP)
    assert r.status_code == 201, r.text
    for rank in range(size):
        assert "offset" in await send(c, group, rank, "join")
    for rank in range(size):
        assert "offset" in await send(c, group, rank, "links", self_ready=True)
    change = (await c.get(f"/groups/{group}")).json()["change_in_flight"]
    for rank in range(size):
        assert "offset" in await send(c, group, rank, "ack", version=change["version"])
    assert (await c.get(f"/groups/{group}")).json()["view"]["version"] == 1


@pytest.fixture
async def api(target: str) -> AsyncIterator[tuple[Host, httpx.AsyncClient]]:
    host = await Host.open(target, heartbeat_flush_s=0)
    try:
        async with client(host) as c:
            await form(c, "train", 2)
            await form(c, "gen", 4)
            await form(c, "other", 2)
            yield host, c
    finally:
        await host.close()


@contextlib.asynccontextmanager
async def restarted(host: Host, target: str) -> AsyncIterator[httpx.AsyncClient]:
    """``host`` closed, and a new coordinator opened on the same log: a client of it."""
    await host.close()
    again = await Host.open(target, heartbeat_flush_s=0)
    try:
        async with client(again) as c:
            yield c
    finally:
        await again.close()


REFIT = {
    "refit": "rl",
    "publisher": "train",
    "subscriber": "gen",
    "publisher_slots": 2,
    "subscriber_slots": 4,
    "lanes": 2,
}


async def refit(c: httpx.AsyncClient) -> dict:
    r = await c.get("/refits/rl")
    assert r.status_code == 200, r.text
    return r.json()


async def join_all(c: httpx.AsyncClient, epoch: int, digest: str = D1) -> list[dict]:
    out = []
    for group, n in SLOTS.items():
        for rank in range(n):
            out.append(
                await send(
                    c, group, rank, "refit_join", refit="rl", epoch=epoch, slot=rank, digest=digest
                )
            )
    return out


async def test_a_refit_through_http_admits_publishes_transfers_and_survives_a_restart(
    target: str, api: tuple[Host, httpx.AsyncClient]
) -> None:
    host, c = api
    # only the operator declares refits; the same definition again is the same refit
    agent = {"Authorization": f"Bearer {agent_token(SECRET, 'train', 0)}"}
    assert (await c.post("/refits", json=REFIT, headers=agent)).status_code == 403
    assert (await c.post("/refits", json=REFIT)).status_code == 401
    created = await c.post("/refits", json=REFIT, headers=OP)
    assert created.status_code == 201, created.text
    assert (await c.post("/refits", json=REFIT, headers=OP)).status_code == 200
    conflict = await c.post("/refits", json={**REFIT, "lanes": 3}, headers=OP)
    assert conflict.status_code == 409 and "lanes" in conflict.json()["detail"]
    body = created.json()
    assert (body["epoch"], body["status"]) == (1, "waiting")
    assert len(body["missing"]) == 6

    results = await join_all(c, 1)
    assert all("offset" in r for r in results), results
    body = await refit(c)
    assert body["status"] == "admitted" and body["digest"] == D1
    assert [m["refit_rank"] for m in body["members"]] == [0, 1, 2, 3, 4, 5]

    # the bootstrap: refit rank 0's, delivered to members' own journals, never in a status
    b = await send(
        c,
        "train",
        0,
        "refit_bootstrap",
        refit="rl",
        epoch=1,
        bootstrap={"store": "127.0.0.1:1234", "prefix": "rl/1"},
    )
    assert "offset" in b, b
    assert "127.0.0.1:1234" not in (await c.get("/refits/rl")).text
    polled = await c.get(
        "/agents/updates",
        params={"group": "gen", "rank": 3, "timeout": 0, "protocol": 2},
        headers={"Authorization": f"Bearer {agent_token(SECRET, 'gen', 3)}"},
    )
    kinds = [u["type"] for u in polled.json()["updates"]]
    assert "refit_epoch" in kinds and "refit_bootstrap" in kinds
    boot = next(u for u in polled.json()["updates"] if u["type"] == "refit_bootstrap")
    assert boot["bootstrap"]["store"] == "127.0.0.1:1234"
    outsider = await c.get(
        "/agents/updates",
        params={"group": "other", "rank": 0, "timeout": 0, "protocol": 2},
        headers={"Authorization": f"Bearer {agent_token(SECRET, 'other', 0)}"},
    )
    assert "127.0.0.1:1234" not in outsider.text

    # a transfer, idempotent by key; every member reports done; then it is final
    t = await c.post("/refits/rl/transfers", json={"key": "step-10"}, headers=OP)
    assert t.status_code == 201, t.text
    again = await c.post("/refits/rl/transfers", json={"key": "step-10"}, headers=OP)
    assert again.status_code == 200
    [transfer] = again.json()["transfers"]
    assert (transfer["id"], transfer["attempt"], transfer["status"]) == (1, 1, "running")
    for group, n in SLOTS.items():
        for rank in range(n):
            res = await send(
                c,
                group,
                rank,
                "transfer_status",
                refit="rl",
                epoch=1,
                transfer=1,
                attempt=1,
                status="done",
            )
            assert "offset" in res, res
    assert (await refit(c))["transfers"][0]["status"] == "completed"
    late = await send(
        c,
        "gen",
        0,
        "transfer_status",
        refit="rl",
        epoch=1,
        transfer=1,
        attempt=1,
        status="failed",
        detail="late",
    )
    assert late["error"] == "transfer_final"

    # the coordinator restarts: the refit is the log's
    before = await refit(c)
    async with restarted(host, target) as c2:
        assert await refit(c2) == before
        listed = (await c2.get("/refits")).json()["refits"]
        assert listed == [
            {"refit": "rl", "epoch": 1, "status": "admitted", "cause": "the refit was created"}
        ]


async def updates(c: httpx.AsyncClient, group: str, rank: int) -> list[dict]:
    polled = await c.get(
        "/agents/updates",
        params={"group": group, "rank": rank, "timeout": 0, "protocol": 2},
        headers={"Authorization": f"Bearer {agent_token(SECRET, group, rank)}"},
    )
    assert polled.status_code == 200, polled.text
    return polled.json()["updates"]


async def test_a_bootstrap_offered_with_the_join_arrives_with_the_admission_and_only_there(
    target: str, api: tuple[Host, httpx.AsyncClient]
) -> None:
    host, c = api
    assert (await c.post("/refits", json=REFIT, headers=OP)).status_code == 201
    boot = {"store": "127.0.0.1:4321", "prefix": "offered", "backend": "gloo"}
    join = {"refit": "rl", "epoch": 1, "digest": D1}
    # only publisher slot 0 offers one, and only a flat, small one (the wire type refuses the rest)
    res = await send(c, "gen", 0, "refit_join", slot=0, bootstrap=boot, **join)
    assert res["error"] == "not_refit_member" and "only refit rank 0" in res["detail"], res
    for bad in ({"k": "v" * 2000}, {"a": {"b": "c"}}, {f"k{i}": i for i in range(40)}):
        res = await send(c, "train", 0, "refit_join", slot=0, bootstrap=bad, **join)
        assert res["error"] == "invalid_event", res
    assert "offset" in await send(c, "train", 0, "refit_join", slot=0, bootstrap=boot, **join)
    assert (await refit(c))["bootstrap_published"] is False
    assert not [u for u in await updates(c, "train", 0) if u["type"] == "refit_bootstrap"]

    for group, n in SLOTS.items():
        for rank in range(n):
            if (group, rank) != ("train", 0):
                res = await send(c, group, rank, "refit_join", slot=rank, **join)
                assert "offset" in res, res
    got = await updates(c, "gen", 3)
    [admitted] = [u for u in got if u["type"] == "refit_epoch" and u["status"] == "admitted"]
    [published] = [u for u in got if u["type"] == "refit_bootstrap"]
    assert published["offset"] == admitted["offset"]  # one step: no round trip in between
    assert published["bootstrap"] == boot
    status = await c.get("/refits/rl")
    assert status.json()["bootstrap_published"] is True and "4321" not in status.text
    assert "4321" not in json.dumps(await updates(c, "other", 0))
    # the coordinator restarts: the log re-derives the same refit
    before = await refit(c)
    async with restarted(host, target) as c2:
        assert await refit(c2) == before


async def test_both_publishers_starting_a_transfer_at_once_start_one_attempt(
    api: tuple[Host, httpx.AsyncClient],
) -> None:
    host, c = api
    assert (await c.post("/refits", json=REFIT, headers=OP)).status_code == 201
    await join_all(c, 1)
    starts = [
        {"type": "transfer", "group": "train", "rank": rank, "incarnation": f"train-{rank}"}
        | {"refit": "rl", "epoch": 1, "key": "step-1"}
        for rank in range(2)
    ]
    r = await c.post("/agents/events", json={"events": starts}, headers=OP)  # one submission
    assert r.status_code == 200, r.text
    first, second = r.json()["results"]
    assert first["offset"] == second["offset"], (first, second)  # the second repeats the first
    [transfer] = (await refit(c))["transfers"]
    assert (transfer["key"], transfer["attempt"], transfer["status"]) == ("step-1", 1, "running")


async def test_a_subscriber_may_not_start_a_transfer_a_publisher_and_the_operator_may(
    api: tuple[Host, httpx.AsyncClient],
) -> None:
    host, c = api
    assert (await c.post("/refits", json=REFIT, headers=OP)).status_code == 201
    await join_all(c, 1)
    res = await send(c, "gen", 0, "transfer", refit="rl", epoch=1, key="step-1")
    assert res["error"] == "not_refit_member", res
    assert (
        "a transfer comes from a publisher of the admitted epoch or the operator" in res["detail"]
    )
    assert (await refit(c))["transfers"] == []
    assert "offset" in await send(c, "train", 1, "transfer", refit="rl", epoch=1, key="step-1")
    t = await c.post("/refits/rl/transfers", json={"key": "step-1"}, headers=OP)
    assert t.status_code == 200, t.text  # the same key: the running transfer


async def test_a_transfer_after_a_readiness_timeout_names_the_slots_that_never_joined(
    api: tuple[Host, httpx.AsyncClient],
) -> None:
    host, c = api
    body = {**REFIT, "refit": "rt", "readiness_timeout_s": 0.2}
    assert (await c.post("/refits", json=body, headers=OP)).status_code == 201
    for group, rank in (("train", 0), ("train", 1), ("gen", 0), ("gen", 1)):
        fields = {"refit": "rt", "epoch": 1, "slot": rank, "digest": D1}
        assert "offset" in await send(c, group, rank, "refit_join", **fields)
    # The readiness deadline passes on the coordinator's own clock (its ticker appends the
    # tick), which no route announces: the status is read every 20 ms, 500 times at most.
    for _ in range(500):
        status = (await c.get("/refits/rt")).json()
        if status["status"] == "timed_out":
            break
        await asyncio.sleep(0.02)
    assert status["status"] == "timed_out", status
    t = await c.post("/refits/rt/transfers", json={"key": "k"}, headers=OP)
    assert t.status_code == 409 and t.json()["error"] == "refit_not_ready", t.text
    detail = t.json()["detail"]
    assert "subscriber slot 2, subscriber slot 3 never joined" in detail, detail


async def test_the_review_findings_are_refused_where_a_request_meets_them(
    api: tuple[Host, httpx.AsyncClient],
) -> None:
    host, c = api
    assert (await c.post("/refits", json=REFIT, headers=OP)).status_code == 201
    # a wrong group's token: forbidden before the fold sees it
    wrong = {"Authorization": f"Bearer {agent_token(SECRET, 'other', 0)}"}
    event = {
        "type": "refit_join",
        "group": "gen",
        "rank": 0,
        "incarnation": "gen-0",
        "refit": "rl",
        "epoch": 1,
        "slot": 0,
        "digest": D1,
    }
    r = await c.post("/agents/events", json={"events": [event]}, headers=wrong)
    assert r.json()["results"][0]["error"] == "forbidden"
    # a rank of another group, with its own good token
    res = await send(c, "other", 0, "refit_join", refit="rl", epoch=1, slot=0, digest=D1)
    assert res["error"] == "not_refit_member" and "'other'" in res["detail"]
    # an invalid slot, a taken slot
    res = await send(c, "gen", 1, "refit_join", refit="rl", epoch=1, slot=9, digest=D1)
    assert res["error"] == "invalid_slot"
    assert "offset" in await send(c, "gen", 0, "refit_join", refit="rl", epoch=1, slot=0, digest=D1)
    res = await send(c, "gen", 1, "refit_join", refit="rl", epoch=1, slot=0, digest=D1)
    assert res["error"] == "invalid_slot" and "held by rank 0" in res["detail"]
    # a digest that disagrees names who holds the other one
    res = await send(c, "gen", 1, "refit_join", refit="rl", epoch=1, slot=1, digest=D2)
    assert res["error"] == "digest_mismatch" and "subscriber slot 0 (gen rank 0)" in res["detail"]
    # an epoch that is not the refit's
    res = await send(c, "gen", 1, "refit_join", refit="rl", epoch=7, slot=1, digest=D1)
    assert res["error"] == "stale_refit_epoch"
    # a transfer before admission
    t = await c.post("/refits/rl/transfers", json={"key": "k"}, headers=OP)
    assert t.status_code == 409 and t.json()["error"] == "refit_not_ready"
    # unknown names
    assert (await c.get("/refits/nope")).json()["error"] == "unknown_refit"
    assert (await c.post("/refits/nope/restart", json={}, headers=OP)).status_code == 404


@pytest.mark.parametrize(
    "body",
    [
        {**REFIT, "lanes": 0},
        {**REFIT, "subscriber_slots": -4},
        {**REFIT, "readiness_timeout_s": 0},
        {**REFIT, "readiness_timeout_s": -5},
        {**REFIT, "transfer_timeout_s": 1e300},
        {**REFIT, "publisher_slots": "２"},  # a non-ASCII digit
        {**REFIT, "refit": "名前"},
        {**REFIT, "digest": "Z" * 64},
        {
            **REFIT,
            "extra": {
                "a": [
                    [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]
                ]
            },
        },
        {k: v for k, v in REFIT.items() if k != "subscriber"},
    ],
)
async def test_hostile_refit_bodies_get_a_422_and_change_nothing(
    api: tuple[Host, httpx.AsyncClient], body: dict
) -> None:
    host, c = api
    head = host.machine.offset
    r = await c.post("/refits", json=body, headers=OP)
    deep = "extra" in body
    assert r.status_code == (400 if deep else 422), r.text
    assert r.json()["error"] == ("nesting_too_deep" if deep else "invalid_request")
    assert (await c.get("/refits")).json()["refits"] == []
    assert host.machine.offset == head


async def test_a_huge_bootstrap_or_a_deep_one_is_refused_and_the_epoch_keeps_none(
    api: tuple[Host, httpx.AsyncClient],
) -> None:
    host, c = api
    assert (await c.post("/refits", json=REFIT, headers=OP)).status_code == 201
    await join_all(c, 1)

    def nested(depth: int) -> Any:
        value: Any = "x"
        for _ in range(depth):
            value = {"a": value}
        return value

    for bootstrap in ({"k": "v" * 2000}, nested(8), {f"k{i}": i for i in range(40)}):
        res = await send(c, "train", 0, "refit_bootstrap", refit="rl", epoch=1, bootstrap=bootstrap)
        assert res["error"] == "invalid_event", res
    # nested past the body's depth limit, the whole request is refused before any event is read
    event = {
        "type": "refit_bootstrap",
        "group": "train",
        "rank": 0,
        "incarnation": "train-0",
        "refit": "rl",
        "epoch": 1,
        "bootstrap": nested(50),
    }
    headers = {"Authorization": f"Bearer {agent_token(SECRET, 'train', 0)}"}
    r = await c.post("/agents/events", json={"events": [event]}, headers=headers)
    assert r.status_code == 400 and r.json()["error"] == "nesting_too_deep"
    assert (await refit(c))["bootstrap_published"] is False


async def test_a_refit_s_story_over_http_is_the_one_explain_prints(
    target: str, api: tuple[Host, httpx.AsyncClient]
) -> None:
    import msgspec

    from foldplane.facets.refits.models import RefitStoryBody
    from foldplane.facets.refits.story import refit_story_of

    host, c = api
    assert (await c.post("/refits", json=REFIT, headers=OP)).status_code == 201
    await join_all(c, 1)
    started = await c.post("/refits/rl/transfers", json={"key": "step-1"}, headers=OP)
    assert started.status_code == 201, started.text
    for group, n in SLOTS.items():
        for rank in range(n):
            await send(c, group, rank, "transfer_status", refit="rl", epoch=1, transfer=1,
                       attempt=1, status="done")  # fmt: skip
    assert (await c.get("/refits/rl/story")).status_code == 401
    r = await c.get("/refits/rl/story", headers=OP)
    assert r.status_code == 200, r.text
    story = r.json()
    msgspec.convert(story, RefitStoryBody)  # the shape the OpenAPI document states
    assert story == await refit_story_of(host.log, "rl", until=host.applied_offset)
    events = [e["event"] for e in story["entries"]]
    assert events[:3] == ["refit_created", "refit_epoch", "refit_join"]
    assert events.count("transfer_status") == 6 and events[-1] == "transfer"
    assert story["entries"][-1]["status"] == "completed"
    assert story["summary"].startswith("refit 'rl' (train -> gen) is at epoch 1, admitted")
    early = await c.get(
        "/refits/rl/story", params={"until": story["entries"][1]["offset"]}, headers=OP
    )
    assert [e["event"] for e in early.json()["entries"]] == ["refit_created", "refit_epoch"]
    missing = await c.get("/refits/nope/story", headers=OP)
    assert missing.status_code == 404 and missing.json()["error"] == "unknown_refit"
