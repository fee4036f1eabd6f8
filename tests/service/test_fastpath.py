"""Which long-poll queries the fast path takes, which it leaves to the framework, and what it
does when the client leaves mid-request."""

from __future__ import annotations

import pytest

from foldplane.api.app import create_app
from foldplane.api.fastpath import updates_query
from foldplane.api.routes.agents import UpdatesQuery
from foldplane.coordinator.host.loop import Host
from foldplane.wire.protocol import QUERY


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [
        (
            b"group=g&rank=3&after=10&timeout=30&protocol=2",
            UpdatesQuery("g", (3,), 10, 30.0, 2, None),
        ),
        (b"group=g&rank=3&protocol=2", UpdatesQuery("g", (3,), 0, 25.0, 2, None)),  # defaults
        (b"group=g&rank=3&timeout=1.5&protocol=2", UpdatesQuery("g", (3,), 0, 1.5, 2, None)),
        (
            b"group=g%2Ex&rank=65535&after=4611686018427387904&protocol=2",
            UpdatesQuery("g.x", (65535,), 2**62, 25.0, 2, None),
        ),
        (
            b"group=g&ranks=0-3,7,9-10&after=5&protocol=2&view=4",
            UpdatesQuery("g", (0, 1, 2, 3, 7, 9, 10), 5, 25.0, 2, 4),
        ),
        (b"group=g&ranks=65535&protocol=2", UpdatesQuery("g", (65535,), 0, 25.0, 2, None)),
        # another protocol is parsed as such; the route refuses it with protocol_mismatch
        (b"group=g&rank=3&protocol=1", UpdatesQuery("g", (3,), 0, 25.0, 1, None)),
    ],
)
def test_plain_queries_are_parsed_to_the_routes_bounds(raw: bytes, parsed: UpdatesQuery) -> None:
    assert updates_query(raw) == parsed


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"group=g&protocol=2",  # rank or ranks is required
        b"group=g&rank=1",  # no protocol: protocol 1, refused by the route
        b"group=&rank=1&protocol=2",
        b"group=g&rank=-1&protocol=2",
        b"group=g&rank=65536&protocol=2",
        b"group=g&rank=1&after=4611686018427387905&protocol=2",
        b"group=g&rank=1&timeout=61&protocol=2",
        b"group=g&rank=1&timeout=inf&protocol=2",
        b"group=g&rank=1&timeout=1e1&protocol=2",
        b"group=g&group=h&rank=1&protocol=2",  # repeated
        b"group=g&rank=1&extra=2&protocol=2",  # unknown
        b"group=" + b"a" * 65 + b"&rank=1&protocol=2",
        b"group=g&rank=%FF&protocol=2",
        b"group=g&rank=1&&protocol=2",
        b"group=g&rank=1&ranks=1-2&protocol=2",  # both
        b"group=g&ranks=&protocol=2",
        b"group=g&ranks=3-1&protocol=2",  # not increasing
        b"group=g&ranks=1,1&protocol=2",  # repeated rank
        b"group=g&ranks=65536&protocol=2",
        b"group=g&rank=1&protocol=two",
        b"group=g&rank=1&protocol=2&view=-1",
    ],
)
def test_anything_else_goes_to_the_framework(raw: bytes) -> None:
    assert updates_query(raw) is None


async def test_a_client_gone_before_its_body_arrived_gets_no_answer_and_nothing_is_appended(
    tmp_path,
):
    host = await Host.open(str(tmp_path / "log.db"))
    try:
        app = create_app(host)
        head = host.machine.offset
        messages = [
            {"type": "http.request", "body": b'{"events": [{"type": "hea', "more_body": True},
            {"type": "http.disconnect"},
        ]
        sent: list[dict] = []

        async def receive() -> dict:
            return messages.pop(0)

        async def send(message: dict) -> None:
            sent.append(message)

        scope = {
            "type": "http",
            "method": "POST",
            "path": "/agents/events",
            "headers": [(b"content-type", b"application/json")],
            "query_string": b"",
        }
        await app(scope, receive, send)
        assert sent == [] and messages == []
        assert host.machine.offset == head
        assert await host.log.read(after=head) == []
    finally:
        await host.close()


async def test_the_route_and_the_fast_path_read_one_table_of_bounds(tmp_path) -> None:
    """What the route declares (its OpenAPI parameters) is what the fast path serves, at each
    edge of ``wire.protocol.QUERY``: one past it goes to the framework."""
    host = await Host.open(str(tmp_path / "log.db"))
    try:
        document = create_app(host).openapi()
    finally:
        await host.close()
    schemas = {
        p["name"]: p["schema"] for p in document["paths"]["/agents/updates"]["get"]["parameters"]
    }
    params = {name: schema.get("anyOf", [schema])[0] for name, schema in schemas.items()}
    assert params["group"]["maxLength"] == QUERY.group_chars
    assert params["rank"]["maximum"] == QUERY.max_rank
    assert params["ranks"]["maxLength"] == QUERY.ranks_chars
    assert params["after"]["maximum"] == QUERY.max_offset
    assert params["timeout"]["maximum"] == QUERY.max_poll_s
    assert schemas["timeout"]["default"] == QUERY.poll_timeout_s

    def query(**fields: object) -> bytes:
        return "&".join(f"{k}={v}" for k, v in {"protocol": 2, **fields}.items()).encode()

    edge = "g" * QUERY.group_chars
    served = updates_query(query(group=edge, rank=QUERY.max_rank, after=QUERY.max_offset))
    assert served == UpdatesQuery(
        edge, (QUERY.max_rank,), QUERY.max_offset, QUERY.poll_timeout_s, 2, None
    )
    assert updates_query(query(group="g", rank=0, timeout=QUERY.max_poll_s)) is not None
    for past in (
        query(group=edge + "g", rank=0),
        query(group="g", rank=QUERY.max_rank + 1),
        query(group="g", ranks=QUERY.max_rank + 1),
        query(group="g", rank=0, after=QUERY.max_offset + 1),
        query(group="g", rank=0, timeout=QUERY.max_poll_s + 1),
    ):
        assert updates_query(past) is None, past
