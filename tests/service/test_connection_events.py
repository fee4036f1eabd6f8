"""The agents' hot paths answered by the connection itself (``api.server.GuardedHttp`` and
``api.fastpath.OnConnection``): ``POST /agents/events`` and the ``GET /agents/updates`` long
poll get the same answers as the ASGI application gives, for plain requests without an ASGI
request at all, and everything else is handed to the application.

The server is the real one (``api.server.config`` under uvicorn, in this test's event loop, on
a free port of 127.0.0.1) over a real ``Host`` on a SQLite file; the client writes raw HTTP, so
that pipelining, ``Connection: close``, chunked bodies and a client leaving mid-answer are
exactly what is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import msgspec
import pytest

from foldplane.api.app import create_app
from foldplane.api.server import Server, config
from foldplane.coordinator.host.loop import Host
from tests.conftest import free_port

GROUP = "g"
WORLD = 4


class Running:
    """A real server in this loop, and a count of the requests its ASGI application saw."""

    def __init__(self, host: Host, port: int) -> None:
        self.host = host
        self.port = port
        self.asgi_requests: list[tuple[str, str]] = []

    async def raw(self, data: bytes, answers: int = 1, *, close: bool = True) -> list[Any]:
        """Write ``data`` on a new connection and read ``answers`` responses off it."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            writer.write(data)
            await writer.drain()
            return [await _response(reader) for _ in range(answers)]
        finally:
            if close:
                writer.close()
                with contextlib.suppress(ConnectionError):
                    await writer.wait_closed()

    async def asgi(self, body: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
        """The same request through the ASGI application, without a connection."""
        transport = httpx.ASGITransport(app=self.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
            return await client.post(
                "/agents/events",
                content=body,
                headers={"content-type": "application/json", **(headers or {})},
            )

    def connections(self) -> list[Any]:
        """The server's open connections (its protocols)."""
        return list(self.uvicorn.server_state.connections)  # type: ignore[attr-defined]

    async def asgi_get(self, target: str) -> httpx.Response:
        transport = httpx.ASGITransport(app=self.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
            return await client.get(target)


async def _response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], Any]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:] if line)}
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 10)
    return status, headers, msgspec.json.decode(body)


