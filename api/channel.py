"""The agent host channel: one WebSocket per agent host, for its events and its updates.

``GET /agents/channel?group=G&ranks=0-7&after=OFFSET&protocol=2`` upgrades the connection to a
WebSocket (RFC 6455; ``wire.websocket`` is the framing) that carries JSON text messages both
ways (docs/protocol.md, "The host channel"):

- the host sends ``{"id": N, "events": [...]}``, the body of ``POST /agents/events`` with an
  id it picks, and gets ``{"id": N, "term", "results"}`` back, the same answer; several batches
  may be in flight, and each is answered when its host future is done (a batch of heartbeats
  waits for its shared record, a batch of ACKs does not wait behind it);
- the coordinator pushes ``{"term", "updates", "next_after", "resync", "store"}``, the answer of
  ``GET /agents/updates`` for the channel's ranks, whenever there is something after what it
  pushed last: no poll to send again after each answer.

This is flodl's per-host relay connection, announcing the ranks it carries: the coordinator
holds one connection per host, reads no HTTP request per batch, and answers a view change with
one push per host instead of a poll's answer and the poll that follows it. The events go through
the functions of the HTTP route (``api.routes.agents.EventsBatch``) and the pushes through the
long poll's (``Host.updates_now`` and the journals' waiters, paced as the polls are), so the two
ways in say the same things.

:func:`accept` decides the opening request (an HTTP error answer for a bad one, in the one error
shape); :class:`HostChannel` is the connection's protocol after the ``101``.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, NamedTuple
from urllib.parse import parse_qsl

import msgspec
from msgspec import Meta

from ..coordinator.auth import Authenticator, Principal
from ..coordinator.host.loop import Host, HostUnavailable
from ..coordinator.host.polls import UpdatesAnswer
from ..wire import websocket as ws
from ..wire.codes import (
    BAD_REQUEST,
    FORBIDDEN,
    INVALID_QUERY,
    INVALID_REQUEST,
    METHOD_NOT_ALLOWED,
    PROTOCOL_MISMATCH,
    RANK_OUT_OF_RANGE,
    UNKNOWN_GROUP,
    UPGRADE_REQUIRED,
)
from ..wire.protocol import (
    PROTOCOL,
    QUERY,
)
from .codec import check_depth, encode_json
from .errors import ApiError, answer_of
from .routes.agents import (
    EventsBatch,
    poll_ranks,
    refuse_unnamed_revisions,
    updates_body,
)

PATH = b"/agents/channel"

log = logging.getLogger("foldplane.api")

#: The ``101`` of a coordinator that leads only while it holds a lease names the lease here:
#: the host may take a channel silent that long for a frozen or deposed leader
#: (``agent.channel``), and this side writes something at least ``KEEPALIVES_PER_LIVENESS``
#: times as often (a ping when it has nothing else to send), so a live leader is never silent.
LIVENESS_HEADER = b"foldplane-liveness-s"
KEEPALIVES_PER_LIVENESS = 4

#: The most batches of one channel waiting for their answers before it is read no further (a
#: host has two lanes, one batch in flight each; a relay a few more).
MAX_IN_FLIGHT = 64


class ChannelQuery(NamedTuple):
    """What the opening request asks: the ranks whose updates the channel carries (none: it
    carries events only), after which offset, and the view the host holds."""

    group: str | None
    ranks: tuple[int, ...]
    after: int
    view: int | None
    #: the named revisions of the protocol the host understands (``wire.protocol.FEATURES``)
    features: str | None = None


_DIGITS = re.compile(r"[0-9]{1,19}")
_FIELDS = frozenset({"group", "rank", "ranks", "after", "protocol", "view", "features"})


def channel_query(raw: bytes) -> ChannelQuery:
    """The opening request's query, or ``ApiError`` naming what is wrong with it."""
    try:
        pairs = parse_qsl(raw.decode("ascii"), keep_blank_values=True, strict_parsing=bool(raw))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ApiError(INVALID_QUERY, f"the query is malformed: {exc}") from None
    fields = dict(pairs)
    if len(fields) != len(pairs):
        raise ApiError(INVALID_QUERY, "a query field is given twice")
    if unknown := sorted(fields.keys() - _FIELDS):
        raise ApiError(INVALID_QUERY, f"unknown query field {unknown[0]!r}")
    protocol = fields.get("protocol")
    if protocol != str(PROTOCOL):
        raise ApiError(
            PROTOCOL_MISMATCH,
            f"this coordinator speaks agent protocol {PROTOCOL}; the channel asks "
            f"{'none' if protocol is None else repr(protocol)}: upgrade the agent "
            "(docs/protocol.md)",
        )
    after = _number(fields, "after", 0)
    view = _number(fields, "view", None)
    group = fields.get("group")
    named = "rank" in fields or "ranks" in fields
    if group is None:
        if named:
            raise ApiError(INVALID_QUERY, "ranks need their group: name group= too")
        return ChannelQuery(None, (), after, view)
    if not 0 < len(group) <= QUERY.group_chars:
        raise ApiError(INVALID_QUERY, f"group must be 1-{QUERY.group_chars} characters long")
    if not named:
        raise ApiError(
            INVALID_QUERY,
            "a channel for a group names the ranks it carries (ranks=0-7 or rank=R)",
        )
    rank = fields.get("rank")
    if rank is not None and not _DIGITS.fullmatch(rank):
        raise ApiError(INVALID_QUERY, f"rank must be a number, got {rank!r}")
    ranks = poll_ranks(None if rank is None else int(rank), fields.get("ranks"))
    if ranks[-1] > QUERY.max_rank:
        raise ApiError(INVALID_QUERY, f"rank {ranks[-1]} is over {QUERY.max_rank}")
    return ChannelQuery(group, ranks, after, view, fields.get("features"))


