"""The host channel (``GET /agents/channel``, a WebSocket) against a real server: what opens it
and what refuses it, event batches answered by id with the HTTP route's answers, updates pushed
without a request, and every way a client can misbehave on it (a frame it breaks, a message too
large or too deep, one half sent, a channel left idle), each closed with its code and none of
it reaching the log.

A raw client (:class:`Raw`) writes frames by hand for the misbehaving cases; the well-behaved
ones use the agents' own client (``agent.channel``)."""

from __future__ import annotations

import asyncio
import base64
import os
import struct
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec
import pytest

from foldplane.agent.channel import ChannelRefused, HostChannel, open_channel
from foldplane.wire import websocket as ws
from foldplane.wire.auth import agent_token
from tests.service.conftest import FAST, Server, make_server

GROUP = "ch"
WAIT = 10.0  # every wait below is bounded by this


class Raw:
    """A hand-driven WebSocket client: the opening request as given, then frames as given."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.frames = ws.FrameReader(masked=False, max_message=1 << 24)
        self.got: list[ws.Message] = []

    @classmethod
    async def open(
        cls,
        server: Server,
        target: str,
        *,
        headers: dict[str, str] | None = None,
        method: str = "GET",
    ) -> tuple[Raw, int, dict[str, str], bytes]:
        """Send an opening request; the client, the answer's status, headers and body (the
        body of a refused opening; b"" after a 101)."""
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        head = {
            "host": "x",
            "connection": "Upgrade",
            "upgrade": "websocket",
            "sec-websocket-version": "13",
            "sec-websocket-key": base64.b64encode(os.urandom(16)).decode(),
            **(headers or {}),
        }
        lines = [f"{method} {target} HTTP/1.1", *(f"{k}: {v}" for k, v in head.items() if v)]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("utf-8"))
        async with asyncio.timeout(WAIT):
            raw_head = await reader.readuntil(b"\r\n\r\n")
        status = int(raw_head.split(b" ", 2)[1])
        answer = {}
        for line in raw_head.decode("latin-1").split("\r\n")[1:]:
            if ":" in line:
                name, _, value = line.partition(":")
                answer[name.strip().lower()] = value.strip()
        body = b""
        if status != 101:
            async with asyncio.timeout(WAIT):
                body = await reader.readexactly(int(answer.get("content-length", "0")))
        else:
            assert answer["sec-websocket-accept"] == ws.accept_key(head["sec-websocket-key"])
        return cls(reader, writer), status, answer, body

    def send(self, opcode: int, payload: bytes, *, masked: bool = True) -> None:
        self.writer.write(ws.frame(opcode, payload, mask_key=os.urandom(4) if masked else None))

    def send_json(self, message: Any) -> None:
        self.send(ws.TEXT, msgspec.json.encode(message))

    async def next(self) -> ws.Message:
        """The next message or control frame the server sends."""
        async with asyncio.timeout(WAIT):
            while not self.got:
                data = await self.reader.read(65536)
                if not data:
                    raise ConnectionError("the server closed the connection")
                self.got += self.frames.feed(data)
        return self.got.pop(0)

    async def next_json(self) -> dict[str, Any]:
        message = await self.next()
        assert message.opcode == ws.TEXT, message
        return msgspec.json.decode(message.payload)

    async def closed_with(self) -> tuple[int, str]:
        """Read until the server's close frame; its code and reason."""
        while True:
            message = await self.next()
            if message.opcode == ws.CLOSE:
                return ws.parse_close(message.payload)

    def close(self) -> None:
        self.writer.close()


async def _group(server: Server, world_size: int = 2, group: str = GROUP) -> None:
    async with httpx.AsyncClient(base_url=server.url) as client:
        r = await client.post("/groups", json={"group": group, "world_size": world_size, **FAST})
        assert r.status_code in (200, 201), r.text


def _head(server: Server) -> int:
    return httpx.get(server.url + "/healthz").json()["head"]


@pytest.fixture
async def srv(tmp_path) -> AsyncIterator[Server]:
    server = make_server(
        tmp_path, args=["--max-body-bytes", "4096", "--request-timeout-s", "0.5"]
    ).start()
    await _group(server)
    yield server
    server.stop()


def _join(rank: int, incarnation: str) -> dict[str, Any]:
    return {"type": "join", "group": GROUP, "rank": rank, "incarnation": incarnation}


