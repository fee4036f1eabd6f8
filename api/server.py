"""The HTTP server: uvicorn, adjusted so that stopping it lets the host close cleanly, and so
that a client cannot hold the server's connections without sending requests.

uvicorn times out only idle keep-alive connections. A connection that sends part of a request
and then nothing (a "slowloris" client, or a half-open connection whose peer vanished) would be
held forever, and enough of them exhaust the process's file descriptors. :class:`GuardedHttp`
is uvicorn's httptools protocol with three limits of ``api.limits.Limits``:

- ``request_timeout_s``: from connecting, or from a request's first byte, the whole request
  (line, headers, body) must arrive within this many seconds. A connection that has not sent
  its headers by then is answered ``408 request_timeout`` and closed; one stuck in its body is
  closed (the handler waiting for the body sees the client disconnect). Time the handler
  spends answering (a long poll) does not count.
- ``max_header_bytes``: a request line and headers longer than this are ``431`` and closed.
- ``max_connections``: a connection beyond this many open ones is answered
  ``503 too_many_connections`` at once and closed, before it can take more from the server.

It also answers the agents' two hot paths itself (``api.fastpath.OnConnection``): a plain
``POST /agents/events`` or ``GET /agents/updates`` does not go through the ASGI application; its
answer is written in one write, and the connection then goes on as uvicorn's own cycle would
(keep-alive or close, the next pipelined request). And it opens the agent host channel: a
WebSocket upgrade of ``GET /agents/channel`` hands the connection to ``api.channel``, whose
limits are the same (a frame's deadline is the request's, a message's size the body's).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator
from http import HTTPStatus
from typing import Any

import httptools
import msgspec
import uvicorn
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

from ..coordinator.auth import AuthError
from ..coordinator.host.loop import HostUnavailable
from ..wire.codes import (
    HEADERS_TOO_LARGE,
    REQUEST_TIMEOUT,
    TOO_MANY_CONNECTIONS,
    error_body,
    status_of,
)
from . import channel
from .errors import ApiError, answer_of
from .fastpath import Answer, OnConnection
from .limits import Limits
from .routes.agents import UpdatesQuery

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Server(uvicorn.Server):
    """uvicorn's server, with two differences that matter for a coordinator:

    - SIGINT/SIGTERM only stop it. uvicorn re-raises the signal once HTTP has drained, which
      would kill the process before the host has closed the log and written its final snapshot.
    - ``before_shutdown`` runs when shutdown starts, before connections drain: the host answers
      its long polls at once instead of letting them run out their timeouts.
    - ``on_started`` runs once the sockets are bound, so "serving" is said only when it is
      true (a port in use fails the start instead).
    """

    before_shutdown: Callable[[], None] | None = None
    on_started: Callable[[], None] | None = None

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        if self.started and self.on_started is not None:
            self.on_started()

    async def shutdown(self, sockets: Any = None) -> None:
        if self.before_shutdown is not None:
            self.before_shutdown()
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _raw_error(status: int, code: str, detail: str, **fields: Any) -> bytes:
    """A whole HTTP response in the one error shape, for a connection that closes after it (a
    refused connection, or a refused channel opening)."""
    body = msgspec.json.encode(error_body(code, detail, **fields))
    extra = {
        401: b"www-authenticate: Bearer\r\n",
        426: b"sec-websocket-version: 13\r\n",
        503: b"retry-after: 1\r\n",
    }.get(status, b"")
    return b"".join(
        [
            b"HTTP/1.1 %d %s\r\n" % (status, HTTPStatus(status).phrase.encode()),
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            extra,
            b"connection: close\r\n\r\n",
            body,
        ]
    )


#: Seconds a refused connection waits for its client to close before closing it.
LINGER_S = 1.0


class GuardedHttp(HttpToolsProtocol):
    """uvicorn's httptools protocol with a request deadline, a header size limit and a
    connection cap (see the module's docstring); :func:`guarded_http` sets the limits."""

    limits: Limits = Limits()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        on_connection = getattr(self.app, "on_connection", None)
        self._paths: OnConnection | None = on_connection() if on_connection else None
        #: a request ``_paths`` serves, whose body is still arriving
        self._waiting: tuple[RequestResponseCycle, str | UpdatesQuery] | None = None
        # One timer per connection for both deadlines, a request's (answered 408) and an idle
        # keep-alive's (closed): moving the deadline later only moves ``_deadline_at``, and the
        # timer, when it fires early, sets itself again for the rest (moving it earlier than
        # the timer sets the timer again). Arming and cancelling two timers per request
        # (uvicorn's keep-alive and the request's) was a measurable part of a heartbeat
        # request's cost.
        self._deadline: asyncio.TimerHandle | None = None
        self._deadline_at: float | None = None
        self._idle = False
        self._linger: asyncio.TimerHandle | None = None
        self._head_bytes = 0
        self._refused = False
        cap = self.limits.max_connections
        if len(self.connections) > cap:
            self._refuse(
                TOO_MANY_CONNECTIONS,
                f"the server has {cap} connections open, its limit (--max-connections)",
            )
            return
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        for timer in (self._deadline, self._linger):
            if timer is not None:
                timer.cancel()
        self._deadline = self._linger = None
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        """uvicorn's own (the next pipelined request, or the keep-alive deadline), with the
        keep-alive deadline on this connection's one timer."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self._set_deadline(self.timeout_keep_alive, idle=True)

    # Once a connection is refused, whatever else its client sends is dropped unread.

    def data_received(self, data: bytes) -> None:
        """uvicorn's, but for the upgrade of a channel: the bytes after its request go to it."""
        if self._refused:
            return
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.send_400_response("Invalid HTTP request received.")
        except httptools.HttpParserUpgrade as upgrade:
            if self._should_upgrade():
                self._open_channel(data[upgrade.args[0] :] if upgrade.args else b"")
            else:
                self._unsupported_upgrade_warning()

    def _should_upgrade(self) -> bool:
        """The only upgrade this server takes: a WebSocket to the agent host channel (uvicorn's
        own WebSocket support is off: ``config``)."""
        return self._get_upgrade() == b"websocket" and self.url.partition(b"?")[0] == channel.PATH

    def _open_channel(self, leftover: bytes) -> None:
        """Answer the channel's opening request: refused (an error, then close), or the
        ``101`` and the connection handed to the channel."""
        self._disarm()
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        limits = self.limits
        try:
            opened = channel.accept(
                self.app.state,
                self.scope["method"],
                self.url,
                self.headers,
                max_message=limits.max_body_bytes,
                max_depth=limits.max_json_depth,
                frame_timeout_s=limits.request_timeout_s,
                idle_s=limits.channel_idle_s,
                on_close=self.connections.discard,
            )
        except (ApiError, AuthError, HostUnavailable) as exc:
            status, fields = _refusal(exc)
            self._refused = True
            self.transport.write(_raw_error(status, **fields))
            self.transport.close()
            return
        self.connections.discard(self)
        self.connections.add(opened.channel)
        self.transport.write(opened.response)
        self.transport.set_protocol(opened.channel)
        opened.channel.start(self.transport, leftover)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0
        if not self._refused:
            self._arm()

    def on_url(self, url: bytes) -> None:
        if self._counted(len(url)):
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._counted(len(name) + len(value) + 4):
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if not self._refused:
            super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if not self._refused:
            self._disarm()
            super().on_message_complete()
            waiting = self._waiting
            if waiting is not None and not waiting[0].more_body:
                self._waiting = None
                self._serve(*waiting)

    # The agents' hot paths on the connection itself (``api.fastpath.OnConnection``): a plain
    # request is not given to the ASGI application; its body is read here and the answer
    # written in one write. Pipelined requests queue behind it as behind any other.

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        paths = self._paths
        if (
            paths is not None
            and not self.flow.write_paused  # the client is not reading: uvicorn's send waits
            and (plan := paths.plan(cycle.scope, HIGH_WATER_LIMIT)) is not None
        ):
            if cycle.more_body:
                self._waiting = (cycle, plan)
            else:  # a pipelined request, read whole while the one before it was answered
                self._serve(cycle, plan)
            return
        super()._start_asgi_task(cycle, app)

    def _serve(self, cycle: RequestResponseCycle, plan: str | UpdatesQuery) -> None:
        paths = self._paths
        assert paths is not None
        if cycle.disconnected:
            return
        if isinstance(plan, UpdatesQuery):
            task = self.loop.create_task(self._poll(paths, cycle, plan))
            task.add_done_callback(self.tasks.discard)
            self.tasks.add(task)  # uvicorn's shutdown waits for it, as for its own
            return
        submitted = paths.submit(cycle.scope, bytes(cycle.body))
        if submitted is None:
            super()._start_asgi_task(cycle, self.app)
            return
        cycle.body = bytearray()
        submitted.outcomes.add_done_callback(
            lambda _: self._write(cycle, paths.answer(cycle.scope, submitted))
        )

    async def _poll(
        self, paths: OnConnection, cycle: RequestResponseCycle, query: UpdatesQuery
    ) -> None:
        self._write(cycle, await paths.poll(cycle.scope, query))

    def _write(self, cycle: RequestResponseCycle, response: Answer) -> None:
        """Write the whole response in one write, then finish the cycle as uvicorn's own
        ``send`` does (keep-alive or close, the next pipelined request)."""
        if cycle.disconnected or cycle.response_complete or self.transport.is_closing():
            return
        status, headers, body = response
        head = [STATUS_LINE[status]]
        for name, value in [*self.server_state.default_headers, *headers]:
            head += [name, b": ", value, b"\r\n"]
        if not cycle.keep_alive:
            head.append(b"connection: close\r\n")
        head += [b"\r\n", body]
        cycle.response_started = cycle.response_complete = True
        self.transport.write(b"".join(head))
        cycle.message_event.set()
        if not cycle.keep_alive:
            self.transport.close()
        cycle.on_response()

    def _counted(self, n: int) -> bool:
        """Count ``n`` more bytes of the request's head; False once the connection is refused."""
        if self._refused or self.transport.is_closing():
            return False
        self._head_bytes += n
        if self._head_bytes <= self.limits.max_header_bytes:
            return True
        self._refuse(
            HEADERS_TOO_LARGE,
            f"the request line and headers are over {self.limits.max_header_bytes} bytes, the "
            "limit (--max-header-bytes)",
        )
        return False

    def _arm(self) -> None:
        """The request deadline, from now."""
        self._set_deadline(self.limits.request_timeout_s, idle=False)

    def _disarm(self) -> None:
        self._deadline_at = None  # the timer, if set, finds nothing due and stops

    def _set_deadline(self, seconds: float, *, idle: bool) -> None:
        self._idle = idle
        self._deadline_at = at = self.loop.time() + seconds
        timer = self._deadline
        if timer is not None and timer.when() > at:  # set for a later deadline: too late now
            timer.cancel()
            timer = None
        if timer is None:
            self._deadline = self.loop.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self._deadline = None
        at = self._deadline_at
        if at is None:
            return
        if self.loop.time() < at:  # the deadline moved later since the timer was set
            self._deadline = self.loop.call_at(at, self._on_timer)
            return
        self._deadline_at = None
        self._timed_out()

    def _timed_out(self) -> None:
        if self._refused or self.transport.is_closing():
            return
        if self._idle:  # a keep-alive connection with no request: closed, as uvicorn does
            self.transport.close()
            return
        if self.cycle is None or self.cycle.response_complete:  # no request is being answered
            self._refuse(
                REQUEST_TIMEOUT,
                f"no complete request within {self.limits.request_timeout_s:g} s "
                "(--request-timeout-s)",
            )
        else:  # its handler waits for the rest of the body, and now sees a disconnect
            self.transport.close()

    def _refuse(self, code: str, detail: str) -> None:
        """Answer and close. Closing a socket with unread input resets the connection, and the
        client may then lose the answer; so the server half-closes, drops what still comes,
        and closes when the client does or after :data:`LINGER_S`."""
        self._disarm()
        self._refused = True
        self.transport.write(_raw_error(status_of(code), code, detail))
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self._linger = self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()


def _refusal(exc: Exception) -> tuple[int, dict[str, Any]]:
    """The status and error fields of a refused channel opening (``code`` for ``error``)."""
    answer = answer_of(exc)
    assert answer is not None, exc
    status, body = answer
    return status, {"code": body.pop("error"), **body}


def guarded_http(limits: Limits) -> type[GuardedHttp]:
    """The protocol class for these limits (uvicorn makes one protocol per connection)."""
    return type("GuardedHttp", (GuardedHttp,), {"limits": limits})


def config(
    app: Any, host: str, port: int, log_level: str, limits: Limits | None = None
) -> uvicorn.Config:
    """The server settings: the connection limits above, no access log, no per-request work the
    coordinator has no use for (proxy headers, Server/Date headers), three seconds to drain on
    shutdown."""
    limits = limits or Limits()
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        http=guarded_http(limits),
        ws="none",  # the one WebSocket is the host channel, which GuardedHttp opens itself
        timeout_keep_alive=limits.keep_alive_s,
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=3,
        proxy_headers=False,
        server_header=False,
        date_header=False,
    )
