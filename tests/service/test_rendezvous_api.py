"""torchrun's rendezvous over HTTP on both stores (a SQLite file and a real PostgreSQL schema):
the routes the handler calls, the operator token they need, the long poll a round wakes,
hostile bodies (every one a clear error, never a 500, nothing appended), the rounds and the
story, and a restart that restores the job from the log and replays it byte for byte.

The app is the real one over a real ``Host`` (in process, auth on; its ticker appends the
ticks that end a last call); the fold's rules are covered one by one in
tests/fold/test_rendezvous.py, real torchrun in tests/agent/test_torchrun.py."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from foldplane.api.app import create_app
from foldplane.coordinator.auth import Authenticator
from foldplane.coordinator.host.loop import Host
from foldplane.coordinator.host.replay import replay
from foldplane.facets.rendezvous.host import waiters_of
from foldplane.wire.auth import agent_token
from tests.eventlog.conftest import pg_schema
from tests.service.conftest import ROOT

__all__ = ["pg_schema"]  # the fixture, for the PostgreSQL target

SECRET = "rdzv-secret"
OPERATOR = "rdzv-operator"
OP = {"Authorization": f"Bearer {OPERATOR}"}
SETTINGS = {
    "min_nodes": 2,  # the last call starts at the second join: nobody is left out by a slow POST
    "max_nodes": 3,
    "last_call_s": 0.3,
    "join_timeout_s": 60.0,
    "keepalive_timeout_s": 30.0,
}


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def target(request: pytest.FixtureRequest, tmp_path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "log.db")
    from tests.eventlog.conftest import schema_url

    return schema_url(request.getfixturevalue("pg_url"), request.getfixturevalue("pg_schema"))


async def parked(host: Host, job: str) -> None:
    """Until a long poll of ``job`` waits on ``host`` for the job to move (it took its waiter,
    ``JobWaiters``). The request runs in this event loop (``httpx.ASGITransport``) and reaches
    its wait within a few turns of it, without I/O: this yields turns, never wall time, and
    fails if the poll has not parked after 10,000 of them."""
    waiters = waiters_of(host)
    for _ in range(10_000):
        if waiters.waiting(job):
            return
        await asyncio.sleep(0)
    raise AssertionError(f"no long poll of {job} waits")


def client(host: Host) -> httpx.AsyncClient:
    app = create_app(host, Authenticator(operator_token=OPERATOR, secret=SECRET))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


@pytest.fixture
async def api(target: str) -> AsyncIterator[tuple[Host, httpx.AsyncClient]]:
    host = await Host.open(target, heartbeat_flush_s=0)
    try:
        async with client(host) as c:
            yield host, c
    finally:
        await host.close()


def join_body(node: str, attempt: str, port: int, **fields: Any) -> dict[str, Any]:
    return {
        "node": node,
        "attempt": attempt,
        "host": "127.0.0.1",
        "store_port": port,
        "local_world_size": 2,
        "cause": "first",
        "restart_count": 0,
        **SETTINGS,
        **fields,
    }


async def wait_round(c: httpx.AsyncClient, job: str, round_: int) -> dict[str, Any]:
    """Long-poll ``job`` until its round is ``round_`` (bounded)."""
    version = 0
    for _ in range(50):
        r = await c.get(f"/rendezvous/{job}", params={"after": version, "timeout": 5}, headers=OP)
        assert r.status_code == 200, r.text
        body = r.json()
        if body["round"] >= round_:
            return body
        version = body["version"]
    raise AssertionError(f"round {round_} of {job} never formed: {body}")


async def test_a_round_forms_through_http_and_a_restart_forms_the_next_at_once(
    target: str, api: tuple[Host, httpx.AsyncClient]
) -> None:
    host, c = api
    r = await c.post("/rendezvous/train/join", json=join_body("a", "a1", 20001), headers=OP)
    assert r.status_code == 200, r.text
    first = r.json()
    assert first["round"] == 0 and [p["node"] for p in first["waiting"]] == ["a"]
    assert first["last_call_ts"] is None and first["offset"] >= 1  # 1 of min_nodes 2
    r = await c.post("/rendezvous/train/join", json=join_body("b", "b1", 20002), headers=OP)
    assert r.status_code == 200, r.text
    assert r.json()["last_call_ts"] is not None
    # the last call ends 0.3 s after b's join: the host's ticker forms round 1
    formed = await wait_round(c, "train", 1)
    assert [n["node"] for n in formed["nodes"]] == ["a", "b"]
    assert formed["world_size"] == 4 and formed["nodes"][0]["store_port"] == 20001

    # a long poll past the current version waits, and answers at its timeout unchanged
    poll = await c.get(
        "/rendezvous/train", params={"after": formed["version"], "timeout": 0.2}, headers=OP
    )
    assert poll.json()["version"] == formed["version"]

    # b's workers fail: a sees it waiting; a's restart forms round 2 at once (no last call)
    r = await c.post(
        "/rendezvous/train/join",
        json=join_body("b", "b2", 20003, cause="workers_failed", restart_count=1),
        headers=OP,
    )
    assert r.json()["nodes_waiting"] == 1 and r.json()["round"] == 1
    waiting = asyncio.create_task(
        c.get("/rendezvous/train", params={"after": r.json()["version"], "timeout": 10}, headers=OP)
    )
    await parked(host, "train")
    assert not waiting.done()
    r = await c.post(
        "/rendezvous/train/join",
        json=join_body("a", "a2", 20004, cause="nodes_waiting"),
        headers=OP,
    )
    assert r.json()["round"] == 2
    woken = await asyncio.wait_for(waiting, 5)
    assert woken.json()["round"] == 2 and woken.json()["nodes"][0]["node"] == "a"

    # the same join again (its answer lost) is that join: nothing appended
    head = host.machine.offset
    again = await c.post(
        "/rendezvous/train/join",
        json=join_body("a", "a2", 20004, cause="nodes_waiting"),
        headers=OP,
    )
    assert again.status_code == 200 and again.json()["offset"] == r.json()["offset"]
    assert host.machine.offset == head

    keep = await c.post("/rendezvous/train/keepalive", json={"node": "a"}, headers=OP)
    assert keep.status_code == 200 and keep.json()["offset"] > head

    rounds = (await c.get("/rendezvous/train/rounds", headers=OP)).json()
    assert [x["round"] for x in rounds["rounds"]] == [1, 2]
    assert "every live node of round 1 is back" in rounds["rounds"][1]["reason"]
    page = (await c.get("/rendezvous/train/rounds?limit=1", headers=OP)).json()
    assert [x["round"] for x in page["rounds"]] == [1] and page["next_after_round"] == 1

    closed = await c.post(
        "/rendezvous/train/close", json={"node": "a", "reason": "run ended"}, headers=OP
    )
    assert closed.status_code == 200 and closed.json()["closed"]["node"] == "a"
    late = await c.post("/rendezvous/train/join", json=join_body("c", "c1", 20005), headers=OP)
    assert late.status_code == 409 and late.json()["error"] == "rendezvous_closed"
    assert "new --rdzv-id" in late.json()["detail"]

    story = (await c.get("/rendezvous/train/story", headers=OP)).json()
    events = [e["event"] for e in story["entries"]]
    assert events[:4] == ["created", "joined", "joined", "round"]
    assert events.count("round") == 2 and events[-1] == "closed"  # a refusal is never appended
    assert story["keepalives"] == 1 and "round 2" in story["summary"]
    listing = (await c.get("/rendezvous", headers=OP)).json()["rendezvous"]
    assert listing == [
        {"job": "train", "round": 2, "nodes": ["a", "b"], "waiting": 0, "closed": True}
    ]

    # the log alone gives the same rows again, byte for byte
    await host.close()
    report = await replay(target)
    assert report.ok, report.divergences
    told = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "foldplane.coordinator", "explain", target, "--rdzv", "train"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert told.returncode == 0, told.stderr
    assert "round 2" in told.stdout and "joined (workers_failed)" in told.stdout
    assert "every live node of round 1 is back" in told.stdout and "1 heartbeats" in told.stdout
    unknown = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "foldplane.coordinator", "explain", target, "--rdzv", "nope"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert unknown.returncode == 2 and "no rendezvous 'nope'" in unknown.stderr
    again_host = await Host.open(target, heartbeat_flush_s=0)
    try:
        async with client(again_host) as c2:
            body = (await c2.get("/rendezvous/train", headers=OP)).json()
            assert body["round"] == 2 and body["closed"]["reason"] == "run ended"
    finally:
        await again_host.close()


async def test_every_route_needs_the_operator_token(
    api: tuple[Host, httpx.AsyncClient],
) -> None:
    host, c = api
    agent = {"Authorization": f"Bearer {agent_token(SECRET, 'train', 0)}"}
    calls = [
        ("POST", "/rendezvous/j/join", join_body("a", "a1", 20001)),
        ("POST", "/rendezvous/j/keepalive", {"node": "a"}),
        ("POST", "/rendezvous/j/leave", {"node": "a", "reason": "x"}),
        ("POST", "/rendezvous/j/close", {"node": "a", "reason": "x"}),
        ("GET", "/rendezvous/j", None),
        ("GET", "/rendezvous", None),
        ("GET", "/rendezvous/j/rounds", None),
        ("GET", "/rendezvous/j/story", None),
    ]
    for method, path, body in calls:
        none = await c.request(method, path, json=body)
        assert none.status_code == 401, (path, none.text)
        assert "Authorization" in none.json()["detail"]
        wrong = await c.request(method, path, json=body, headers=agent)
        assert wrong.status_code == 403 and "operator token" in wrong.json()["detail"], path
    assert host.machine.offset == 0  # nothing appended


HOSTILE: list[tuple[str, Any, int, str]] = [
    ("/rendezvous/j/join", {**join_body("a", "a1", 1), "store_port": 70000}, 422, "store_port"),
    ("/rendezvous/j/join", {**join_body("a", "a1", 1), "node": "a b"}, 422, "node"),
    ("/rendezvous/j/join", {**join_body("a", "a1", 1), "cause": "boom"}, 422, "cause"),
    ("/rendezvous/j/join", {**join_body("a", "a1", 1), "evil": 1}, 422, "evil"),
    ("/rendezvous/j/join", {**join_body("a", "a1", 1), "last_call_s": -1}, 422, "last_call_s"),
    ("/rendezvous/j/join", {**join_body("a", "a1", 1), "min_nodes": 5}, 422, "max_nodes 3"),
    ("/rendezvous/j/join", {"node": "a"}, 422, "attempt"),
    ("/rendezvous/j/join", [1, 2], 422, "object"),
    ("/rendezvous/j/join", "x" * 10, 422, ""),
    ("/rendezvous/j/keepalive", {"node": "a"}, 404, "no rendezvous 'j'"),
    ("/rendezvous/j/leave", {"node": "a", "reason": ""}, 422, "reason"),
    ("/rendezvous/j/close", {"node": "a", "reason": "r" * 513}, 422, "reason"),
    ("/rendezvous/bad%20id/join", join_body("a", "a1", 1), 422, ""),
    ("/rendezvous/" + "j" * 129 + "/join", join_body("a", "a1", 1), 422, ""),
]


@pytest.mark.parametrize(("path", "body", "status", "words"), HOSTILE)
async def test_hostile_input_is_a_clear_error_and_appends_nothing(
    api: tuple[Host, httpx.AsyncClient], path: str, body: Any, status: int, words: str
) -> None:
    host, c = api
    r = await c.post(path, json=body, headers=OP)
    assert r.status_code == status, r.text
    assert set(r.json()) >= {"error", "detail"} and words in r.json()["detail"]
    assert host.machine.offset == 0


async def test_conflicting_settings_and_gone_nodes_are_refused_naming_why(
    api: tuple[Host, httpx.AsyncClient],
) -> None:
    host, c = api
    assert (
        await c.post("/rendezvous/j/join", json=join_body("a", "a1", 1), headers=OP)
    ).status_code == 200
    conflict = await c.post(
        "/rendezvous/j/join", json=join_body("b", "b1", 2, max_nodes=4), headers=OP
    )
    assert conflict.status_code == 409 and conflict.json()["error"] == "rendezvous_conflict"
    assert "max_nodes 4 (the rendezvous has 3)" in conflict.json()["detail"]
    left = await c.post("/rendezvous/j/leave", json={"node": "a", "reason": "bye"}, headers=OP)
    assert left.status_code == 200 and left.json()["left"][0]["node"] == "a"
    gone = await c.post("/rendezvous/j/keepalive", json={"node": "a"}, headers=OP)
    assert gone.status_code == 409 and gone.json()["error"] == "node_gone"
    assert "it left: bye" in gone.json()["detail"]
    unknown = await c.get("/rendezvous/nope", headers=OP)
    assert unknown.status_code == 404 and unknown.json()["error"] == "unknown_rendezvous"
    bad_poll = await c.get("/rendezvous/j", params={"after": -1}, headers=OP)
    assert bad_poll.status_code == 422
    long_poll = await c.get("/rendezvous/j", params={"after": 0, "timeout": 61}, headers=OP)
    assert long_poll.status_code == 422


@pytest.mark.parametrize("how", ["stop_waiting", "close"])
async def test_a_long_poll_ends_when_the_coordinator_drains_or_closes(
    target: str, how: str
) -> None:
    host = await Host.open(target, heartbeat_flush_s=0)
    try:
        async with client(host) as c:
            # min_nodes 2: a lone node's job does not move by itself
            body = join_body("a", "a1", 1, min_nodes=2, max_nodes=2)
            r = await c.post("/rendezvous/j/join", json=body, headers=OP)
            version = r.json()["version"]
            poll = asyncio.create_task(
                c.get("/rendezvous/j", params={"after": version, "timeout": 30}, headers=OP)
            )
            await parked(host, "j")
            assert not poll.done()  # the twin: nothing moved, it waits
            if how == "close":
                closing = asyncio.create_task(host.close())
            else:
                host.stop_waiting()
            answer = await asyncio.wait_for(poll, 5)
            assert answer.status_code == 200 and answer.json()["version"] == version
            if how == "close":
                await closing
    finally:
        with contextlib.suppress(Exception):
            await host.close()