def post(body: bytes, *extra: str, length: int | None = None) -> bytes:
    lines = [
        "POST /agents/events HTTP/1.1",
        "host: x",
        "content-type: application/json",
        f"content-length: {len(body) if length is None else length}",
        *extra,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def events(*evs: dict[str, Any]) -> bytes:
    return msgspec.json.encode({"events": list(evs)})


def beat(rank: int) -> dict[str, Any]:
    return {"type": "heartbeat", "group": GROUP, "rank": rank, "incarnation": f"i{rank}"}


async def serving(server: Server, timeout: float = 30.0) -> asyncio.Task[None]:
    """Start ``server``: its task, once its sockets are bound (``Server.on_started``)."""
    bound = asyncio.Event()
    server.on_started = bound.set
    task = asyncio.create_task(server.serve())
    started = asyncio.create_task(bound.wait())
    await asyncio.wait({task, started}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    if not bound.is_set():
        started.cancel()
        if task.done():
            task.result()  # why it stopped
        task.cancel()
        raise AssertionError(f"the server did not start in {timeout} s")
    return task


async def until(predicate: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Until ``predicate`` holds. The server reads a request from its socket in its own time,
    and nothing announces where it got to (a closed client's beats admitted, a request
    queued): this looks every 10 ms, and fails after ``timeout`` s."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


@pytest.fixture
async def server(tmp_path) -> AsyncIterator[Running]:
    host = await Host.open(str(tmp_path / "log.db"), heartbeat_flush_s=0.05)
    app = create_app(host)
    port = free_port()
    running = Running(host, port)
    running.app = app  # type: ignore[attr-defined]

    class Counting:
        """The application as uvicorn sees it, counting what reaches it."""

        def __init__(self) -> None:
            self.on_connection = app.on_connection

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                running.asgi_requests.append((scope["method"], scope["path"]))
            await app(scope, receive, send)

    server = Server(config(Counting(), "127.0.0.1", port, "warning"))
    running.uvicorn = server  # type: ignore[attr-defined]
    task = await serving(server)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        created = await client.post("/groups", json={"group": GROUP, "world_size": WORLD})
        assert created.status_code in (200, 201), created.text
        joins = [
            {"type": "join", "group": GROUP, "rank": r, "incarnation": f"i{r}"}
            for r in range(WORLD)
        ]
        joined = await client.post("/agents/events", json={"events": joins})
        assert all("offset" in r for r in joined.json()["results"]), joined.text
    running.asgi_requests.clear()
    try:
        yield running
    finally:
        server.should_exit = True
        await task
        await host.close()


async def test_a_plain_batch_is_answered_without_the_asgi_application(server: Running):
    [(status, headers, body)] = await server.raw(post(events(beat(0), beat(1))))
    assert status == 200 and headers["content-type"] == "application/json"
    assert body["term"] == server.host.log.term
    assert [set(r) for r in body["results"]] == [{"offset"}, {"offset"}]
    assert server.asgi_requests == []
    # and the beats are in the log, as through the application
    records = await server.host.log.read(after=0)
    assert any(r.kind == "heartbeat" and r.payload.get("ranks") for r in records)


async def test_answers_are_the_applications_own(server: Running):
    """Each answer, plain or not, has the status and body the ASGI application gives the same
    request (offsets aside: every beat is a new one)."""
    cases = [
        events(beat(0), {"type": "heartbeat", "group": GROUP, "rank": 1}),  # one bad event
        events(beat(0), {**beat(9)}),  # rank out of range: refused by the fold
        events({**beat(2), "incarnation": "old"}),  # stale incarnation
        b'{"events": [',  # malformed JSON: the application words the error
        events(*[beat(0)] * 4097),  # over MAX_EVENTS
        b'{"events": []}',
    ]
    for body in cases:
        [(status, _, answer)] = await server.raw(post(body))
        expected = await server.asgi(body)
        assert status == expected.status_code, body[:60]
        assert _without_offsets(answer) == _without_offsets(expected.json()), body[:60]


def _without_offsets(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_offsets(v) for k, v in value.items() if k != "offset"}
    if isinstance(value, list):
        return [_without_offsets(v) for v in value]
    return value


async def test_what_is_not_plain_goes_to_the_application_and_is_served(server: Running):
    body = events(beat(0))
    chunked = (
        b"POST /agents/events HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    )
    expect = post(body, "expect: 100-continue")
    [(status, _, answer)] = await server.raw(chunked)
    assert status == 200 and "offset" in answer["results"][0]
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(expect)
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 100")
        status, _, answer = await _response(reader)
        assert status == 200 and "offset" in answer["results"][0]
    finally:
        writer.close()
    assert server.asgi_requests == [("POST", "/agents/events")] * 2


async def test_a_bad_content_type_or_a_body_over_the_limit_is_the_applications_error(
    server: Running,
):
    body = events(beat(0))
    wrong = post(body).replace(b"application/json", b"text/plain")
    [(status, _, answer)] = await server.raw(wrong)
    assert (status, answer["error"]) == (415, "unsupported_media_type")
    huge = server.app.max_body_bytes + 1  # type: ignore[attr-defined]
    [(status, _, answer)] = await server.raw(post(b"", length=huge))
    assert (status, answer["error"]) == (413, "body_too_large")
    assert len(server.asgi_requests) == 2


async def test_pipelined_requests_are_answered_in_order(server: Running):
    """Three requests in one write: a batch on this path, one the application serves (a GET),
    another batch; the answers come back in that order on the one connection."""
    first, last = events(beat(0)), events(beat(1), beat(2))
    data = post(first) + b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n" + post(last)
    answers = await server.raw(data, answers=3)
    assert [status for status, _, _ in answers] == [200, 200, 200]
    assert len(answers[0][2]["results"]) == 1
    assert "results" not in answers[1][2]
    assert len(answers[2][2]["results"]) == 2
    assert server.asgi_requests == [("GET", "/healthz")]


async def test_connection_close_is_honoured(server: Running):
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(post(events(beat(0)), "connection: close"))
        status, headers, _ = await _response(reader)
        assert status == 200 and headers.get("connection") == "close"
        assert await asyncio.wait_for(reader.read(), 10) == b""  # the server closed it
    finally:
        writer.close()


async def test_a_client_gone_while_its_beats_wait_loses_nothing(server: Running):
    """The client leaves before its answer (the beats wait for their shared record): the
    server writes nothing to the closed connection, the beats still reach the log, and the
    next connection is served."""
    before = server.host.metrics.heartbeats
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(post(events(beat(0), beat(1), beat(3))))
    await writer.drain()
    writer.close()
    await until(lambda: server.host.metrics.heartbeats >= before + 3, "the beats to be written")
    assert server.host.metrics.heartbeats == before + 3
    [(status, _, _)] = await server.raw(post(events(beat(0))))
    assert status == 200


async def test_an_answer_the_host_cannot_give_is_a_503_in_the_one_shape(tmp_path):
    """The host closes while a batch waits for its shared record: the batch is answered
    ``503 closed``, not dropped and not a 500."""
    host = await Host.open(str(tmp_path / "log.db"), heartbeat_flush_s=60.0)
    app = create_app(host)
    port = free_port()
    server = Server(config(app, "127.0.0.1", port, "warning"))
    task = await serving(server)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            await client.post("/groups", json={"group": GROUP, "world_size": 1})
            join = {"type": "join", "group": GROUP, "rank": 0, "incarnation": "i0"}
            await client.post("/agents/events", json={"events": [join]})
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post(events(beat(0))))
        await writer.drain()

        def waiting() -> bool:  # queued, or admitted: waiting for a record 60 s away either way
            return host.queue_depth > 0 or host.admission.beats.deadline() is not None

        await until(waiting, "the beat to wait for its shared record")
        await host.close()
        status, _, answer = await _response(reader)
        assert (status, answer["error"]) == (503, "closed")
        writer.close()
    finally:
        server.should_exit = True
        await task
        await host.close()


def get(target: str, *extra: str) -> bytes:
    return ("\r\n".join([f"GET {target} HTTP/1.1", "host: x", *extra]) + "\r\n\r\n").encode()


@pytest.mark.parametrize("extra", [(), ("content-length: 0",)])
async def test_a_plain_long_poll_is_answered_without_the_asgi_application(
    server: Running, extra: tuple[str, ...]
):
    target = f"/agents/updates?group={GROUP}&ranks=0-3&after=0&timeout=5&protocol=2"
    [(status, headers, body)] = await server.raw(get(target, *extra))
    assert status == 200 and headers["content-type"] == "application/json"
    assert body["next_after"] > 0 and body["updates"]  # the joins' rank states at least
    assert server.asgi_requests == []
    expected = await server.asgi_get(target)
    assert body == expected.json()


async def test_long_poll_answers_are_the_applications_own(server: Running):
    """Each query on this path, and each one it leaves to the application, is answered with
    the status and body the application gives it."""
    targets = [
        "/agents/updates?group=nope&rank=0&protocol=2",  # unknown group
        f"/agents/updates?group={GROUP}&rank=0&protocol=1",  # another protocol
        f"/agents/updates?group={GROUP}&rank=9&protocol=2&timeout=0",  # rank out of range
        f"/agents/updates?group={GROUP}&rank=0&protocol=2&timeout=0&view=1",
        f"/agents/updates?group={GROUP}&rank=%30&protocol=2&timeout=0",  # an escape: rank 0
        f"/agents/updates?group={GROUP}&rank=x&protocol=2",  # the framework's 422
        f"/agents/updates?group={GROUP}&rank=0&&protocol=2",
    ]
    for target in targets:
        [(status, _, body)] = await server.raw(get(target))
        expected = await server.asgi_get(target)
        assert (status, body) == (expected.status_code, expected.json()), target
    # the last two are not plain queries: the application served them
    assert server.asgi_requests == [("GET", "/agents/updates")] * 2


async def test_a_long_poll_with_a_body_goes_to_the_application(server: Running):
    target = f"/agents/updates?group={GROUP}&rank=0&protocol=2&timeout=0"
    [(status, _, body)] = await server.raw(get(target, "content-length: 2") + b"{}")
    assert status == 200 and "updates" in body
    assert server.asgi_requests == [("GET", "/agents/updates")]


async def test_a_waiting_long_poll_is_answered_by_the_next_update(server: Running):
    """A poll after everything there is waits; a beat is no update, a link report that
    changes nothing neither, but an exit is: the poll is answered with it, on time."""
    first = await server.raw(
        get(f"/agents/updates?group={GROUP}&rank=3&after=0&timeout=0&protocol=2")
    )
    after = first[0][2]["next_after"]
    target = f"/agents/updates?group={GROUP}&rank=3&after={after}&timeout=30&protocol=2"
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(get(target))
        await writer.drain()
        exit_ = {"type": "exit", "group": GROUP, "rank": 3, "incarnation": "i3"}
        [(status, _, _)] = await server.raw(post(events(exit_)))
        assert status == 200
        status, _, body = await _response(reader)
        assert status == 200 and body["next_after"] > after
        assert any(u.get("rank") == 3 for u in body["updates"]), body
    finally:
        writer.close()
    assert server.asgi_requests == []


async def test_a_client_that_does_not_read_its_answers_is_held_back(server: Running):
    """Pipelined long polls from a client that never reads: once the connection's write
    buffer is over its high-water mark the requests go to the ASGI application, whose answer
    waits for the client to drain, and reading stops; the server's buffer for the client
    stays bounded instead of growing with every request it is sent."""
    target = f"/agents/updates?group={GROUP}&ranks=0-3&after=0&timeout=0&protocol=2"
    request = get(target)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sent = 0
    try:
        for _ in range(20_000):  # bounded: the server stops reading long before
            writer.write(request * 50)
            sent += 50
            try:
                await asyncio.wait_for(writer.drain(), 0.2)
            except TimeoutError:
                break  # the server no longer reads: held back
        buffered = [c.transport.get_write_buffer_size() for c in server.connections()]
        answer_size = len(_raw_answer(await server.raw(request)))
        assert sent < 20_000 * 50, "the server kept reading a client that never reads"
        assert max(buffered) < 64 * 1024 + 2 * answer_size, buffered
    finally:
        writer.transport.abort()


def _raw_answer(answers: list[Any]) -> bytes:
    [(_, _, body)] = answers
    return msgspec.json.encode(body)