# -- opening -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "status", "code", "words"),
    [
        ("/agents/channel?group=ch&ranks=0-1", 400, "protocol_mismatch", "protocol 2"),
        ("/agents/channel?group=ch&ranks=0-1&protocol=1", 400, "protocol_mismatch", "'1'"),
        ("/agents/channel?group=nope&ranks=0&protocol=2", 404, "unknown_group", "nope"),
        ("/agents/channel?group=ch&ranks=0-2&protocol=2", 404, "rank_out_of_range", "rank 2"),
        ("/agents/channel?group=ch&ranks=0-x&protocol=2", 422, "invalid_query", "ranks"),
        (
            "/agents/channel?group=ch&ranks=0&after=%D9%A1%D9%A2&protocol=2",
            422,
            "invalid_query",
            "after",
        ),
        ("/agents/channel?group=ch&rank=%D9%A1&protocol=2", 422, "invalid_query", "rank"),
        ("/agents/channel?group=ch&ranks=0&protocol=2&colour=red", 422, "invalid_query", "colour"),
        ("/agents/channel?group=ch&protocol=2", 422, "invalid_query", "ranks"),
        ("/agents/channel?ranks=0&protocol=2", 422, "invalid_query", "group"),
        ("/agents/channel?group=ch&ranks=0&ranks=1&protocol=2", 422, "invalid_query", "twice"),
        (
            "/agents/channel?group=ch&ranks=0&protocol=2&after=99999999999999999999",
            422,
            "invalid_query",
            "after",
        ),
    ],
)
async def test_a_bad_opening_is_an_http_error_naming_what_is_wrong(
    srv: Server, target: str, status: int, code: str, words: str
) -> None:
    head = _head(srv)
    raw, got, _, body = await Raw.open(srv, target)
    assert got == status, body
    error = msgspec.json.decode(body)
    assert error["error"] == code and words in error["detail"], error
    assert await raw.reader.read() == b""  # and the connection is closed
    assert _head(srv) == head  # nothing was appended


async def test_a_websocket_of_another_version_or_key_or_method_is_refused(srv: Server) -> None:
    target = "/agents/channel?group=ch&ranks=0&protocol=2"
    _, status, headers, body = await Raw.open(srv, target, headers={"sec-websocket-version": "8"})
    assert status == 426 and headers["sec-websocket-version"] == "13", body
    _, status, _, body = await Raw.open(srv, target, headers={"sec-websocket-key": "short"})
    assert status == 400 and b"Sec-WebSocket-Key" in body
    _, status, _, body = await Raw.open(srv, target, method="POST")
    assert status == 405 and b"GET" in body


async def test_the_channel_without_an_upgrade_is_a_426_in_the_error_shape(srv: Server) -> None:
    r = httpx.get(srv.url + "/agents/channel?group=ch&ranks=0&protocol=2")
    assert r.status_code == 426 and r.json()["error"] == "upgrade_required"
    assert r.headers["sec-websocket-version"] == "13"
    doc = httpx.get(srv.url + "/openapi.json").json()
    assert "101" in doc["paths"]["/agents/channel"]["get"]["responses"]


async def test_with_auth_the_door_takes_a_token_for_every_rank_carried(tmp_path) -> None:
    secret, operator = "s" * 32, "o" * 32
    server = make_server(
        tmp_path, env={"FOLDPLANE_SECRET": secret, "FOLDPLANE_TOKEN": operator}
    ).start()
    try:
        async with httpx.AsyncClient(base_url=server.url) as client:
            r = await client.post(
                "/groups",
                json={"group": GROUP, "world_size": 2, **FAST},
                headers={"authorization": f"Bearer {operator}"},
            )
            assert r.status_code == 201
        target = "/agents/channel?group=ch&ranks=0-1&protocol=2"
        t0, t1 = agent_token(secret, GROUP, 0), agent_token(secret, GROUP, 1)
        for authorization, status in [
            (None, 401),
            (f"Bearer {t0}", 403),  # speaks for rank 0 only
            (f"Bearer {t0},{t1}", 101),
            (f"Bearer {operator}", 101),
        ]:
            raw, got, _, body = await Raw.open(
                server, target, headers={"authorization": authorization or ""}
            )
            assert got == status, (authorization, body)
            raw.close()
        # events only: any valid token at the door; each event is still decided by its own
        raw, got, _, _ = await Raw.open(
            server, "/agents/channel?protocol=2", headers={"authorization": f"Bearer {t0}"}
        )
        assert got == 101
        raw.send_json({"id": 1, "events": [_join(0, "a"), _join(1, "b")]})
        answer = await raw.next_json()
        assert "offset" in answer["results"][0]
        assert answer["results"][1]["error"] == "forbidden"
        raw.send_json({"id": 2, "events": [{**_join(1, "b"), "token": t1}]})
        assert "offset" in (await raw.next_json())["results"][0]
    finally:
        server.stop()