def _number(fields: dict[str, str], name: str, default: int | None) -> Any:
    value = fields.get(name)
    if value is None:
        return default
    if not _DIGITS.fullmatch(value) or int(value) > QUERY.max_offset:
        raise ApiError(INVALID_QUERY, f"{name} must be a number from 0 to {QUERY.max_offset}")
    return int(value)


@dataclass(frozen=True, slots=True)
class Opened:
    """An accepted opening request: the ``101`` to write and the channel to hand the
    connection to."""

    response: bytes
    channel: HostChannel


def accept(
    state: Any, method: str, url: bytes, headers: list[tuple[bytes, bytes]], **options: Any
) -> Opened:
    """Decide the opening request of a channel; ``ApiError``, ``AuthError`` or
    ``HostUnavailable`` say why it is refused. ``options`` are :class:`HostChannel`'s."""
    if method != "GET":
        raise ApiError(METHOD_NOT_ALLOWED, f"{PATH.decode()} is opened with GET")
    head = _head(headers)
    if head.version != ws.VERSION.encode():
        raise ApiError(
            UPGRADE_REQUIRED,
            f"the channel speaks WebSocket version {ws.VERSION}; the request says "
            f"{head.version.decode('latin-1') if head.version else 'none'}",
        )
    key = head.key.decode("latin-1") if head.key is not None else ""
    if not ws.valid_key(key):
        raise ApiError(BAD_REQUEST, "Sec-WebSocket-Key must be the base64 of 16 bytes")
    _, _, query = url.partition(b"?")
    asked = channel_query(query)
    auth: Authenticator = state.auth
    principal = auth.authenticate(
        None if head.authorization is None else head.authorization.decode("latin-1")
    )
    host: Host = state.host
    if asked.group is not None:
        group = asked.group
        denied = [r for r in asked.ranks if not principal.speaks_for(group, r)]
        if denied:
            raise ApiError(
                FORBIDDEN,
                f"{principal.describe()} may not carry ranks {denied[:8]} of {group!r}",
            )
        config = host.reads.group_config(group)
        if config is None:
            raise ApiError(UNKNOWN_GROUP, f"no group {group!r}")
        if asked.ranks[-1] >= config.world_size:
            raise ApiError(
                RANK_OUT_OF_RANGE,
                f"rank {asked.ranks[-1]} is not in 0..{config.world_size - 1} of group {group!r}",
            )
        refuse_unnamed_revisions(host, group, asked.features, "channel")
    if (unavailable := host.available()) is not None:
        raise unavailable
    host.role.check_polls("not leading")
    liveness_s = host.role.liveness_s
    response = (
        b"HTTP/1.1 101 Switching Protocols\r\n"
        b"upgrade: websocket\r\n"
        b"connection: Upgrade\r\n"
        b"sec-websocket-accept: %s\r\n" % ws.accept_key(key).encode("ascii")
    )
    if liveness_s is not None:
        response += b"%s: %s\r\n" % (LIVENESS_HEADER, repr(float(liveness_s)).encode("ascii"))
    response += b"\r\n"
    keepalive_s = None if liveness_s is None else liveness_s / KEEPALIVES_PER_LIVENESS
    channel = HostChannel(state, principal, asked, keepalive_s=keepalive_s, **options)
    return Opened(response, channel)


