"""Bad input: no 5xx, a clear JSON error, and nothing malformed in the log.

Bodies are generated from the server's own OpenAPI document (tests/service/schema_strategies.py), plus
arbitrary JSON and a handful of hand-written malformed requests. Afterwards the log is read back
and folded from scratch: every record decodes, and the fold refuses none of them as malformed.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from foldplane.coordinator.fold.machine import Coordinator
from foldplane.coordinator.fold.registry import all_kinds
from foldplane.eventlog import open_log
from foldplane.wire.codes import status_of
from tests.service.conftest import FAST, make_server, replay
from tests.service.schema_strategies import JSON, from_schema, near_misses

FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
    ],
)
GROUP = "fz"


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory):
    srv = make_server(tmp_path_factory.mktemp("fuzz")).start()
    r = httpx.post(srv.url + "/groups", json={"group": GROUP, "world_size": 4, **FAST})
    assert r.status_code == 201
    with httpx.Client(base_url=srv.url, timeout=30) as client:
        yield srv, client
    srv.stop()


@pytest.fixture(scope="module")
def openapi(fuzz_server) -> dict[str, Any]:
    _, client = fuzz_server
    return client.get("/openapi.json").json()


def _inline(schema: Any, components: dict[str, Any]) -> Any:
    """Resolve ``#/components/schemas/X`` references (the schemas here are not recursive)."""
    if isinstance(schema, dict):
        if "$ref" in schema:
            return _inline(components[schema["$ref"].rsplit("/", 1)[1]], components)
        return {k: _inline(v, components) for k, v in schema.items() if k != "discriminator"}
    if isinstance(schema, list):
        return [_inline(v, components) for v in schema]
    return schema


def request_schema(doc: dict[str, Any], path: str) -> dict[str, Any]:
    body = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return _inline(body, doc["components"]["schemas"])


def check_answer(r: httpx.Response) -> None:
    assert r.status_code < 500, f"{r.request.method} {r.request.url} -> {r.status_code}: {r.text}"
    if r.status_code >= 400:
        body = r.json()
        assert set(body) >= {"error", "detail"}, body
        assert isinstance(body["error"], str) and body["detail"]
        assert r.status_code == status_of(body["error"]), f"{body} answered {r.status_code}"


def _retarget(body: dict[str, Any]) -> dict[str, Any]:
    """Point generated events at the real group, so they get past unknown_group."""
    for event in body.get("events", []):
        event["group"] = GROUP
        event["rank"] = event.get("rank", 0) % 6
    return body


def test_generated_agent_events_never_5xx(fuzz_server, openapi):
    _, client = fuzz_server
    schema = request_schema(openapi, "/agents/events")
    bodies = st.one_of(
        from_schema(schema), from_schema(schema).map(_retarget), near_misses(schema), JSON
    )

    @FUZZ
    @given(bodies)
    def run(body):
        r = client.post("/agents/events", json=body)
        check_answer(r)
        if r.status_code == 200:
            results = r.json()["results"]
            assert isinstance(body, dict) and len(results) == len(body["events"])
            for res in results:
                assert ("offset" in res) or (res["error"] and res["detail"])

    run()


@pytest.mark.parametrize("path", ["/groups", "/proposals", "/agents/deaths"])
def test_generated_operator_bodies_never_5xx(fuzz_server, openapi, path):
    _, client = fuzz_server
    schema = request_schema(openapi, path)
    if path == "/groups":  # keep generated groups small: a 65,536-rank group is valid but slow
        schema["properties"]["world_size"]["maximum"] = 64
    generated = from_schema(schema)
    if path != "/groups":
        generated = st.one_of(generated, generated.map(lambda b: {**b, "group": GROUP}))

    @FUZZ
    @given(st.one_of(generated, near_misses(schema), JSON))
    def run(body):
        r = client.post(path, json=body, params={"wait": 0} if path == "/proposals" else None)
        check_answer(r)

    run()


