"""The client side of the agent host channel (``GET /agents/channel``, docs/protocol.md).

One WebSocket per agent host carries its ranks' event batches up and the coordinator's updates
down: :meth:`HostChannel.call` sends ``{"id", "events"}`` and returns the answer with that id
(several may be in flight); every updates message the coordinator pushes goes to ``on_updates``
as it arrives. The framing is ``wire.websocket``; this module adds the asyncio transport, the
opening handshake and the masking keys a client must draw.

The simulated agent hosts (``agent.simhost``) use it in their event loop, and the launcher's
relay (``agent.relay``) on an event loop of its own, so both speak the channel exactly alike.
"""

from __future__ import annotations

import asyncio
import base64
import os
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple
from urllib.parse import quote, urlsplit

import msgspec

from ..wire import ranks as rank_sets
from ..wire import websocket as ws
from ..wire.protocol import FEATURES, PROTOCOL

PATH = "/agents/channel"
#: A channel that has sent nothing for this long pings, so the coordinator (whose limit is
#: ``--channel-idle-s``, 60 s by default) does not close it as idle.
PING_S = 20.0
#: The header of the ``101`` in which a coordinator with a lease names it: a channel that
#: hears nothing from it for that long (it pings more often) is aborted as silent, and its
#: address is tried last for as long again (``api.channel.LIVENESS_HEADER``).
LIVENESS_HEADER = b"foldplane-liveness-s"
#: The largest message the coordinator may send (a resync of a 65,536-rank view is ~0.5 MB).
MAX_MESSAGE = 64 << 20

_encode = msgspec.json.encode
_decode = msgspec.json.decode


class Answered(NamedTuple):
    """A batch's answer and the bytes it took on the wire (frame header included)."""

    body: dict[str, Any]
    nbytes: int


class ChannelRefused(Exception):
    """The coordinator answered the opening request with an error: ``status`` and its body
    (``{"error", "detail"}``, with ``leader`` on a ``503 not_leader``)."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"{status}: {body}")
        self.status = status
        self.body = body


class ChannelClosed(Exception):
    """The channel is closed: the coordinator closed it (its close code and reason, and the
    error message it sent before, if any) or the connection was lost."""


def channel_target(group: str | None, ranks: Sequence[int], after: int, view: int | None) -> str:
    """The opening request's path and query."""
    query = f"protocol={PROTOCOL}&features={','.join(FEATURES)}&after={after}"
    if group is not None:
        query += f"&group={quote(group, safe='')}&ranks={rank_sets.format_query(ranks)}"
    if view is not None:
        query += f"&view={view}"
    return f"{PATH}?{query}"