class _Head(NamedTuple):
    version: bytes | None
    key: bytes | None
    authorization: bytes | None


def _head(headers: list[tuple[bytes, bytes]]) -> _Head:
    version = key = authorization = None
    for name, value in headers:
        if name == b"sec-websocket-version" and version is None:
            version = value.strip()
        elif name == b"sec-websocket-key" and key is None:
            key = value.strip()
        elif name == b"authorization" and authorization is None:
            authorization = value
    return _Head(version, key, authorization)


class _BatchId(msgspec.Struct):
    """What a channel message has besides the batch, which ``EventsBatch`` reads: its id."""

    id: Annotated[int, Meta(ge=0, le=2**53)]


_decode_id = msgspec.json.Decoder(_BatchId).decode
#: where the hosts put the id, first: read without decoding what follows
_LEADING_ID = re.compile(rb'\s*\{\s*"id"\s*:\s*([0-9]{1,16})\s*[,}]')


def _leading_id(payload: bytes) -> int | None:
    """The id at the start of a message the decoder could not read (nested past its depth)."""
    found = _LEADING_ID.match(payload)
    return int(found.group(1)) if found is not None and int(found.group(1)) <= 2**53 else None


class HostChannel(asyncio.Protocol):
    """One open channel (see the module docstring); the connection's protocol after the ``101``.

    Time limits, on one timer: a frame begun must arrive whole within ``frame_timeout_s``
    (else close ``1008``), and a channel that sends nothing at all, not even a ping, for
    ``idle_s`` is closed (``1001``). With ``keepalive_s`` (a leader with a lease), a ping goes
    out whenever nothing else was written for that long, so the host can tell a live leader
    from a frozen one by silence alone. Back pressure: while the client does not read (the
    transport's write buffer over its high-water mark) pushes wait, to resume from the journals
    once it drained, and nothing more is read from it; nor while :data:`MAX_IN_FLIGHT` of its
    batches wait for their answers. So a client that sends without reading holds a bounded
    amount of the coordinator's memory. On shutdown the batches in flight are answered, then
    the channel closes (``1001``), and the host reconnects to whichever coordinator leads.
    """

    def __init__(
        self,
        state: Any,
        principal: Principal,
        query: ChannelQuery,
        *,
        max_message: int,
        max_depth: int,
        frame_timeout_s: float,
        idle_s: float,
        keepalive_s: float | None = None,
        on_close: Callable[[HostChannel], None] | None = None,
    ) -> None:
        self.state = state
        self.host: Host = state.host
        self.principal = principal
        self.query = query
        self.after = query.after
        self.max_depth = max_depth
        self.frame_timeout_s = frame_timeout_s
        self.idle_s = idle_s
        self.keepalive_s = keepalive_s
        self._on_close = on_close
        self._reader = ws.FrameReader(masked=True, max_message=max_message)
        self.transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        #: batches queued for the host and not yet answered
        self._in_flight = 0
        #: why reading is paused: the client does not read, or too many batches in flight;
        #: and the messages received but not acted on meanwhile
        self._held: set[str] = set()
        self._backlog: deque[ws.Message] = deque()
        self._closing = False
        self._paused = False
        #: the host resumed past this fold: the log is asked why before anything is pushed
        self._checking_ahead = False
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._heard = self._loop.time()
        self._written = self._heard
        #: since when a frame has been half-received (None: nothing pending)
        self._partial_since: float | None = None

    # -- the connection ----------------------------------------------------------------------------

    def start(self, transport: asyncio.Transport, leftover: bytes) -> None:
        """The ``101`` is written: take the connection over, push what is there already."""
        self.transport = transport
        self._arm()
        if self.query.group is not None:
            if self.after > self.host.core.applied:
                self._check_ahead()
            else:
                self._push_or_wait()
        if leftover:
            self.data_received(leftover)

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        now = self._loop.time()
        self._heard = now
        try:
            messages = self._reader.feed(data)
        except ws.FrameError as exc:
            self.close(exc.code, exc.reason)
            return
        if not self._reader.pending:
            self._partial_since = None
        elif self._partial_since is None:  # a frame begun: its deadline may be the next one
            self._partial_since = now
            if self._timer is not None and self._timer.when() > self._next_deadline():
                self._timer.cancel()
                self._arm()
        self._backlog.extend(messages)
        self._take_messages()

    def _take_messages(self) -> None:
        """Act on the messages received, in order, while nothing holds the channel back."""
        backlog = self._backlog
        while backlog and not self._held and not self._closing:
            message = backlog.popleft()
            opcode = message.opcode
            if opcode == ws.TEXT:
                self._on_batch(message.payload)
            elif opcode == ws.PING:
                self._write(ws.frame(ws.PONG, message.payload))
            elif opcode == ws.CLOSE:  # the closing handshake: its code echoed, when it may be
                code, _ = ws.parse_close(message.payload)
                if len(message.payload) < 2:  # no code at all
                    self.close(ws.NORMAL, "")
                elif ws.sendable_close_code(code):
                    self.close(code, "")
                else:
                    self.close(ws.PROTOCOL_ERROR, f"close code {code} may not be sent")
            elif opcode == ws.BINARY:
                self.close(ws.UNSUPPORTED_DATA, "the channel carries JSON text messages only")
            # a pong needs nothing: hearing it was the point

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._stop_waiting()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._on_close is not None:
            self._on_close(self)

    def pause_writing(self) -> None:
        self._paused = True
        self._hold("writing")

    def resume_writing(self) -> None:
        self._paused = False
        self._release("writing")
        if not self._closing and self.query.group is not None and self._waiter is None:
            self._push_or_wait()

    def _hold(self, why: str) -> None:
        if not self._held and self.transport is not None:
            self.transport.pause_reading()
        self._held.add(why)

    def _release(self, why: str) -> None:
        if why in self._held:
            self._held.discard(why)
            if not self._held and self.transport is not None and not self.transport.is_closing():
                self.transport.resume_reading()
                self._take_messages()

    def shutdown(self) -> None:
        """The server is shutting down (uvicorn calls this on every connection): take no more
        batches, answer those in flight, then close ``1001``."""
        self._closing = True
        self._stop_waiting()
        if self._in_flight == 0:
            self._close_now(ws.GOING_AWAY, "the coordinator is shutting down")

    def close(self, code: int, reason: str) -> None:
        """Close the channel with ``code`` (its batches in flight are not answered)."""
        self._closing = True
        self._stop_waiting()
        self._close_now(code, reason)

    def _close_now(self, code: int, reason: str) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(ws.frame(ws.CLOSE, ws.close_payload(code, reason)))
            transport.close()

    def _write(self, data: bytes) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(data)
            if self.keepalive_s is not None:
                self._written = self._loop.time()

    # -- time limits (one timer: the next deadline of either kind) ---------------------------------

    def _arm(self) -> None:
        self._timer = self._loop.call_at(self._next_deadline(), self._on_timer)

    def _next_deadline(self) -> float:
        at = self._heard + self.idle_s
        if self._partial_since is not None:
            at = min(at, self._partial_since + self.frame_timeout_s)
        if self.keepalive_s is not None:
            at = min(at, self._written + self.keepalive_s)
        return at

    def _on_timer(self) -> None:
        self._timer = None
        if self._closing:
            return
        now = self._loop.time()
        if self._held:  # not reading: a frame half-read is not the client's delay
            if self._partial_since is not None:
                self._partial_since = now
            if "in flight" in self._held:  # the host is behind, not the client: no idling
                self._heard = now
        if self._partial_since is not None and now >= self._partial_since + self.frame_timeout_s:
            self.close(
                ws.POLICY_VIOLATION,
                f"a frame not sent whole within {self.frame_timeout_s:g} s (--request-timeout-s)",
            )
            return
        if now >= self._heard + self.idle_s:
            self.close(ws.GOING_AWAY, f"nothing received for {self.idle_s:g} s")
            return
        if self.keepalive_s is not None and now >= self._written + self.keepalive_s:
            self._write(ws.frame(ws.PING, b""))
            self._written = now  # even when nothing could be written: no busy timer
        self._arm()

    # -- events ------------------------------------------------------------------------------------

    def _on_batch(self, payload: bytes) -> None:
        """One ``{"id", "events"}`` message: its records queued, its answer written when the
        host's future is done."""
        try:
            batch_id: int | None = _decode_id(payload).id
        except RecursionError:  # nested past the decoder's depth: refused below, by its id
            batch_id = _leading_id(payload)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            try:
                check_depth(payload, self.max_depth)  # a message too deep says so first
            except ApiError as deep:
                self._write_message({"id": None, **_error(deep)})
                return
            self._write_message(
                {
                    "id": None,
                    "error": INVALID_REQUEST,
                    "detail": f"a channel message is a JSON object with an integer id (0 to "
                    f"2**53) and an events list: {exc}",
                }
            )
            return
        try:
            batch = EventsBatch.read(self.state, self.principal, payload)
            if batch_id is None:  # the decoder's depth is past --max-json-depth's bound
                raise ApiError(INVALID_REQUEST, "a channel message needs an integer id")
            future = self.host.enqueue_many(batch.records, normalized=True)
        except (ApiError, HostUnavailable) as exc:
            self._write_message({"id": batch_id, **_error(exc)})
            return
        self._in_flight += 1
        if self._in_flight >= MAX_IN_FLIGHT:
            self._hold("in flight")
        future.add_done_callback(lambda done: self._answer(batch_id, batch, done))

    def _answer(self, batch_id: int, batch: EventsBatch, done: asyncio.Future[Any]) -> None:
        self._in_flight -= 1
        if self._in_flight < MAX_IN_FLIGHT:
            self._release("in flight")
        try:
            body = batch.answer(done.result(), self.host.log.term, batch_id=batch_id)
        except HostUnavailable as exc:
            self._write_message({"id": batch_id, **_error(exc)})
        else:
            self._write(ws.frame(ws.TEXT, body))
        if self._in_flight == 0 and self._closing:
            self._close_now(ws.GOING_AWAY, "the coordinator is shutting down")

    def _write_message(self, message: dict[str, Any]) -> None:
        self._write(ws.frame(ws.TEXT, encode_json(message)))

    # -- updates -----------------------------------------------------------------------------------

    def _check_ahead(self) -> None:
        """The host resumes past this coordinator's fold: first ask the log why
        (``Host.check_reader_ahead``), then push, or refuse the updates."""
        self._checking_ahead = True
        task = self._loop.create_task(self.host.check_reader_ahead(self.after))
        task.add_done_callback(self._ahead_checked)

    def _ahead_checked(self, task: asyncio.Task[None]) -> None:
        self._checking_ahead = False
        exc = None if task.cancelled() else task.exception()  # retrieved, whatever comes next
        if self._closing:
            return
        if isinstance(exc, HostUnavailable):
            self._refuse_updates(exc)
        elif exc is not None or task.cancelled():
            log.error("channel: checking a host that resumes past the fold failed: %r", exc)
            self.close(ws.INTERNAL_ERROR, "internal error")
        else:
            self._push_or_wait()

    def _push_or_wait(self) -> None:
        """Push what concerns the channel's ranks after what it pushed last, or wait for the
        next publish to their group (the journals wake the waiter, paced as long polls)."""
        if self._paused or self._checking_ahead:
            return  # resume_writing, or the check of a host ahead of the fold, comes back here
        group = self.query.group
        assert group is not None
        host = self.host
        try:
            host.role.check_polls("stepped down")
        except HostUnavailable as exc:
            self._refuse_updates(exc)
            return
        try:
            refuse_unnamed_revisions(host, group, self.query.features, "channel")
        except ApiError as exc:
            self._write_message(_error(exc))
            self.close(ws.POLICY_VIOLATION, exc.code)
            return
        answer = host.updates_now(group, self.query.ranks, self.after, view=self.query.view)
        if answer is not None:
            self._push(answer)
            if self._paused:
                return
            # a resync or a push may leave more behind it only if the journals moved meanwhile;
            # nothing runs in between, so waiting now misses no publish
        waiter = self._waiter = host.journals.waiter(group)
        waiter.add_done_callback(self._woken)

    def _woken(self, waiter: asyncio.Future[None]) -> None:
        if waiter is not self._waiter:
            return
        self._waiter = None
        if self._closing:
            return
        if (unavailable := self.host.available()) is not None:
            self._refuse_updates(unavailable)
            return
        self._push_or_wait()

    def _stop_waiting(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and self.query.group is not None:
            self.host.journals.forget(self.query.group, waiter)

    def _push(self, answer: UpdatesAnswer) -> None:
        self.after = answer.next_after
        self._write(ws.frame(ws.TEXT, encode_json(updates_body(self.host, answer))))

    def _refuse_updates(self, exc: HostUnavailable) -> None:
        """This coordinator no longer serves updates: say why, and close for the host to
        reconnect (to the leader the error names, if any)."""
        self._write_message(_error(exc))
        self.close(ws.TRY_AGAIN_LATER, exc.code)


def _error(exc: Exception) -> dict[str, Any]:
    """An error message's fields, as an HTTP error body would have them."""
    answer = answer_of(exc)
    if answer is None:
        raise exc
    return answer[1]
