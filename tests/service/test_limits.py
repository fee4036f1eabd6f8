"""The server's limits (api/limits.py), each refused over it and still serving under it.

Every test here is a twin: the attack a limit exists for is refused with the JSON error that
names the limit, and an honest request of the same kind is still served. The servers are real
``python -m coordinator serve`` processes on 127.0.0.1, configured by flags and environment.
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foldplane.agent.simhost import SimulatedCluster
from foldplane.api.codec import check_depth
from foldplane.api.errors import ApiError
from tests.service.conftest import FAST, make_server

BODY_PATHS = ["/agents/events", "/proposals", "/agents/deaths", "/groups"]


def _error(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, f"{r.request.method} {r.request.url}: {r.status_code} {r.text}"
    body = r.json()
    assert set(body) >= {"error", "detail"} and body["error"] == code, body
    return body


# -- nesting depth ------------------------------------------------------------------------------


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    return 0


_TEXT = st.text(alphabet=st.sampled_from('ab"\\[]{}\u00e9'), max_size=6)


def _nested(leaves: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
        max_leaves=40,
    )


@settings(max_examples=300, deadline=None)
@given(
    value=_nested(st.none() | st.integers() | _TEXT),
    chain=st.integers(0, 12),
    limit=st.integers(4, 10),
)
def test_the_depth_check_agrees_with_the_depth_of_the_decoded_value(value, chain, limit):
    """Strings full of brackets, quotes and escapes do not fool it, in either direction."""
    for _ in range(chain):  # a deep spine, so that the limit is crossed often
        value = [value, "]}"]
    body = json.dumps(value, ensure_ascii=False).encode()
    deep = _depth(value) > limit
    try:
        check_depth(body, limit)
    except ApiError as exc:
        assert deep and exc.status == 400 and exc.code == "nesting_too_deep", exc.detail
    else:
        assert not deep, f"depth {_depth(value)} passed the limit {limit}: {body!r}"


def test_a_body_cut_short_is_measured_by_what_it_opens():
    """The decoder would descend into every bracket of a body that never closes them."""
    with pytest.raises(ApiError):
        check_depth(b'{"events": [' + b"[" * 5000, 32)
    with pytest.raises(ApiError):
        check_depth(b'{"events": [{"a": "\\"' + b"[" * 50 + b'"}, ' + b"{" * 40, 32)
    check_depth(b'{"events": ["' + b"[" * 5000, 32)  # inside a string that never ends: not JSON


def _bodies(depth: int) -> dict[str, bytes]:
    """A valid body for each endpoint with ``depth`` levels nested in a field it ignores (for
    ``POST /groups``, which ignores no field, inside ``max_failure``)."""
    nest = "[" * depth + "]" * depth
    return {
        "/agents/events": (
            '{"events": [{"type": "join", "group": "lim", "rank": 0, "incarnation": "a"}], '
            f'"extra": {nest}}}'
        ).encode(),
        "/proposals": (
            f'{{"group": "lim", "op": "deactivate", "ranks": [1], "extra": {nest}}}'
        ).encode(),
        "/agents/deaths": f'{{"group": "lim", "rank": 1, "extra": {nest}}}'.encode(),
        "/groups": f'{{"group": "lim2", "world_size": 2, "max_failure": {nest}}}'.encode(),
    }


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory):
    srv = make_server(tmp_path_factory.mktemp("plain")).start()
    with httpx.Client(base_url=srv.url, timeout=30) as client:
        r = client.post("/groups", json={"group": "lim", "world_size": 4})
        assert r.status_code == 201, r.text
        yield srv, client
    srv.stop()


@pytest.mark.parametrize("path", BODY_PATHS)
def test_a_thousand_levels_in_an_ignored_field_are_a_400_on_every_path(plain_server, path):
    _, client = plain_server
    body = _bodies(1000)[path]
    assert len(body) < 2100
    r = client.post(path, content=body, headers={"content-type": "application/json"})
    detail = _error(r, 400, "nesting_too_deep")["detail"]
    assert "32" in detail and "--max-json-depth" in detail


@pytest.mark.parametrize("path", BODY_PATHS)
def test_nesting_within_the_limit_is_still_served(plain_server, path):
    _, client = plain_server
    r = client.post(path, content=_bodies(20)[path], headers={"content-type": "application/json"})
    if path == "/groups":  # nested deep but legal JSON: refused for its value, not its depth
        _error(r, 422, "invalid_request")
        return
    assert r.status_code in (200, 202), r.text
    if path == "/agents/events":
        [result] = r.json()["results"]
        assert "offset" in result, result


# -- content types ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", BODY_PATHS)
@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data", None]
)
def test_bodies_a_web_page_may_send_without_a_preflight_are_refused(
    plain_server, path, content_type
):
    _, client = plain_server
    head = client.get("/healthz").json()["head"]
    headers = {"content-type": content_type} if content_type else {}
    r = client.post(path, content=_bodies(1)[path], headers=headers)
    detail = _error(r, 415, "unsupported_media_type")["detail"]
    assert "application/json" in detail and path in detail
    assert client.get("/healthz").json()["head"] == head  # nothing reached the log


#: The facets' routes with a JSON body, and a body each would take.
FACET_BODY_PATHS = {
    "/groups/lim/epochs": {"epoch": 1, "items": 8},
    "/refits": {"refit": "r", "publisher": "lim", "subscriber": "lim"},
    "/refits/r/transfers": {"key": "k"},
    "/refits/r/restart": {"reason": "r"},
}


@pytest.mark.parametrize("path", sorted(FACET_BODY_PATHS))
@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_the_facets_bodies_of_another_type_are_refused_too(plain_server, path, content_type):
    _, client = plain_server
    head = client.get("/healthz").json()["head"]
    headers = {"content-type": content_type} if content_type else {}
    r = client.post(path, content=json.dumps(FACET_BODY_PATHS[path]).encode(), headers=headers)
    detail = _error(r, 415, "unsupported_media_type")["detail"]
    assert "application/json" in detail and path in detail
    assert client.get("/healthz").json()["head"] == head  # nothing reached the log


@pytest.mark.parametrize("content_type", ["application/json", "Application/JSON; charset=utf-8"])
def test_json_bodies_are_served(plain_server, content_type):
    _, client = plain_server
    event = {"type": "join", "group": "lim", "rank": 2, "incarnation": "ct"}
    r = client.post(
        "/agents/events",
        content=json.dumps({"events": [event]}).encode(),
        headers={"content-type": content_type},
    )
    assert r.status_code == 200 and "offset" in r.json()["results"][0], r.text


def test_a_coordinator_without_auth_says_so_in_its_log(plain_server):
    srv, _ = plain_server
    assert "auth is off" in srv.output()


def test_a_coordinator_with_auth_does_not(tmp_path):
    srv = make_server(tmp_path, env={"FOLDPLANE_TOKEN": "t" * 32}).start()
    try:
        assert (
            httpx.post(srv.url + "/groups", json={"group": "x", "world_size": 1}).status_code == 401
        )
    finally:
        srv.stop()
    assert "auth is off" not in srv.output()


# -- groups, ranks, bodies: configured by flags and environment --------------------------------


@pytest.fixture(scope="module")
def small_server(tmp_path_factory):
    srv = make_server(
        tmp_path_factory.mktemp("small"),
        args=["--max-ranks", "10", "--max-body-bytes", "2048", "--ranks-page", "3"],
        env={"FOLDPLANE_MAX_GROUPS": "3"},
    ).start()
    with httpx.Client(base_url=srv.url, timeout=30) as client:
        yield srv, client
    srv.stop()


def test_groups_and_ranks_over_the_limits_are_429_naming_them(small_server):
    _, client = small_server
    assert client.post("/groups", json={"group": "a", "world_size": 4}).status_code == 201
    assert client.post("/groups", json={"group": "b", "world_size": 4}).status_code == 201
    over = client.post("/groups", json={"group": "c", "world_size": 3})
    detail = _error(over, 429, "too_many_ranks")["detail"]
    assert "--max-ranks" in detail and "10" in detail and "2 are left" in detail
    assert client.post("/groups", json={"group": "c", "world_size": 2}).status_code == 201
    fourth = client.post("/groups", json={"group": "d", "world_size": 1})
    detail = _error(fourth, 429, "too_many_groups")["detail"]
    assert "--max-groups 3" in detail
    # the honest repeat of an existing group is still answered, limits or not
    assert client.post("/groups", json={"group": "a", "world_size": 4}).status_code == 200
    assert client.get("/groups/d").status_code == 404  # the refused group was never created


def test_the_body_limit_is_configurable(small_server):
    _, client = small_server
    # its own group (an identical repeat is answered 200): the test runs alone or after others
    assert client.post("/groups", json={"group": "a", "world_size": 4}).status_code in (200, 201)
    event = {"type": "join", "group": "a", "rank": 0, "incarnation": "x"}
    big = client.post("/agents/events", json={"events": [{**event, "host": "h" * 2100}]})
    detail = _error(big, 413, "body_too_large")["detail"]
    assert "2048" in detail and "--max-body-bytes" in detail
    small = client.post("/agents/events", json={"events": [{**event, "host": "h" * 100}]})
    assert small.status_code == 200 and "offset" in small.json()["results"][0], small.text


def test_a_group_s_ranks_are_paged_and_the_rest_of_the_document_is_whole(small_server):
    _, client = small_server
    created = client.post("/groups", json={"group": "a", "world_size": 4})  # or already there
    assert created.status_code in (200, 201), created.text
    first = client.get("/groups/a")
    assert first.status_code == 200, first.text
    doc = first.json()
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2] and doc["next_ranks_after"] == 2
    seen = [r["rank"] for r in doc["ranks"]]
    after = doc["next_ranks_after"]
    while after is not None:
        page = client.get("/groups/a", params={"ranks_after": after}).json()
        assert {k: v for k, v in page.items() if k not in ("ranks", "next_ranks_after")} == {
            k: v for k, v in doc.items() if k not in ("ranks", "next_ranks_after")
        }
        seen += [r["rank"] for r in page["ranks"]]
        after = page["next_ranks_after"]
    assert seen == [0, 1, 2, 3]
    whole = client.get("/groups/a", params={"ranks_limit": 4096}).json()
    assert [r["rank"] for r in whole["ranks"]] == [0, 1, 2, 3] and whole["next_ranks_after"] is None
    for params in ({"ranks_limit": 0}, {"ranks_after": -1}, {"ranks_limit": 4097}):
        _error(client.get("/groups/a", params=params), 422, "invalid_request")


def test_a_large_group_is_read_in_pages_of_a_bounded_size(tmp_path):
    srv = make_server(tmp_path).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as client:
            r = client.post("/groups", json={"group": "big", "world_size": 65_536})
            assert r.status_code == 201
            assert len(r.json()["ranks"]) == 1000 and len(r.content) < 1_000_000
            unauthenticated = client.get("/groups/big")
            assert len(unauthenticated.json()["ranks"]) == 1000
            assert len(unauthenticated.content) < 1_000_000  # the whole group is about 10 MB
            last = client.get("/groups/big", params={"ranks_after": 65_000}).json()
            assert last["ranks"][-1]["rank"] == 65_535 and last["next_ranks_after"] is None
            assert client.get("/healthz").status_code == 200
    finally:
        srv.stop()


# -- incomplete requests, idle and surplus connections ----------------------------------------

HALF_SENT = [
    b"GET /healthz HTTP/1.1\r\nhost: x\r\n",  # the headers never end
    b"GET /heal",  # nor does the request line
    b"POST /agents/events HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    b'content-length: 500\r\n\r\n{"events": [',  # the body never ends
]


def _read_until_closed(sock: socket.socket, bound_s: float) -> bytes:
    """Everything the server sends until it closes the connection; fails the test if it keeps
    it open past ``bound_s``."""
    sock.settimeout(bound_s)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        pytest.fail(f"the server kept a connection open for more than {bound_s} s: {data!r}")
    return data


@pytest.fixture(scope="module")
def strict_server(tmp_path_factory):
    srv = make_server(
        tmp_path_factory.mktemp("strict"),
        args=[
            "--request-timeout-s",
            "3",
            "--keep-alive-s",
            "0.5",
            "--max-connections",
            "60",
            "--max-header-bytes",
            "4096",
        ],
    ).start()
    yield srv
    srv.stop()


def _connect(srv) -> socket.socket:
    return socket.create_connection(("127.0.0.1", srv.port), timeout=10)


def _response(sock: socket.socket) -> bytes:
    """One whole response (head and body, by its Content-Length) from a keep-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def test_half_sent_requests_are_closed_after_the_request_timeout(strict_server):
    socks = []
    try:
        for i in range(45):
            sock = _connect(strict_server)
            sock.sendall(HALF_SENT[i % len(HALF_SENT)])
            socks.append(sock)
        # while they hang, an honest request is served
        assert httpx.get(strict_server.url + "/healthz", timeout=10).status_code == 200
        answers = [_read_until_closed(sock, bound_s=15) for sock in socks]
    finally:
        for sock in socks:
            sock.close()
    for i, answer in enumerate(answers):
        if i % len(HALF_SENT) == 2:  # inside its body: closed, the handler sees a disconnect
            assert answer == b"", answer
            continue
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), answer
        assert json.loads(body)["error"] == "request_timeout"
    # nothing of the half-sent batches reached the log
    events = httpx.get(strict_server.url + "/events", params={"limit": 1000}).json()["events"]
    assert events == []