# -- events ------------------------------------------------------------------------------------


async def test_batches_are_answered_by_id_as_the_http_route_answers_them(srv: Server) -> None:
    channel = await open_channel("127.0.0.1", srv.port)
    try:
        joins = await channel.call([_join(0, "a"), _join(1, "b")], timeout=WAIT)
        assert joins.body["term"] == 1 and all("offset" in r for r in joins.body["results"])
        # two in flight at once, each answered with its own id: a beat waits for its shared
        # record, the stale join beside it does not wait behind it
        beat = {"type": "heartbeat", "group": GROUP, "rank": 0, "incarnation": "a"}
        stale = {**beat, "incarnation": "z", "version": 0}
        first, second = channel.send([beat], WAIT), channel.send([stale], WAIT)
        a, b = await first, await second
        assert a.body["id"] != b.body["id"]
        assert "offset" in a.body["results"][0]
        over_http = httpx.post(srv.url + "/agents/events", json={"events": [stale]}).json()
        assert b.body["results"] == over_http["results"]  # the same refusal, word for word
        assert b.body["results"][0]["error"] == "stale_incarnation"
    finally:
        channel.close()


@pytest.mark.parametrize(
    ("message", "words"),
    [
        (b"not json", "integer id"),
        (b'{"events": []}', "integer id"),
        (b'{"id": -1, "events": []}', "integer id"),
        (b'{"id": 9007199254740993, "events": []}', "integer id"),
        (b'{"id": "7", "events": []}', "integer id"),
        (b"[" * 40 + b"]" * 40, "nest"),
    ],
)
async def test_a_malformed_message_is_answered_and_the_channel_goes_on(
    srv: Server, message: bytes, words: str
) -> None:
    head = _head(srv)
    raw, status, _, _ = await Raw.open(srv, "/agents/channel?protocol=2")
    assert status == 101
    raw.send(ws.TEXT, message)
    error = await raw.next_json()
    assert error["id"] is None and words in error["detail"], error
    raw.send_json({"id": 5, "events": [{"type": "nonsense"}]})  # still open, and still strict
    answer = await raw.next_json()
    assert answer["id"] == 5 and answer["results"][0]["error"] == "invalid_event"
    raw.send_json({"id": 6, "events": "none"})
    answer = await raw.next_json()
    assert answer == {"id": 6, "error": "invalid_request", "detail": answer["detail"]}
    for deep in (40, 2000):  # too deep, and deeper than the decoder goes: answered by its id
        raw.send(ws.TEXT, b'{"id": 7, "events": ' + b"[" * deep + b"]" * deep + b"}")
        answer = await raw.next_json()
        assert answer["id"] == 7 and answer["error"] == "nesting_too_deep", answer
    raw.close()
    assert _head(srv) == head  # none of it was appended


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (ws.frame(ws.BINARY, b"{}", mask_key=b"abcd"), ws.UNSUPPORTED_DATA),
        (ws.frame(ws.TEXT, b"{}"), ws.PROTOCOL_ERROR),  # a client's frame must be masked
        (bytes([0xC1, 0x80]) + b"abcd", ws.PROTOCOL_ERROR),  # a reserved bit
        (bytes([0x81, 0xFE]) + struct.pack("!H", 5000), ws.TOO_BIG),  # over --max-body-bytes
        (bytes([0x81, 0xFF]) + struct.pack("!Q", 2**62), ws.TOO_BIG),
    ],
)
async def test_a_broken_frame_closes_the_channel_with_its_code(
    srv: Server, frame: bytes, code: int
) -> None:
    raw, status, _, _ = await Raw.open(srv, "/agents/channel?protocol=2")
    assert status == 101
    raw.writer.write(frame)
    got, _ = await raw.closed_with()
    assert got == code
    assert await raw.reader.read() == b""


async def test_a_half_sent_frame_is_closed_at_the_request_deadline(srv: Server) -> None:
    raw, _, _, _ = await Raw.open(srv, "/agents/channel?protocol=2")
    whole = ws.frame(ws.TEXT, b'{"id": 1, "events": []}', mask_key=b"abcd")
    raw.writer.write(whole[:5])  # and nothing more: closed after --request-timeout-s (0.5 s)
    code, reason = await raw.closed_with()
    assert code == ws.POLICY_VIOLATION and "--request-timeout-s" in reason