class HostChannel(asyncio.Protocol):
    """One open channel; see the module docstring. Build it with :func:`open_channel`."""

    def __init__(self, on_updates: Callable[[Mapping[str, Any]], None] | None) -> None:
        self.on_updates = on_updates
        self.transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self._head = bytearray()
        self._opening: asyncio.Future[None] = self._loop.create_future()
        self._key = base64.b64encode(os.urandom(16)).decode("ascii")
        self._reader = ws.FrameReader(masked=False, max_message=MAX_MESSAGE)
        self._calls: dict[int, asyncio.Future[Answered]] = {}
        self._next_id = 0
        self._ping: asyncio.TimerHandle | None = None
        self._sent_at = self._loop.time()
        #: the coordinator's lease, when it named one: the longest it may stay silent
        self.liveness_s: float | None = None
        self._heard_at = self._sent_at
        self._watch: asyncio.TimerHandle | None = None
        #: the channel was aborted because the coordinator sent nothing for ``liveness_s``
        self.silent = False
        #: where it is open (set by :func:`open_channel`)
        self.address: tuple[str, int] | None = None
        #: why the channel ended, once it has
        self.closed: ChannelClosed | None = None
        #: an error message the coordinator sent without an id (it closes after it)
        self.error: Mapping[str, Any] | None = None
        #: bytes received after the handshake (what the coordinator sent this host), and the
        #: part of them that were updates pushed
        self.bytes_received = 0
        self.bytes_pushed = 0
        self.ended: asyncio.Future[None] = self._loop.create_future()

    # -- use ---------------------------------------------------------------------------------------

    async def call(
        self, events: Sequence[Mapping[str, Any]], timeout: float | None = None
    ) -> Answered:
        """Send one batch; its answer (``{"id", "term", "results"}``, or ``{"id", "error",
        "detail"}`` when the coordinator could not take it). Raises :class:`ChannelClosed`
        when the channel ends first, ``TimeoutError`` after ``timeout`` seconds (the caller
        should then abort the channel: the coordinator may be frozen)."""
        return await self.send(events, timeout)

    def send(
        self, events: Sequence[Mapping[str, Any]], timeout: float | None = None
    ) -> asyncio.Future[Answered]:
        """:meth:`call` without the coroutine: the batch is written now, and the future is
        its answer (for a caller that goes on from a callback)."""
        future: asyncio.Future[Answered] = self._loop.create_future()
        if self.closed is not None:
            future.set_exception(self.closed)
            return future
        batch_id = self._next_id
        self._next_id += 1
        self._calls[batch_id] = future
        self._send(ws.TEXT, _encode({"id": batch_id, "events": events}))
        expiry = None if timeout is None else self._loop.call_later(timeout, _expire, future)
        future.add_done_callback(lambda _: self._settled(batch_id, expiry))
        return future

    def _settled(self, batch_id: int, expiry: asyncio.TimerHandle | None) -> None:
        self._calls.pop(batch_id, None)
        if expiry is not None:
            expiry.cancel()

    def close(self, code: int = ws.NORMAL, reason: str = "") -> None:
        """Close (the calls in flight raise :class:`ChannelClosed`)."""
        transport = self.transport
        if transport is not None and not transport.is_closing():
            if self._opening.done():
                self._send(ws.CLOSE, ws.close_payload(code, reason))
            transport.close()
        self._end(ChannelClosed(f"closed by this host ({reason or code})"))

    def abort(self) -> None:
        """Drop the connection at once (a coordinator that stopped answering)."""
        if self.transport is not None:
            self.transport.abort()
        self._end(ChannelClosed("aborted by this host: the coordinator did not answer"))

    # -- the connection ----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(ChannelClosed(f"the connection was lost ({exc or 'EOF'})"))

    def data_received(self, data: bytes) -> None:
        if not self._opening.done():
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                if len(self._head) > 65536:
                    self._fail_opening(ChannelClosed("an opening answer over 64 kB of headers"))
                return
            if not self._opened(bytes(self._head[:end]), bytes(self._head[end + 4 :])):
                return
            data = bytes(self._head[end + 4 :])
            self._head = bytearray()
            if not data:
                return
        self.bytes_received += len(data)
        self._heard_at = self._loop.time()
        try:
            messages = self._reader.feed(data)
        except ws.FrameError as exc:
            self.close(exc.code, exc.reason)
            return
        for message in messages:
            if message.opcode == ws.TEXT:
                self._on_text(message.payload)
            elif message.opcode == ws.PING:
                self._send(ws.PONG, message.payload)
            elif message.opcode == ws.CLOSE:
                code, reason = ws.parse_close(message.payload)
                detail = f": {self.error}" if self.error else ""
                self._end(
                    ChannelClosed(f"the coordinator closed the channel ({code} {reason}){detail}")
                )
                self._send(ws.CLOSE, message.payload[:2])  # the closing handshake's echo
                if self.transport is not None:
                    self.transport.close()
                return
            elif message.opcode == ws.BINARY:
                self.close(ws.UNSUPPORTED_DATA, "a binary message")

    def _opened(self, head: bytes, rest: bytes) -> bool:
        """Read the answer to the opening request: True once the ``101`` is checked."""
        lines = head.split(b"\r\n")
        try:
            status = int(lines[0].split(b" ", 2)[1])
        except (IndexError, ValueError):
            self._fail_opening(ChannelClosed(f"not an HTTP answer: {lines[0][:80]!r}"))
            return False
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        if status != 101:
            length = int(headers.get(b"content-length", b"0") or 0)
            if len(rest) < length:
                return False  # the error body is still arriving
            try:
                body: Any = _decode(rest[:length]) if length else None
            except msgspec.DecodeError:
                body = rest[:length].decode("utf-8", "replace")
            self._fail_opening(ChannelRefused(status, body))
            return False
        if headers.get(b"sec-websocket-accept", b"").decode("latin-1") != ws.accept_key(self._key):
            self._fail_opening(ChannelClosed("the coordinator's Sec-WebSocket-Accept is wrong"))
            return False
        self.liveness_s = _seconds(headers.get(LIVENESS_HEADER))
        self._heard_at = self._loop.time()
        self._opening.set_result(None)
        self._ping = self._loop.call_later(PING_S, self._maybe_ping)
        if self.liveness_s is not None:
            self._watch = self._loop.call_later(self.liveness_s, self._check_heard)
        return True

    def _fail_opening(self, exc: Exception) -> None:
        if not self._opening.done():
            self._opening.set_exception(exc)
        if self.transport is not None:
            self.transport.close()

    def _on_text(self, payload: bytes) -> None:
        try:
            message = _decode(payload)
        except msgspec.DecodeError as exc:
            self.close(ws.INVALID_DATA, f"a message that is not JSON: {exc}")
            return
        if not isinstance(message, dict):
            self.close(ws.INVALID_DATA, "a message that is not a JSON object")
            return
        nbytes = len(payload) + ws.header_size(len(payload), masked=False)
        if "updates" in message:
            self.bytes_pushed += nbytes
            if self.on_updates is not None:
                self.on_updates(message)
            return
        batch_id = message.get("id")
        future = self._calls.get(batch_id) if isinstance(batch_id, int) else None
        if future is not None:
            if not future.done():
                future.set_result(Answered(message, nbytes))
        elif "error" in message:
            self.error = message  # about the channel itself: a close follows

    def _send(self, opcode: int, payload: bytes) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        self._sent_at = self._loop.time()
        transport.write(ws.frame(opcode, payload, mask_key=_mask_key()))

    def _maybe_ping(self) -> None:
        if self.closed is not None:
            return
        idle = self._loop.time() - self._sent_at
        if idle >= PING_S:
            self._send(ws.PING, b"")
            idle = 0.0
        self._ping = self._loop.call_later(PING_S - idle, self._maybe_ping)

    def _check_heard(self) -> None:
        """Abort the channel once the coordinator has sent nothing for its lease: a leader
        that lives writes (at least a ping) several times per lease, and one silent that long
        cannot have renewed its lease either: frozen, cut off, or deposed."""
        assert self.liveness_s is not None
        if self.closed is not None:
            return
        silent_s = self._loop.time() - self._heard_at
        if silent_s < self.liveness_s:
            self._watch = self._loop.call_later(self.liveness_s - silent_s, self._check_heard)
            return
        self.silent = True
        if self.transport is not None:
            self.transport.abort()
        self._end(
            ChannelClosed(
                f"the coordinator sent nothing for {silent_s:.2f} s, longer than its "
                f"{self.liveness_s:g} s lease: frozen or cut off"
            )
        )

    def _end(self, why: ChannelClosed) -> None:
        if self.closed is not None:
            return
        self.closed = why
        if self._watch is not None:
            self._watch.cancel()
        if self._ping is not None:
            self._ping.cancel()
        if not self._opening.done():
            self._opening.set_exception(why)
        for future in self._calls.values():
            if not future.done():
                future.set_exception(why)
        if not self.ended.done():
            self.ended.set_result(None)