def test_an_idle_keep_alive_connection_is_closed_and_a_busy_one_is_served(strict_server):
    sock = _connect(strict_server)
    with sock:
        for _ in range(3):  # requests in a row on one connection are all served
            sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            assert _response(sock).startswith(b"HTTP/1.1 200")
        assert _read_until_closed(sock, bound_s=10) == b""  # then idle: closed


def test_over_the_connection_cap_a_connection_is_refused_with_503(strict_server):
    socks = [_connect(strict_server) for _ in range(60)]
    try:
        # each of these connections was accepted: it answers a request
        socks[0].sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        assert _response(socks[0]).startswith(b"HTTP/1.1 200")
        extra = _connect(strict_server)
        with extra:
            extra.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            answer = _read_until_closed(extra, bound_s=10)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503"), answer
        detail = json.loads(body)
        assert detail["error"] == "too_many_connections" and "--max-connections" in detail["detail"]
        for sock in socks:  # the idle ones are closed by the request timeout, freeing the room
            _read_until_closed(sock, bound_s=15)
    finally:
        for sock in socks:
            sock.close()
    assert httpx.get(strict_server.url + "/healthz", timeout=10).status_code == 200


def test_headers_over_the_limit_are_431_and_normal_ones_are_served(strict_server):
    with _connect(strict_server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-pad: " + b"a" * 5000 + b"\r\n\r\n")
        answer = _read_until_closed(sock, bound_s=10)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431"), answer
    assert json.loads(body)["error"] == "headers_too_large"
    ok = httpx.get(strict_server.url + "/healthz", headers={"x-pad": "a" * 3000}, timeout=10)
    assert ok.status_code == 200


def test_limits_out_of_their_bounds_stop_the_server_at_start(tmp_path):
    srv = make_server(tmp_path, args=["--max-json-depth", "1000"])
    with pytest.raises(RuntimeError, match="--max-json-depth is 1000; it must be within 4..256"):
        srv.start()


# -- pages of the log and of the view history within a byte budget ----------------------------


async def test_history_and_log_pages_stop_at_the_byte_budget_and_miss_nothing(tmp_path):
    srv = make_server(tmp_path, args=["--max-page-bytes", "1024"]).start()
    try:
        async with httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
            r = await client.post("/groups", json={"group": "pg", "world_size": 2, **FAST})
            assert r.status_code == 201
            sim = SimulatedCluster(("127.0.0.1", srv.port), "pg", 2, heartbeat_interval_s=0.2)
            await sim.start()
            try:
                await sim.wait_until(lambda: sim.all_on(1), timeout=60)
                for op in ("deactivate", "activate", "deactivate", "activate"):
                    body = {"group": "pg", "op": op, "ranks": [1]}
                    done = await client.post("/proposals", params={"wait": 20}, json=body)
                    assert done.json()["status"] == "applied", done.text
            finally:
                await sim.stop()
            versions, pages, after = [], 0, 0
            while True:
                page = await client.get(
                    "/views/history", params={"group": "pg", "after_version": after}
                )
                doc = page.json()
                views = doc["views"]
                assert views, doc
                # at least one view a page; past the budget by at most the last view
                assert len(_compact(views[:-1])) < 1024
                versions += [v["version"] for v in views]
                pages += 1
                if doc["next_after_version"] is None:
                    break
                after = doc["next_after_version"]
            assert versions == list(range(1, 6)) and pages > 1
            offsets, after = [], 0
            head = (await client.get("/healthz")).json()["head"]
            while True:
                doc = (await client.get("/events", params={"after": after, "limit": 1000})).json()
                if not doc["events"]:
                    assert doc["next_after"] == after
                    break
                assert len(_compact(doc["events"][:-1])) < 1024
                offsets += [e["offset"] for e in doc["events"]]
                after = doc["next_after"]
            assert offsets[:head] == list(range(1, head + 1))
            joins = (await client.get("/events", params={"kind": "join"})).json()["events"]
            assert [(e["kind"], e["rank"]) for e in joins] == [("join", 0), ("join", 1)]
    finally:
        srv.stop()


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


async def test_creations_at_once_cannot_pass_the_group_limit_together(tmp_path):
    """The host prechecks a whole batch against one state of the fold: creations in flight
    count against the limit too."""
    srv = make_server(tmp_path, args=["--max-groups", "3"]).start()
    try:
        async with httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
            answers = await asyncio.gather(
                *(
                    client.post("/groups", json={"group": f"at-once-{i}", "world_size": 1})
                    for i in range(12)
                )
            )
            statuses = sorted(r.status_code for r in answers)
            assert statuses.count(201) == 3 and statuses.count(429) == 9, statuses
            created = [r.json()["group"] for r in answers if r.status_code == 201]
            for name in created:  # the ones that got in are served
                assert (await client.get(f"/groups/{name}")).status_code == 200
            refused = [i for i, r in enumerate(answers) if r.status_code == 429]
            assert (await client.get(f"/groups/at-once-{refused[0]}")).status_code == 404
    finally:
        srv.stop()


def test_every_limit_is_in_the_operations_table_with_its_default():
    from foldplane.api.limits import LIMITS, Limits
    from tests.service.conftest import ROOT

    table = (ROOT / "docs" / "operations.md").read_text()
    defaults = Limits()
    for doc in LIMITS:
        row = next(
            (line for line in table.splitlines() if line.startswith(f"| `{doc.field}` |")), ""
        )
        assert f"`{doc.flag}` / `{doc.env}`" in row, doc.field
        assert f"| `{getattr(defaults, doc.field)}` |" in row, (doc.field, row)
        if doc.answer[0].isdigit():  # a status and its code: "413 body_too_large"
            assert " ".join(doc.answer.split()[:2]) in row, (doc.field, row)