@FUZZ
@given(
    path=st.sampled_from(
        [
            "/agents/updates",
            "/views/history",
            "/views/current",
            "/events",
            "/proposals/1",
            "/groups/fz",
        ]
    ),
    params=st.dictionaries(
        st.sampled_from(
            [
                "group",
                "rank",
                "ranks",
                "after",
                "timeout",
                "protocol",
                "view",
                "limit",
                "after_version",
                "kind",
            ]
        ),
        st.one_of(st.integers(-5, 2**70), st.text(max_size=12), st.just(GROUP), st.floats()),
        max_size=5,
    ),
)
def test_generated_query_parameters_never_5xx(fuzz_server, path, params):
    _, client = fuzz_server
    if path == "/agents/updates":
        if not isinstance(params.get("timeout"), str):
            params["timeout"] = 0
        params.setdefault("protocol", 2)  # past the protocol check, unless drawn
    check_answer(client.get(path, params={k: str(v) for k, v in params.items()}))


MALFORMED = [
    b"",
    b"not json",
    b"[1, 2, 3]",
    b'{"events": "nope"}',
    b'{"events": [1, "two", null]}',
    b'{"events": [{"type": "heartbeat"}]}',
    b'{"events": [{"type": "teleport", "group": "fz", "rank": 0, "incarnation": "x"}]}',
    b'{"events": [{"type": "heartbeat", "group": "fz", "rank": 1e400, "incarnation": "x"}]}',
    b'{"events": [{"type": "heartbeat", "group": "fz", "rank": 123456789012345678901234567890, "incarnation": "x"}]}',
    b'{"events": [{"type": "links", "group": "fz", "rank": 0, "incarnation": "x", "peers": {"zero": "up"}, "self_ready": true}]}',
    b'{"events": [{"type": "links", "group": "fz", "rank": 0, "incarnation": "x", "self_ready": true, "down": [3, 1]}]}',
    b'{"events": [{"type": "links", "group": "fz", "rank": 0, "incarnation": "x", "self_ready": true, "down": [9]}]}',
    b'{"events": [{"type": "links", "group": "fz", "rank": 0, "incarnation": "x", "self_ready": true, "hint": [[2, 1]]}]}',
    b'{"events": [{"type": "links", "group": "fz", "rank": 0, "incarnation": "x", "self_ready": true, "down": "b64:/w=="}]}',
    b'{"events": [{"type": "links", "group": "fz", "rank": 0, "incarnation": "x", "self_ready": true, "down": "b64:!"}]}',
    b'{"events": [{"type": "links", "group": "fz", "rank": 0, "incarnation": "x", "self_ready": true, "down": {"0": "down"}}]}',
    b'{"events": [{"type": "ack", "group": "../etc", "rank": 0, "incarnation": "x", "version": 1}]}',
    b'{"events": [{"type": "join", "group": "fz", "rank": -1, "incarnation": ""}]}',
    b'\xff\xfe{"events": []}',
    b'{"events": [' + b"[" * 5000 + b"]" * 5000 + b"]}",
]


@pytest.mark.parametrize("body", MALFORMED, ids=range(len(MALFORMED)))
def test_hand_written_malformed_events(fuzz_server, body):
    _, client = fuzz_server
    r = client.post("/agents/events", content=body, headers={"content-type": "application/json"})
    check_answer(r)
    if r.status_code == 200:
        assert all(res.get("error") == "invalid_event" for res in r.json()["results"]), r.text


def test_too_many_events_and_oversized_bodies(fuzz_server):
    _, client = fuzz_server
    event = {"type": "heartbeat", "group": GROUP, "rank": 0, "incarnation": "x"}
    many = client.post("/agents/events", json={"events": [event] * 4097})
    assert many.status_code == 422 and "4096" in many.json()["detail"]
    big = json.dumps({"events": [{**event, "host": "h" * 2_000_000}]}).encode()
    declared = client.post(
        "/agents/events", content=big, headers={"content-type": "application/json"}
    )
    assert declared.status_code == 413
    assert declared.json()["error"] == "body_too_large" and "1048576" in declared.json()["detail"]

    def chunks():
        for i in range(0, len(big), 65536):
            yield big[i : i + 65536]

    # streamed without a Content-Length, through the framework and through the events fast path
    for path in ("/groups", "/agents/events"):
        streamed = client.post(path, content=chunks(), headers={"content-type": "application/json"})
        assert streamed.status_code == 413, path
        assert streamed.json()["error"] == "body_too_large"