async def test_pings_are_answered_and_a_silent_channel_is_closed(tmp_path) -> None:
    server = make_server(tmp_path, args=["--channel-idle-s", "1"]).start()
    try:
        raw, _, _, _ = await Raw.open(server, "/agents/channel?protocol=2")
        raw.send(ws.PING, b"hello")
        assert await raw.next() == ws.Message(ws.PONG, b"hello")
        code, reason = await raw.closed_with()  # then nothing: closed after about a second
        assert code == ws.GOING_AWAY and "nothing received" in reason
    finally:
        server.stop()


# -- updates -----------------------------------------------------------------------------------


async def test_updates_are_pushed_as_they_happen_without_asking_again(srv: Server) -> None:
    pushed: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    channel = await open_channel(
        "127.0.0.1", srv.port, group=GROUP, ranks=(0, 1), on_updates=pushed.put_nowait
    )
    try:

        async def kinds_until(kind: str) -> list[dict[str, Any]]:
            got: list[dict[str, Any]] = []
            async with asyncio.timeout(WAIT):
                while not any(u["type"] == kind for u in got):
                    body = await pushed.get()
                    assert body["resync"] is False and body["next_after"] >= 1
                    got += body["updates"]
            return got

        await channel.call([_join(0, "a"), _join(1, "b")], timeout=WAIT)
        states = await kinds_until("rank_state")
        assert {u["rank"] for u in states} <= {0, 1}
        ready = [
            {"type": "links", "group": GROUP, "rank": r, "incarnation": i, "self_ready": True}
            for r, i in ((0, "a"), (1, "b"))
        ]
        await channel.call(ready, timeout=WAIT)
        [prepare] = [u for u in await kinds_until("view_prepare") if u["type"] == "view_prepare"]
        acks = [
            {"type": "ack", "group": GROUP, "rank": r, "incarnation": i, "version": 1}
            for r, i in ((0, "a"), (1, "b"))
        ]
        assert prepare["version"] == 1
        await channel.call(acks, timeout=WAIT)
        committed = [
            u for u in await kinds_until("view_committed") if u["type"] == "view_committed"
        ]
        assert committed[0]["version"] == 1 and committed[0]["base"] == 0
    finally:
        channel.close()


async def test_a_reader_past_the_head_gets_a_restored_resync_at_once(srv: Server) -> None:
    pushed: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    channel = await open_channel(
        "127.0.0.1", srv.port, group=GROUP, ranks=(0,), after=10**9, on_updates=pushed.put_nowait
    )
    try:
        async with asyncio.timeout(WAIT):
            body = await pushed.get()
        assert body["resync"] is True and body.get("restored") is True
        assert body["next_after"] < 10**9
    finally:
        channel.close()


async def test_a_refused_opening_reaches_the_client_with_its_body(srv: Server) -> None:
    with pytest.raises(ChannelRefused) as refused:
        await open_channel("127.0.0.1", srv.port, group="nope", ranks=(0,))
    assert refused.value.status == 404 and refused.value.body["error"] == "unknown_group"


async def test_a_shutdown_answers_what_is_in_flight_then_closes_going_away(tmp_path) -> None:
    server = make_server(tmp_path, args=["--heartbeat-flush-s", "2"]).start()
    await _group(server)
    channel: HostChannel = await open_channel("127.0.0.1", server.port)
    await channel.call([_join(0, "a")], timeout=WAIT)
    beat = {"type": "heartbeat", "group": GROUP, "rank": 0, "incarnation": "a"}
    waiting = channel.send([beat], WAIT)  # waits up to 2 s for its shared record
    await asyncio.sleep(0)  # let it be written before the server is told to stop
    stop = asyncio.get_running_loop().run_in_executor(None, server.stop)
    answer = await waiting
    assert "offset" in answer.body["results"][0] or answer.body.get("error") == "closed", answer
    async with asyncio.timeout(WAIT):
        await channel.ended
    assert "1001" in str(channel.closed), channel.closed
    assert await stop == 0


@pytest.mark.parametrize(
    ("sent", "echoed"),
    [(ws.close_payload(1000, "bye"), 1000), (b"", 1000), (ws.close_payload(1005), 1002)],
)
async def test_a_close_is_answered_with_its_code_or_a_protocol_error(
    srv: Server, sent: bytes, echoed: int
) -> None:
    raw, _, _, _ = await Raw.open(srv, "/agents/channel?protocol=2")
    raw.send(ws.CLOSE, sent)
    code, _ = await raw.closed_with()
    assert code == echoed  # 1005 says "no code was sent": a peer may not send it
    assert await raw.reader.read() == b""