def _seconds(value: bytes | None) -> float | None:
    """A positive number of seconds from a header, or None (absent or not such a number)."""
    try:
        seconds = float(value) if value else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 < seconds < float("inf") else None


def _expire(future: asyncio.Future[Answered]) -> None:
    if not future.done():
        future.set_exception(TimeoutError("no answer in time"))


#: Masking keys are drawn from the system's random source a few thousand at a time: a key per
#: frame, each unpredictable, without a system call per frame.
_KEYS = bytearray()


def _mask_key() -> bytes:
    global _KEYS
    if not _KEYS:
        _KEYS = bytearray(os.urandom(16384))
    key = bytes(_KEYS[-4:])
    del _KEYS[-4:]
    return key


async def open_channel(
    host: str,
    port: int,
    *,
    group: str | None = None,
    ranks: Sequence[int] = (),
    after: int = 0,
    view: int | None = None,
    authorization: str | None = None,
    on_updates: Callable[[Mapping[str, Any]], None] | None = None,
    timeout: float = 10.0,
    tls: bool = False,
) -> HostChannel:
    """Open a channel to the coordinator at ``host:port`` for ``ranks`` of ``group`` (none:
    events only), its updates after ``after``; ``tls``: over TLS (a coordinator behind an
    ``https://`` address), the certificate checked as the system trusts it. Raises
    :class:`ChannelRefused` when the coordinator refuses it (``503 not_leader`` names the
    leader), ``OSError`` or ``TimeoutError`` when it cannot be reached."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(timeout):
        transport, channel = await loop.create_connection(
            lambda: HostChannel(on_updates),
            host,
            port,
            ssl=ssl.create_default_context() if tls else None,
        )
        try:
            lines = [
                f"GET {channel_target(group, ranks, after, view)} HTTP/1.1",
                f"host: {host}:{port}",
                "connection: Upgrade",
                "upgrade: websocket",
                f"sec-websocket-version: {ws.VERSION}",
                f"sec-websocket-key: {channel._key}",
            ]
            if authorization:
                lines.append(f"authorization: {authorization}")
            transport.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
            await channel._opening
        except BaseException:
            transport.close()
            raise
    channel.address = (host, port)
    return channel


class ChannelLink:
    """Opens host channels to whichever coordinator of a list leads: a refused connection moves
    on to the next address, a ``503 not_leader`` (at the opening, or in the error a channel
    closed with) to the leader it names, and the next opening starts where the last one
    succeeded (the rules of ``agent.client.CoordinatorClient``).

    A channel aborted as silent (its coordinator sent nothing for its lease: frozen, cut off)
    makes its address a *suspect* for one more lease: openings try the other addresses first,
    and a standby that still names the suspect as the leader (its lease has not run out yet)
    does not send the host back there; the opening fails instead, and the caller's retry soon
    finds the standby that took over. Once the suspicion ends the address is tried again, so a
    leader that was only slow gets its hosts back."""

    def __init__(
        self,
        addresses: Sequence[tuple[str, int]],
        *,
        authorization: str | None = None,
        timeout_s: float = 10.0,
        tls: bool = False,
    ) -> None:
        if not addresses:
            raise ValueError("a channel needs at least one coordinator address")
        self.addresses = list(addresses)
        self.authorization = authorization
        self.timeout_s = timeout_s
        #: the coordinators are behind ``https://`` addresses
        self.tls = tls
        self._at = 0
        #: address -> until when (``time.monotonic()``) it is tried last
        self._suspects: dict[tuple[str, int], float] = {}

    async def open(
        self,
        *,
        group: str | None = None,
        ranks: Sequence[int] = (),
        after: int = 0,
        view: int | None = None,
        on_updates: Callable[[Mapping[str, Any]], None] | None = None,
    ) -> HostChannel:
        """A channel to the leader; raises the last address's failure when none took it."""
        tries = 0
        redirects = 0
        while True:
            self._avoid_suspects()
            host, port = self.addresses[self._at]
            try:
                return await open_channel(
                    host,
                    port,
                    group=group,
                    ranks=ranks,
                    after=after,
                    view=view,
                    authorization=self.authorization,
                    on_updates=on_updates,
                    timeout=self.timeout_s,
                    tls=self.tls,
                )
            except ChannelRefused as exc:
                if exc.status == 503 and redirects < 2 * len(self.addresses):
                    redirects += 1
                    if self.follow(exc.body):
                        continue
                    tries += 1
                    if tries < len(self.addresses):
                        self._at = (self._at + 1) % len(self.addresses)
                        continue
                raise
            except (OSError, TimeoutError, ChannelClosed):
                tries += 1
                self._at = (self._at + 1) % len(self.addresses)
                if tries >= len(self.addresses):
                    raise

    def closed(self, channel: HostChannel) -> None:
        """A channel ended: if the coordinator said who leads, the next opening goes there; if
        it fell silent, its address is a suspect (see the class docstring)."""
        if channel.error is not None:
            self.follow(channel.error)
        if channel.silent and channel.address is not None and channel.liveness_s is not None:
            self._suspects[channel.address] = time.monotonic() + channel.liveness_s
            self._avoid_suspects()

    def suspect(self, address: tuple[str, int]) -> bool:
        """Whether ``address`` fell silent less than a lease ago."""
        until = self._suspects.get(address)
        if until is None:
            return False
        if time.monotonic() >= until:
            del self._suspects[address]
            return False
        return True

    def _avoid_suspects(self) -> None:
        """Move off a suspect address to the next one that is not, if there is one."""
        n = len(self.addresses)
        for step in range(n):
            at = (self._at + step) % n
            if not self.suspect(self.addresses[at]):
                self._at = at
                return

    def follow(self, error: Any) -> bool:
        """Move to the leader an error body names; whether it named another address (one that
        is not a suspect)."""
        leader = error.get("leader") if isinstance(error, dict) else None
        if not leader:
            return False
        address = _address(str(leader))
        if address == self.addresses[self._at] or self.suspect(address):
            return False
        if address not in self.addresses:
            self.addresses.append(address)
        self._at = self.addresses.index(address)
        return True


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url if "://" in url else f"http://{url}")
    return parts.hostname or "127.0.0.1", parts.port or 80