def test_the_events_fast_path_reads_a_body_sent_in_pieces(fuzz_server):
    """The fast path reads the body from the ASGI messages itself: a chunked body whose pieces
    split events, and even a JSON token, is read whole and answered like a one-piece body."""
    _, client = fuzz_server
    # a group of its own, so that nothing here changes what the other tests read from GROUP
    assert client.post("/groups", json={"group": "pieces", "world_size": 2}).status_code == 201
    join = {"type": "join", "group": "pieces", "rank": 1, "incarnation": uuid.uuid4().hex}
    body = json.dumps({"events": [join, {**join, "type": "heartbeat"}]}).encode()

    def pieces():
        for i in range(0, len(body), 7):
            yield body[i : i + 7]

    r = client.post(
        "/agents/events", content=pieces(), headers={"content-type": "application/json"}
    )
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert len(results) == 2 and all("offset" in x for x in results), results
    assert results[1]["offset"] > results[0]["offset"]


def test_unknown_things_are_json_404s_and_wrong_methods_405(fuzz_server):
    _, client = fuzz_server
    for r in (
        client.get("/nowhere"),
        client.get("/groups/nope"),
        client.get("/proposals/999999"),
        client.get("/views/current", params={"group": "nope"}),
        client.get(
            "/agents/updates", params={"group": "nope", "rank": 0, "timeout": 0, "protocol": 2}
        ),
    ):
        assert r.status_code == 404, r.text
        check_answer(r)
    wrong_method = client.delete("/proposals/1")
    assert wrong_method.status_code == 405 and wrong_method.headers["allow"] == "GET"
    check_answer(wrong_method)
    for params in ({"rank": 4}, {"ranks": "2-4"}):
        out_of_range = client.get(
            "/agents/updates", params={"group": GROUP, "timeout": 0, "protocol": 2, **params}
        )
        assert out_of_range.status_code == 404, out_of_range.text
        assert out_of_range.json()["error"] == "rank_out_of_range"
        assert "rank 4 is not in 0..3" in out_of_range.json()["detail"]
    bad_config = client.post("/groups", json={"group": "cfg", "world_size": 2, "min_ranks": 3})
    assert bad_config.status_code == 422 and "min_ranks" in bad_config.json()["detail"]
    typo = client.post("/groups", json={"group": "cfg", "world_size": 2, "heartbeat_timeuot_s": 3})
    assert typo.status_code == 422 and "heartbeat_timeuot_s" in typo.json()["detail"]


