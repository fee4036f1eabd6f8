"""The connection's two deadlines on its one timer (``api.server.GuardedHttp``): a request
must arrive whole within ``request_timeout_s`` of its first byte (else ``408``), and a
keep-alive connection idle for ``keep_alive_s`` after an answer is closed. The deadline moves
without re-arming the timer; when the timer fires early it must set itself for the rest, never
act on a deadline that has moved.

The protocol is uvicorn's, on a transport that records what is written, in this test's event
loop; its clock is the test's (the timer's ``call_at`` is kept, and run when the test moves
the clock past it), so no test waits on real time.
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.server import ServerState

from foldplane.api.limits import Limits
from foldplane.api.server import guarded_http
from tests.service.clock import Clock

REQUEST_S = 3.0
KEEP_ALIVE_S = 0.5
GET = b"GET /x HTTP/1.1\r\nhost: t\r\n\r\n"


async def _app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 8000)}.get(
            name, default
        )

    def write(self, data: bytes) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _connection() -> tuple[Any, Transport, Clock]:
    limits = Limits(request_timeout_s=REQUEST_S, keep_alive_s=KEEP_ALIVE_S)
    config = uvicorn.Config(
        _app, http=guarded_http(limits), timeout_keep_alive=KEEP_ALIVE_S, lifespan="off"
    )
    config.load()
    protocol = config.http_protocol_class(config=config, server_state=ServerState(), app_state={})
    clock = Clock(asyncio.get_running_loop())
    protocol.loop = clock
    transport = Transport()
    protocol.connection_made(transport)
    return protocol, transport, clock


async def _answered(transport: Transport, count: int) -> None:
    for _ in range(1000):  # the ASGI task runs on the real loop: a bounded number of turns
        if transport.written.count(b"HTTP/1.1 200") >= count:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"not answered {count} times: {transport.written!r}")


async def test_a_connection_kept_busy_stays_open_and_an_idle_one_is_closed():
    protocol, transport, clock = await _connection()
    for k in range(1, 8):  # a request every 0.3 s: 2.1 s in all, past many idle deadlines
        protocol.data_received(GET)
        await _answered(transport, k)
        clock.advance(0.3)
        assert not transport.closed, f"closed after request {k}, while busy"
    clock.advance(KEEP_ALIVE_S - 0.3 - 0.01)
    assert not transport.closed  # not yet KEEP_ALIVE_S since the last answer
    clock.advance(0.02)
    assert transport.closed
    assert b"408" not in transport.written  # an idle connection is closed, not answered
    # one timer for the whole connection's life: set once, then again only when it fired early
    assert clock.set_timers <= 1 + 7


async def test_a_request_not_whole_within_its_deadline_is_answered_408():
    protocol, transport, clock = await _connection()
    protocol.data_received(GET)
    await _answered(transport, 1)
    clock.advance(0.2)
    protocol.data_received(b"GET /x HTTP/1.1\r\nhost:")  # half a request: its deadline runs
    clock.advance(KEEP_ALIVE_S)  # past the idle deadline the first answer set: not idle now
    assert not transport.closed
    clock.advance(REQUEST_S - KEEP_ALIVE_S - 0.01)
    assert not transport.closed
    clock.advance(0.02)
    assert transport.closed and b"HTTP/1.1 408" in transport.written


async def test_time_spent_answering_does_not_count():
    """A request whose answer takes long (a long poll) is not timed out, nor its connection
    closed as idle, however long the answer takes."""
    gate = asyncio.Event()

    async def slow(scope: Any, receive: Any, send: Any) -> None:
        await gate.wait()
        await _app(scope, receive, send)

    protocol, transport, clock = await _connection()
    protocol.app = slow
    protocol.data_received(GET)
    await asyncio.sleep(0)
    clock.advance(10 * REQUEST_S)
    assert not transport.closed and transport.written == b""
    gate.set()
    await _answered(transport, 1)
    clock.advance(KEEP_ALIVE_S + 0.01)
    assert transport.closed