def test_the_long_poll_fast_path_answers_as_the_documented_route(fuzz_server):
    """``GET /agents/updates`` is served ahead of the framework when its query is plainly well
    formed; an extra parameter (which the route ignores) sends the same request through the
    framework instead, and both must answer alike."""
    _, client = fuzz_server
    cases = [
        {"group": GROUP, "rank": 1, "timeout": 0, "protocol": 2},
        {"group": GROUP, "rank": 1, "after": 2, "timeout": "0.0", "protocol": 2},
        {"group": GROUP, "ranks": "0-1,3", "timeout": 0, "protocol": 2, "view": 0},
        {"group": "nope", "rank": 0, "timeout": 0, "protocol": 2},  # 404
        {"group": GROUP, "rank": 4, "timeout": 0, "protocol": 2},  # 404 rank_out_of_range
        {"group": GROUP, "rank": 1, "timeout": 0, "protocol": 1},  # 400 protocol_mismatch
    ]
    statuses = []
    for params in cases:
        fast = client.get("/agents/updates", params=params)
        framework = client.get("/agents/updates", params={**params, "via": "framework"})
        assert (fast.status_code, fast.json()) == (framework.status_code, framework.json())
        statuses.append(fast.status_code)
    assert statuses == [200, 200, 200, 404, 404, 400]
    # what only the framework words: a missing or malformed parameter
    for params in (
        {"group": GROUP, "rank": -1, "protocol": 2},
        {"group": GROUP, "rank": 1, "timeout": 61, "protocol": 2},
        {"group": GROUP, "ranks": "1;2", "protocol": 2},
        {"group": GROUP, "rank": 1, "protocol": "two"},
    ):
        r = client.get("/agents/updates", params=params)
        assert r.status_code == 422 and r.json()["error"] == "invalid_request", r.text
    # ...and the rule between two parameters: exactly one of rank= and ranks=
    for params in (
        {"group": GROUP, "timeout": 0, "protocol": 2},
        {"group": GROUP, "rank": 1, "ranks": "1-2", "timeout": 0, "protocol": 2},
    ):
        r = client.get("/agents/updates", params=params)
        assert r.status_code == 422 and r.json()["error"] == "invalid_query", r.text
        assert "exactly one of rank= or ranks=" in r.json()["detail"]
    bad_set = client.get(
        "/agents/updates", params={"group": GROUP, "ranks": "3-1", "timeout": 0, "protocol": 2}
    )
    assert bad_set.status_code == 422 and bad_set.json()["error"] == "invalid_query"
    assert "increasing order" in bad_set.json()["detail"]


@pytest.mark.parametrize("protocol", [None, 1, 3])
def test_a_poll_in_another_protocol_is_refused_naming_protocol_2(fuzz_server, protocol):
    _, client = fuzz_server
    params: dict[str, Any] = {"group": GROUP, "rank": 1, "timeout": 0}
    if protocol is not None:
        params["protocol"] = protocol
    r = client.get("/agents/updates", params=params)
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "protocol_mismatch"
    assert "agent protocol 2" in r.json()["detail"]
    said = "none (protocol 1)" if protocol is None else str(protocol)
    assert f"the poll says {said}" in r.json()["detail"]


def test_twin_a_protocol_2_poll_is_answered(fuzz_server):
    _, client = fuzz_server
    r = client.get(
        "/agents/updates", params={"group": GROUP, "rank": 1, "timeout": 0, "protocol": 2}
    )
    assert r.status_code == 200, r.text
    assert set(r.json()) >= {"updates", "next_after", "resync", "store", "term"}


def test_a_protocol_1_links_event_gets_its_own_error_and_a_protocol_2_one_is_accepted(
    fuzz_server,
):
    """An old agent's links report is refused saying why; the rest of its batch is not."""
    _, client = fuzz_server
    assert client.post("/groups", json={"group": "legacy", "world_size": 4}).status_code == 201
    inc = uuid.uuid4().hex
    envelope = {"group": "legacy", "rank": 1, "incarnation": inc}
    join = client.post("/agents/events", json={"events": [{"type": "join", **envelope}]})
    assert join.status_code == 200 and "offset" in join.json()["results"][0], join.text
    old = {"type": "links", **envelope, "peers": {"0": "up", "2": "down"}, "self_ready": True}
    hint_only = {"type": "links", **envelope, "failed_ranks_hint": [2], "self_ready": True}
    new = {"type": "links", **envelope, "down": [2], "self_ready": True, "version": 0}
    r = client.post("/agents/events", json={"events": [old, new, hint_only]})
    assert r.status_code == 200, r.text
    first, second, third = r.json()["results"]
    for legacy in (first, third):
        assert legacy["error"] == "invalid_event" and "offset" not in legacy
        assert "is protocol 1" in legacy["detail"] and "'down' and 'hint'" in legacy["detail"]
    assert "error" not in second and second["offset"] > join.json()["results"][0]["offset"]


def test_the_openapi_document_is_complete(fuzz_server, openapi):
    _, client = fuzz_server
    refs: set[str] = set()

    def walk(node):
        if isinstance(node, dict):
            if "$ref" in node:
                refs.add(node["$ref"].rsplit("/", 1)[1])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(openapi["paths"])
    assert refs <= set(openapi["components"]["schemas"]), refs - set(
        openapi["components"]["schemas"]
    )
    for path in ["/groups", "/proposals", "/agents/events", "/agents/deaths"]:
        assert "requestBody" in openapi["paths"][path]["post"], path
    expected = {
        "/groups",
        "/groups/{group}",
        "/proposals",
        "/proposals/{proposal_id}",
        "/views/current",
        "/views/history",
        "/events",
        "/events/stream",
        "/healthz",
        "/metrics",
        "/agents/events",
        "/agents/updates",
        "/agents/deaths",
    }
    assert expected <= set(openapi["paths"])
    docs = client.get("/docs")
    assert docs.status_code == 200 and "openapi.json" in docs.text


def test_the_openapi_document_states_the_real_error_shape_and_bounds(openapi):
    """What the server answers, not what FastAPI would: every error is an ErrorBody."""
    assert "HTTPValidationError" not in openapi["components"]["schemas"]
    for path, operations in openapi["paths"].items():
        for operation in operations.values():
            for status, response in operation["responses"].items():
                if status[0] in "45":
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (path, status)
            if "requestBody" in operation:
                assert {"400", "413", "415", "422"} <= set(operation["responses"]), path
    kind = next(p for p in openapi["paths"]["/events"]["get"]["parameters"] if p["name"] == "kind")
    assert sorted(kind["schema"]["enum"]) == sorted(all_kinds())
    rank = next(
        p for p in openapi["paths"]["/agents/updates"]["get"]["parameters"] if p["name"] == "rank"
    )
    assert (rank["schema"]["minimum"], rank["schema"]["maximum"]) == (0, 65_535)
    assert "429" in openapi["paths"]["/groups"]["post"]["responses"]


def test_integral_floats_are_integers_and_other_floats_are_not(fuzz_server):
    """JSON Schema's integer admits 3.0, so the server does; 3.5 and "3" stay refused."""
    _, client = fuzz_server
    join = {"type": "join", "group": GROUP, "rank": 2.0, "incarnation": uuid.uuid4().hex}
    r = client.post("/agents/events", json={"events": [join]})
    [result] = r.json()["results"]
    assert "offset" in result, result
    logged = client.get("/events", params={"after": result["offset"] - 1, "limit": 1}).json()
    assert logged["events"][0]["rank"] == 2
    ok = client.post("/agents/deaths", json={"group": GROUP, "rank": 3.0})
    assert ok.status_code == 200, ok.text
    for rank in (3.5, "3"):
        r = client.post("/agents/deaths", json={"group": GROUP, "rank": rank})
        assert r.status_code == 422 and "$.rank" in r.json()["detail"], r.text
        [bad] = client.post("/agents/events", json={"events": [{**join, "rank": rank}]}).json()[
            "results"
        ]
        assert bad["error"] == "invalid_event", bad


def test_an_offset_header_of_unicode_digits_is_a_422(fuzz_server):
    _, client = fuzz_server
    r = client.get("/events/stream", headers={"last-event-id": b"\xb2"})
    assert r.status_code == 422 and r.json()["error"] == "invalid_request", r.text


async def test_the_log_holds_nothing_malformed_after_the_fuzzing(fuzz_server):
    """Runs last in this module: fold everything the fuzzing left in the log."""
    srv, client = fuzz_server
    probe = client.post(
        "/agents/events",
        json={
            "events": [{"type": "join", "group": GROUP, "rank": 0, "incarnation": uuid.uuid4().hex}]
        },
    )
    assert probe.status_code == 200
    log = await open_log(str(srv.db))
    try:
        records = await log.read(0, 100_000)
    finally:
        await log.close()
    assert records, "the fuzzing appended nothing at all"
    fold = Coordinator()
    for rec in records:
        assert rec.kind in all_kinds() and isinstance(rec.payload, dict)
        for effect in fold.step(rec):
            code = getattr(effect, "code", None)
            assert code != "invalid_event", f"malformed record at offset {rec.offset}: {effect}"
    done = replay(srv.db)
    assert done.returncode == 0, done.stdout
