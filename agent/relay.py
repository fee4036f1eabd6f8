"""The per-host relay: one channel to the coordinator for every worker process on this host.

The launcher runs it (``python -m foldplane.agent.launch`` does by default) as a small HTTP server on
``127.0.0.1`` at a free port, and gives its workers ``FOLDPLANE_RELAY``; each worker's agent then
sends its events and long-polls its updates through the relay as it would to a coordinator
(docs/protocol.md, "The per-host relay"), while the relay speaks to the coordinator over host
channels (``GET /agents/channel``, ``agent.channel``), exactly as the simulated hosts do: the
coordinator holds a few connections per host instead of one per rank, and reads no HTTP request
per batch or per update. The relay serves exactly the two agent endpoints:

- ``POST /agents/events``: each worker request's events are queued; while one upstream batch is
  in flight, what arrives goes into the next one (up to ``MAX_EVENTS`` events and
  ``MAX_BATCH_BYTES``); requests of nothing but heartbeats have such a lane of their own. The
  relay attaches each worker's agent token (its ``Authorization`` header) to that worker's
  events as ``"token"``, so the coordinator still checks every event against its own rank; the
  answer's results are split back to each worker in order. A batch whose every event carries a
  token goes on a channel whose door token is one of such a batch (one channel, kept open for
  the later ones: each event is decided by its own token, the door only lets it in); a batch of
  events without tokens goes on a channel opened with no token at all, so that such an event
  never travels with another worker's credentials. A merged batch that the coordinator refuses
  as a whole (``REFUSED``: a forged door token, say) is sent again request by request, each
  with its own token at the door, so that each worker gets the answer it alone would have got.
- ``GET /agents/updates``: per ``(group, protocol)`` a *lane* keeps ONE channel open carrying
  the local ranks (``ranks=...``, one agent token per rank at the door), from the lowest offset
  they need, and opens it again when it ends or the ranks it should carry change. What the
  coordinator pushes on it is cached per rank by offset (:class:`UpdateCache`), and each
  worker's poll is answered from the cache, at once when a push brings something: the group's
  updates and its own rank's, after its own ``after``. A rank joins the lane only once a poll
  of its own, forwarded upstream over HTTP with its own token, succeeded: the coordinator, not
  the relay, decides who speaks for a rank, and a wrong token never breaks the lane's channel
  for the others. A poll the cache cannot answer (an ``after`` below what the relay still holds,
  a token other than the one the coordinator accepted, a rank the lane's channel does not carry
  yet) is forwarded upstream on its own.

One event loop, in a thread of the relay's own, runs every channel (:class:`Upstream`); the
workers' request threads hand it their work and wait for the answer with a deadline. An
upstream failure reaches the worker as the error it would have got from the coordinator: its
status and error body (a refused opening, or a batch it could not take), or ``503
coordinator_unavailable`` when no coordinator answered, the channel was lost, or no answer
came in time. Openings follow leader redirects over the launcher's list of coordinator
addresses (:class:`~agent.channel.ChannelLink`). Everything else an agent does (looking its
group up, proposals) and the launcher's death reports still go to the coordinator directly.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import functools
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import msgspec

from ..wire.codes import (
    BAD_ANSWER,
    BODY_TOO_LARGE,
    COORDINATOR_UNAVAILABLE,
    HTTP_ERROR,
    INVALID_REQUEST,
    NESTING_TOO_DEEP,
    NOT_FOUND,
    NOT_LEADER,
    error_body,
    status_of,
)
from ..wire.protocol import MAX_EVENTS, QUERY
from ..wire.ranks import MAX_QUERY_RANKS
from ..wire.updates import (
    AgentUpdate,
    ShutdownUpdate,
    UpdateError,
    addressed_rank,
    decode_updates,
)
from ..wire.updates import encode as encode_update
from .channel import ChannelClosed, ChannelLink, ChannelRefused, HostChannel
from .client import (
    CoordinatorClient,
    CoordinatorError,
    CoordinatorUnavailable,
    parse_addresses,
)

log = logging.getLogger("foldplane.relay")

T = TypeVar("T")

#: The most bytes of events merged into one upstream batch (the coordinator takes 1 MiB).
MAX_BATCH_BYTES = 512 * 1024
#: The largest request body a worker may send, and the largest channel message the relay
#: sends (the coordinator's default limit: a larger message would close the whole channel).
MAX_BODY_BYTES = 1024 * 1024
#: How deep a worker's body may nest (the coordinator's default ``--max-json-depth``).
MAX_JSON_DEPTH = 32
#: The most worker event requests waiting for an upstream batch; beyond, ``503``.
MAX_QUEUED_REQUESTS = 1024
#: How long a worker's event request waits for its upstream answer before ``503``.
EVENTS_WAIT_S = 60.0
#: The longest long poll a worker may ask for (the coordinator's limit).
MAX_POLL_S = QUERY.max_poll_s
#: A rank whose worker has not polled for this long leaves its lane.
RANK_IDLE_S = 30.0
#: How often a lane looks for ranks gone idle while nothing else happens.
IDLE_CHECK_S = RANK_IDLE_S / 3
#: The bytes of updates a lane keeps, at most.
CACHE_BYTES = 4 * 1024 * 1024
#: After a lane's channel failed to open or ended, it waits this long, doubling up to
#: ``BACKOFF_MAX_S``; a channel that brought a push, or stayed open that long, starts it again.
BACKOFF_S = 0.05
BACKOFF_MAX_S = 2.0
#: How long a lane keeps a ``shutdown_with_save`` from its other ranks' workers while the
#: worker of its checkpoint rank has not been handed it (the coordinator's default
#: ``--shutdown-lead-s``, which orders the hosts; this orders the workers of one host).
SHUTDOWN_LEAD_S = 2.0
#: Statuses of a request refused as a whole: a merged one is retried piece by piece.
REFUSED = frozenset({400, 401, 403, 404, 413, 422})

Body = dict[str, Any]
Reply = tuple[int, Body]


def error(code: str, detail: str, *, default_status: int | None = None) -> Reply:
    """An error with ``code``'s status (``wire.codes``): the relay's own, or one a channel
    answered a batch with, which ``POST /agents/events`` would have answered with that status
    (``default_status`` for a code a newer coordinator sends that this relay does not know)."""
    return status_of(code, default_status), error_body(code, detail)


def passed_on(status: int, code: str, detail: str) -> Reply:
    """A coordinator's error, with the status it came with."""
    return status, error_body(code, detail)


class Counters(dict[str, int]):
    """What the relay did, by name; written by many threads, so under a lock."""

    def __init__(self, *names: str) -> None:
        super().__init__(dict.fromkeys(names, 0))
        self._lock = threading.Lock()

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self[name] += n

    def peak(self, name: str, value: int) -> None:
        """Keep the largest ``value`` seen."""
        with self._lock:
            self[name] = max(self[name], value)

    def reset(self, name: str) -> None:
        with self._lock:
            self[name] = 0


# -- events: merge and split (pure) ----------------------------------------------------------


@dataclass
class EventsRequest:
    """One worker's ``POST /agents/events``, waiting for its share of an upstream answer."""

    events: list[Body]
    nbytes: int
    reply: Reply | None = None
    #: every event carries a token of its own (else the request travels with no token at all)
    tokened: bool = False
    done: threading.Event = field(default_factory=threading.Event)

    def answer(self, reply: Reply) -> None:
        self.reply = reply
        self.done.set()


def with_token(events: Iterable[Mapping[str, Any]], token: str | None) -> list[Body]:
    """The events with the worker's agent token as each one's ``token`` (an event that names
    a token of its own keeps it: the coordinator checks whichever the event carries)."""
    out = []
    for event in events:
        event = dict(event)
        if token is not None and "token" not in event:
            event["token"] = token
        out.append(event)
    return out


def take_batch(
    queue: deque[EventsRequest],
    max_events: int = MAX_EVENTS,
    max_bytes: int = MAX_BATCH_BYTES,
) -> list[EventsRequest]:
    """The requests at the head of ``queue`` that fit one upstream batch, removed from it.

    Whole requests only, in arrival order; the first is always taken, even when it alone is
    over a limit (the coordinator then answers it as it would have answered the worker). A
    batch is all of requests whose every event carries a token, or all of requests that do
    not: an event without a token must never travel with another worker's credentials.
    """
    batch: list[EventsRequest] = []
    events = nbytes = 0
    while queue:
        head = queue[0]
        if batch and (
            events + len(head.events) > max_events
            or nbytes + head.nbytes > max_bytes
            or head.tokened != batch[0].tokened
        ):
            break
        batch.append(queue.popleft())
        events += len(head.events)
        nbytes += head.nbytes
    return batch


def split_results(batch: Sequence[EventsRequest], body: Mapping[str, Any]) -> list[Reply]:
    """Each request's share of the upstream answer ``{"term", "results"}``, in order."""
    results = body.get("results")
    wanted = sum(len(r.events) for r in batch)
    if not isinstance(results, list) or len(results) != wanted:
        got = len(results) if isinstance(results, list) else "no"
        reply = error(BAD_ANSWER, f"the coordinator answered {got} results for {wanted}")
        return [reply] * len(batch)
    replies: list[Reply] = []
    start = 0
    for request in batch:
        end = start + len(request.events)
        replies.append((200, {"term": body.get("term"), "results": results[start:end]}))
        start = end
    return replies


# -- updates: the cache (pure) ---------------------------------------------------------------


@dataclass
class Span:
    """``(lo, hi]``: the offsets over which the cache holds every update of its owner."""

    lo: int
    hi: int


@dataclass(frozen=True)
class Served:
    """What the cache answers one rank's poll: updates after its ``after``, and where to resume."""

    updates: tuple[AgentUpdate, ...]
    next_after: int
    resync: bool = False
    #: the resync says the coordinator's log is behind the reader (restored from a copy)
    restored: bool = False


class UpdateCache:
    """What one lane's channel pushed, by offset, bounded in bytes.

    Every push for ranks ``R`` from ``A`` (the previous push's ``next_after``, or the opening's
    ``after``) up to ``next_after`` N is a fact, as an upstream poll's answer after ``A`` is: for
    each rank of ``R``, its updates and the group's in ``(A, N]`` are exactly those in it. The cache
    keeps a :class:`Span` for the group and one per rank over which it holds every update, and
    answers a rank's poll after ``a`` only when both spans reach down to ``a``; otherwise
    :meth:`serve` says None and the poll must go upstream on its own. A ``resync`` answer replaces
    everything: each rank it names gets that answer (its own part of it) once for any ``after``
    below N.

    The saver first: a ``shutdown_with_save`` whose checkpoint rank the push carries is held
    from the push's other ranks (their answers end before its offset) until that rank has been
    served it, or for ``shutdown_lead_s`` at most (:meth:`held_until`), so the worker that saves
    hears of the shutdown while the others still hold their state, as the coordinator orders
    the hosts (docs/protocol.md).
    """

    def __init__(
        self, max_bytes: int = CACHE_BYTES, shutdown_lead_s: float = SHUTDOWN_LEAD_S
    ) -> None:
        self.max_bytes = max_bytes
        self.shutdown_lead_s = shutdown_lead_s
        #: (checkpoint rank, the shutdown's offset, held until this ``time.monotonic()``)
        self._saver: tuple[int, int, float] | None = None
        self.nbytes = 0
        self.dropped = 0  # updates dropped to stay within max_bytes
        self.group: Span | None = None
        self.ranks: dict[int, Span] = {}
        #: offset, seq, rank (``wire.updates.addressed_rank``), update, size
        self._entries: list[tuple[int, int, int | None, AgentUpdate, int]] = []
        self._keys: set[tuple[int, int | None, str]] = set()
        self._seq = 0
        # a resync answer, until each rank it named has polled past it
        self._resync_at = 0
        self._resync_group: tuple[AgentUpdate, ...] = ()
        self._resync_restored = False
        self._resync: dict[int, tuple[AgentUpdate, ...]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def oldest(self) -> int | None:
        """The lowest offset of an update held, or None."""
        return self._entries[0][0] if self._entries else None

    def add(
        self,
        ranks: Iterable[int],
        after: int,
        updates: Sequence[AgentUpdate],
        next_after: int,
        resync: bool = False,
        restored: bool = False,
        now: float | None = None,
    ) -> None:
        """Record a push (or a poll's answer) for ``ranks`` after ``after``."""
        ranks = list(ranks)
        for update in updates:
            if (
                isinstance(update, ShutdownUpdate)
                and update.checkpoint_rank in ranks
                and len(ranks) > 1
                and self._saver is None
            ):
                until = (time.monotonic() if now is None else now) + self.shutdown_lead_s
                self._saver = (update.checkpoint_rank, update.offset, until)
        if resync:
            self._clear()
            self.group = Span(next_after, next_after)
            shared = tuple(u for u in updates if addressed_rank(u) is None)
            self._resync_at, self._resync_group = next_after, shared
            self._resync_restored = restored
            self.nbytes += sum(_size(u) for u in shared)
            for rank in ranks:
                own = tuple(u for u in updates if addressed_rank(u) == rank)
                self._resync[rank] = own
                self.nbytes += sum(_size(u) for u in own)
                self.ranks[rank] = Span(next_after, next_after)
            if self.nbytes > self.max_bytes:  # too big to keep: each rank asks on its own
                self.dropped += len(shared) + len(ranks)
                self._clear()
            return
        next_after = max(next_after, after)
        if self.group is None or after > self.group.hi:
            # nothing held joins this answer: start again from it
            self._clear()
            self.group = Span(after, next_after)
        elif next_after < self.group.lo:
            return  # wholly older than what is held (and may have been dropped): nothing new
        else:
            _join(self.group, after, next_after)
        for rank in ranks:
            span = self.ranks.get(rank)
            if span is None or after > span.hi:
                self.ranks[rank] = Span(after, next_after)
            elif next_after >= span.lo:
                _join(span, after, next_after)
        for update in updates:
            self._insert(update)
        self._trim_to_bytes()

    def held_until(self, now: float | None = None) -> float | None:
        """Until when a shutdown is held for its checkpoint rank (None: nothing is held)."""
        saver = self._saver
        if saver is not None and (time.monotonic() if now is None else now) >= saver[2]:
            self._saver = saver = None
        return None if saver is None else saver[2]

    def serve(self, rank: int, after: int, now: float | None = None) -> Served | None:
        """The answer for ``rank`` after ``after`` (its updates may be none yet: then wait), or
        None when the cache does not hold everything since ``after`` for that rank."""
        served = self._serve(rank, after)
        if served is None or self.held_until(now) is None:
            return served
        assert self._saver is not None
        saver, offset, _ = self._saver
        if rank == saver:
            if served.next_after >= offset:
                self._saver = None  # handed to the checkpoint rank: the others may have it
            return served
        if served.next_after < offset:
            return served
        kept = tuple(u for u in served.updates if u.offset < offset)
        return Served(kept, max(after, offset - 1))

    def _serve(self, rank: int, after: int) -> Served | None:
        own = self._resync.get(rank)
        if own is not None:
            at = self._resync_at
            # A restored log is behind its readers: an ``after`` past its head is no offset of
            # it, and only the reader that resumed at the head has taken the resync in.
            if after < at or (self._resync_restored and after > at):
                merged = sorted(self._resync_group + own, key=_offset)
                return Served(tuple(merged), at, resync=True, restored=self._resync_restored)
            self._drop_resync(rank)
        span, group = self.ranks.get(rank), self.group
        if span is None or group is None or after < span.lo or after < group.lo:
            return None
        hi = min(span.hi, group.hi)
        start = bisect.bisect_right(self._entries, (after, float("inf")))
        out = tuple(
            update
            for offset, _, owner, update, _ in self._entries[start:]
            if offset <= hi and (owner is None or owner == rank)
        )
        return Served(out, max(after, hi))

    def forget(self, rank: int) -> None:
        """``rank`` left the lane: drop what only it needed."""
        self.ranks.pop(rank, None)
        self._drop_resync(rank)
        kept = [e for e in self._entries if e[2] != rank]
        for entry in self._entries:
            if entry[2] == rank:
                self._keys.discard(_key(entry[3]))
                self.nbytes -= entry[4]
        self._entries = kept

    def trim_below(self, offset: int) -> None:
        """Drop the updates at or below ``offset``: every rank of the lane has read past it."""
        cut = bisect.bisect_right(self._entries, (offset, float("inf")))
        if cut:
            self._drop(cut)
        self._raise_floor(offset)

    def _insert(self, update: AgentUpdate) -> None:
        key = _key(update)
        if key in self._keys:
            return
        self._keys.add(key)
        self._seq += 1
        size = _size(update)
        bisect.insort(
            self._entries,
            (update.offset, self._seq, addressed_rank(update), update, size),
        )
        self.nbytes += size

    def _trim_to_bytes(self) -> None:
        if self.nbytes <= self.max_bytes:
            return
        cut, total = 0, self.nbytes
        while cut < len(self._entries) and total > self.max_bytes:
            total -= self._entries[cut][4]
            cut += 1
        floor = self._entries[cut - 1][0] if cut else None
        self.dropped += cut
        self._drop(cut)
        if floor is not None:
            # an update of that offset may remain (several share one): keep none of the offset
            while self._entries and self._entries[0][0] == floor:
                self.dropped += 1
                self._drop(1)
            self._raise_floor(floor)

    def _drop(self, count: int) -> None:
        for entry in self._entries[:count]:
            self._keys.discard(_key(entry[3]))
            self.nbytes -= entry[4]
        del self._entries[:count]

    def _raise_floor(self, offset: int) -> None:
        if self.group is not None:
            self.group.lo = max(self.group.lo, offset)
        for span in self.ranks.values():
            span.lo = max(span.lo, offset)

    def _drop_resync(self, rank: int) -> None:
        own = self._resync.pop(rank, None)
        if own is not None:
            self.nbytes -= sum(_size(u) for u in own)
            if not self._resync:
                self.nbytes -= sum(_size(u) for u in self._resync_group)
                self._resync_group = ()

    def _clear(self) -> None:
        self._entries.clear()
        self._keys.clear()
        self._resync.clear()
        self._resync_group = ()
        self.ranks.clear()
        self.nbytes = 0


def _join(span: Span, lo: int, hi: int) -> None:
    """Widen ``span`` by ``(lo, hi]``, which overlaps or touches it."""
    span.lo = min(span.lo, lo)
    span.hi = max(span.hi, hi)


def _key(update: AgentUpdate) -> tuple[int, int | None, str]:
    return update.offset, addressed_rank(update), update.type


def _offset(update: AgentUpdate) -> int:
    return update.offset


def _size(update: AgentUpdate) -> int:
    return len(encode_update(update))


# -- the upstream side: one event loop for every channel -------------------------------------


class Unreachable(Exception):
    """No coordinator answered: none could be reached, the channel was lost, or no answer came
    in time (the message says which)."""


def channel_addresses(addresses: str | Sequence[str]) -> tuple[list[tuple[str, int]], bool]:
    """The ``(host, port)`` of each coordinator URL, and whether they are ``https://`` (all of
    them or none: one cluster's coordinators are behind TLS or not)."""
    out = []
    schemes = set()
    for url in parse_addresses(addresses):
        parts = urlsplit(url)
        schemes.add(parts.scheme)
        default = 443 if parts.scheme == "https" else 80
        out.append((parts.hostname or "127.0.0.1", parts.port or default))
    if len(schemes) > 1:
        raise ValueError(f"coordinator addresses mix http:// and https://: {addresses!r}")
    return out, schemes == {"https"}


class Upstream:
    """The relay's side toward the coordinator: an event loop in a daemon thread of its own runs
    every channel (the lanes' and the two the event lanes share), and the workers' threads hand
    it coroutines with :meth:`run`."""

    def __init__(self, addresses: str | Sequence[str], timeout_s: float, stats: Counters) -> None:
        self.addresses, self.tls = channel_addresses(addresses)
        self.where = ", ".join(f"{host}:{port}" for host, port in self.addresses)
        self.timeout_s = timeout_s
        #: how long a caller waits for a coroutine: an opening may try every address and
        #: follow redirects, each within ``timeout_s``, and then the answer may take as long
        self.wait_s = timeout_s * (2 * len(self.addresses) + 2)
        self.loop = asyncio.new_event_loop()
        self._stats = stats
        self._lock = threading.Lock()
        self._closed = False
        self._started = False
        self._thread = threading.Thread(
            target=self._serve, name="foldplane-relay-upstream", daemon=True
        )
        # The events channels, by whether they carry batches of tokened events; one opening
        # at a time of each.
        self._channels: dict[bool, HostChannel | None] = {True: None, False: None}
        self._links = {
            tokened: ChannelLink(self.addresses, timeout_s=timeout_s, tls=self.tls)
            for tokened in (True, False)
        }
        self._opening = {tokened: asyncio.Lock() for tokened in (True, False)}

    def start(self) -> None:
        with self._lock:
            self._started = True
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def close(self) -> None:
        """Cancel what runs on the loop, close every channel, stop the loop (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            started = self._started
        if not started:
            self.loop.close()
            return
        done = asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop)
        try:
            done.result(5.0)
        except (TimeoutError, concurrent.futures.CancelledError):
            log.warning("relay: the upstream loop did not stop in time")
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5.0)

    async def _shutdown(self) -> None:
        here = asyncio.current_task()
        tasks = [task for task in asyncio.all_tasks() if task is not here]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for channel in self._channels.values():
            if channel is not None:
                channel.close()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` on the loop until it ends or the relay closes."""
        with self._lock:
            if self._closed:
                coro.close()
                return
            asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call_soon(self, callback: Any) -> None:
        """``callback()`` on the loop, from any thread (nothing once closed)."""
        with self._lock:
            if not self._closed:
                self.loop.call_soon_threadsafe(callback)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result, at most ``wait_s``; raises
        :class:`Unreachable` when it took longer or the relay closed meanwhile."""
        with self._lock:
            if self._closed:
                coro.close()
                raise Unreachable("the relay is shutting down")
            future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(self.wait_s)
        except TimeoutError:
            future.cancel()
            raise Unreachable(
                f"no answer from the coordinator at {self.where} within {self.wait_s:g} s"
            ) from None
        except concurrent.futures.CancelledError:
            raise Unreachable("the relay is shutting down") from None

    # -- events (on the loop) --------------------------------------------------------------------

    async def send(self, events: list[Body], door: str | None) -> Body:
        """One batch on the events channel of its kind (tokened when ``door``, a token of the
        batch, is given): the coordinator's answer, ``{"term", "results"}`` or ``{"error",
        "detail"}``. Raises :class:`ChannelRefused` when the opening was refused, and
        :class:`Unreachable`. A ``not_leader`` answer (the batch was not taken) is sent again
        to the leader it names."""
        tokened = door is not None
        for _ in range(len(self.addresses) + 1):
            channel = await self._events_channel(tokened, door)
            try:
                body, _ = await channel.call(events, self.timeout_s)
            except TimeoutError:
                channel.abort()  # the coordinator may be frozen: the next batch opens another
                raise Unreachable(
                    f"no answer from the coordinator at {self.where} within {self.timeout_s:g} s"
                ) from None
            except ChannelClosed as exc:
                raise Unreachable(f"the channel to {self.where} ended: {exc}") from None
            if body.get("error") != NOT_LEADER:
                return body
            channel.close()
            self._links[tokened].follow(body)
        raise Unreachable(f"no coordinator of {self.where} leads")

    async def _events_channel(self, tokened: bool, door: str | None) -> HostChannel:
        """The open events channel of this kind, or a new one (``door`` at its door)."""
        async with self._opening[tokened]:
            channel = self._channels[tokened]
            if channel is not None and channel.closed is None:
                return channel
            link = self._links[tokened]
            if channel is not None:
                link.closed(channel)
                self._channels[tokened] = None
            link.authorization = f"Bearer {door}" if door is not None else None
            try:
                channel = await link.open()
            except (OSError, TimeoutError, ChannelClosed) as exc:
                raise Unreachable(unreachable(self.where, exc)) from None
            self._channels[tokened] = channel
            self._stats.add("events_channels")
            return channel


def unreachable(where: str, exc: BaseException) -> str:
    return f"no coordinator answered at {where}: {type(exc).__name__}: {exc}"


def refused(exc: ChannelRefused, where: str) -> Reply:
    """What a worker gets for a refused opening: the coordinator's status and error body; a
    ``not_leader`` left after following the redirects means no coordinator leads."""
    body = exc.body
    if not isinstance(body, dict) or not isinstance(body.get("error"), str):
        return passed_on(exc.status, HTTP_ERROR, str(body)[:200])
    if body["error"] == NOT_LEADER:
        return error(
            COORDINATOR_UNAVAILABLE, f"no coordinator of {where} leads: {body.get('detail')}"
        )
    return exc.status, {"error": body["error"], "detail": str(body.get("detail", ""))}


def nesting(value: Any) -> int:
    """How deep ``value``'s arrays and objects nest (a scalar: 0)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = item.values()
        elif not isinstance(item, list):
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in item)
    return deepest


# -- the lanes -------------------------------------------------------------------------------


class EventsLane:
    """Merges the workers' event requests into upstream batches, one in flight at a time."""

    def __init__(self, upstream: Upstream, stats: Counters, name: str) -> None:
        self._upstream = upstream
        self._stats = stats
        self._queue: deque[EventsRequest] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(
            target=self._run, name=f"foldplane-relay-{name}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)
        for request in self._queue:
            request.answer(error(COORDINATOR_UNAVAILABLE, "the relay is shutting down"))

    def submit(self, events: list[Body], token: str | None, nbytes: int) -> Reply:
        """Queue one worker's events; block until its share of an upstream answer is back."""
        events = with_token(events, token)
        request = EventsRequest(events, nbytes, tokened=all("token" in e for e in events))
        with self._cond:
            if self._closed:
                return error(COORDINATOR_UNAVAILABLE, "the relay is shutting down")
            if len(self._queue) >= MAX_QUEUED_REQUESTS:
                return error(COORDINATOR_UNAVAILABLE, f"{len(self._queue)} event requests queued")
            self._queue.append(request)
            self._stats.add("events_requests")
            self._cond.notify_all()
        if not request.done.wait(EVENTS_WAIT_S):
            return error(COORDINATOR_UNAVAILABLE, f"no upstream answer within {EVENTS_WAIT_S} s")
        assert request.reply is not None
        return request.reply

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closed)
                if self._closed:
                    return
                batch = take_batch(self._queue)
            for request, reply in zip(batch, self.send_batch(batch), strict=True):
                request.answer(reply)

    def send_batch(self, batch: list[EventsRequest]) -> list[Reply]:
        """Send one batch upstream on its channel; each request's reply, in order."""
        events = [event for request in batch for event in request.events]
        if sum(r.nbytes for r in batch) > MAX_BATCH_BYTES:
            size = len(json.dumps({"id": 2**53, "events": events}, separators=(",", ":")))
            if size > MAX_BODY_BYTES:
                if len(batch) > 1:
                    return [self.send_batch([request])[0] for request in batch]
                detail = f"{size} bytes with the tokens; at most {MAX_BODY_BYTES}"
                return [error(BODY_TOO_LARGE, detail)]
        self._stats.add("events_upstream")
        self._stats.add("events_sent", len(events))
        if len(batch) > 1:
            self._stats.add("events_merged")
        # Each event's own token decides for it; the door token only gets the batch onto a
        # channel, so it is a token of the batch's first request.
        door = events[0]["token"] if batch[0].tokened else None
        try:
            body = self._upstream.run(self._upstream.send(events, door))
        except ChannelRefused as exc:
            reply = refused(exc, self._upstream.where)
        except Unreachable as exc:
            return [error(COORDINATOR_UNAVAILABLE, str(exc))] * len(batch)
        else:
            code = body.get("error")
            if code is None:
                return split_results(batch, body)
            code = str(code)
            reply = error(code, str(body.get("detail", "")), default_status=503)
        if len(batch) > 1 and reply[0] in REFUSED:
            # refused as a whole: let each worker's request meet its own fate
            return [self.send_batch([request])[0] for request in batch]
        return [reply] * len(batch)


@dataclass
class Member:
    """A rank of a lane: the token the coordinator accepted for it, and its worker's last poll."""

    token: str | None
    after: int
    seen: float
    view: str | None
    #: its worker's polls waiting on the lane now (a rank with one is not idle)
    waiting: int = 0


@dataclass
class PollArgs:
    """One worker's ``GET /agents/updates`` in the one-rank form."""

    group: str
    rank: int
    after: int
    timeout: float
    protocol: str | None
    view: str | None
    features: str | None = None

    def params(self) -> dict[str, Any]:
        params: dict[str, Any] = {
            "group": self.group,
            "rank": self.rank,
            "after": self.after,
            "timeout": self.timeout,
        }
        if self.protocol is not None:
            params["protocol"] = self.protocol
        if self.features is not None:
            params["features"] = self.features
        if self.view is not None:
            params["view"] = self.view
        return params


@dataclass
class Stream:
    """What a lane's channel carries: its ranks, the door tokens, and the offset its next push
    starts after (the opening's ``after``, then each push's ``next_after``)."""

    ranks: frozenset[int]
    after: int
    authorization: str | None


class UpdatesLane:
    """One channel carrying the local ranks of one group, and the cache its pushes fill.

    The workers' polls run in the relay's request threads and wait on ``_cond``; the channel is
    kept by :meth:`_run` on the upstream loop, whose pushes fill the cache under that lock.
    """

    def __init__(
        self,
        group: str,
        protocol: str | None,
        relay: Relay,
        cache_bytes: int,
    ) -> None:
        self.group = group
        self.protocol = protocol
        self.cache = UpdateCache(cache_bytes)
        self._dropped = 0  # cache.dropped already counted in the relay's stats
        self.members: dict[int, Member] = {}
        self._relay = relay
        self._stats = relay.stats
        self._upstream = relay.upstream
        self._link = ChannelLink(
            relay.upstream.addresses, timeout_s=relay.timeout_s, tls=relay.upstream.tls
        )
        self._cond = threading.Condition()
        #: what the channel open (or opening) carries; None while there is none
        self._stream: Stream | None = None
        self._answers = 0  # pushes and failures so far, so a waiter sees news
        self._failure: tuple[int, Reply] | None = None  # (answer number, the error)
        self._store: Any = None
        self._term: Any = None
        self._closed = False
        #: the wait before the next opening after a failure (read and set on the loop only)
        self._backoff = BACKOFF_S
        #: set (on the loop) when the ranks the channel should carry may have changed
        self._wake = asyncio.Event()
        self._upstream.spawn(self._run())

    def close(self) -> None:
        """Stop serving; the upstream loop closes the channel as it stops."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._nudge()

    def _nudge(self) -> None:
        self._upstream.call_soon(self._wake.set)

    # -- a worker's poll -------------------------------------------------------------------------

    def poll(self, args: PollArgs, token: str | None) -> Reply:
        deadline = time.monotonic() + args.timeout
        with self._cond:
            member = self.members.get(args.rank)
            if member is None or member.token != token:
                return self._solo(args, token, verify=member is None)
            member.after, member.seen, member.view = args.after, time.monotonic(), args.view
            if self._stream is None or args.rank not in self._stream.ranks:
                self._nudge()  # the channel may carry this rank now
            if not self._lane_serves(args.rank, args.after):
                return self._solo(args, token)
            self._stats.add("polls_lane")
            answers = self._answers
            member.waiting += 1
            try:
                while True:
                    held = self.cache.held_until()
                    served = self.cache.serve(args.rank, args.after)
                    if held is not None and self.cache.held_until() is None:
                        self._cond.notify_all()  # the checkpoint rank was handed the shutdown
                    if served is not None and (served.updates or served.resync):
                        self.trim()
                        return 200, self._body(served)
                    if self._failure is not None and self._failure[0] > answers:
                        if self._failure[1][0] in REFUSED:
                            break  # the ranks were refused together: ask for this one alone
                        return self._failure[1]
                    if not self._lane_serves(args.rank, args.after):
                        break  # trimmed away meanwhile
                    left = deadline - time.monotonic()
                    if left <= 0 or self._closed:
                        return 200, self._body(served or Served((), args.after))
                    self._cond.wait(left)
            finally:
                member.waiting -= 1
                member.seen = time.monotonic()
            args.timeout = max(0.0, deadline - time.monotonic())
            return self._solo(args, token)  # trimmed away, or refused together with others

    def _notify(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _lane_serves(self, rank: int, after: int) -> bool:
        """The cache holds ``rank``'s updates since ``after``, or the lane's channel brings
        them, or the channel the lane opens next (it opens one when the ranks it should carry
        change) will."""
        served = self.cache.serve(rank, after)
        stream = self._stream
        carried = stream is not None and rank in stream.ranks
        if served is not None:
            return bool(served.updates or served.resync) or carried or self._next_carries(rank)
        if rank in self.cache.ranks:
            return False  # from further back than the cache holds: the lane goes on from its end
        if stream is not None and carried:
            return stream.after <= after
        return self._next_carries(rank)  # from this poll's ``after`` on, at most

    def _eligible(self, rank: int) -> bool:
        """The lane's next channel may carry ``rank`` without reaching below what it holds."""
        group = self.cache.group
        member = self.members.get(rank)
        if member is None:
            return False
        return rank in self.cache.ranks or group is None or member.after >= group.lo

    def _next_carries(self, rank: int) -> bool:
        """The channel the lane opens next carries ``rank`` (the lock is held)."""
        if not self._eligible(rank):
            return False
        if len(self.members) <= MAX_QUERY_RANKS:
            return True
        return rank in sorted(r for r in self.members if self._eligible(r))[:MAX_QUERY_RANKS]

    def _solo(self, args: PollArgs, token: str | None, *, verify: bool = False) -> Reply:
        """Forward this poll upstream on its own (the lock is released meanwhile)."""
        self._stats.add("polls_solo")
        self._cond.release()
        try:
            reply = self._relay.forward_poll(args.params(), token)
        finally:
            self._cond.acquire()
        status, body = reply
        if status == 200 and verify and args.rank not in self.members:
            # the coordinator accepted this token for this rank: the lane may carry it
            self.members[args.rank] = Member(
                token, int(body.get("next_after") or args.after), time.monotonic(), args.view
            )
            self._nudge()
        return reply

    def _body(self, served: Served) -> Body:
        body = {
            "term": self._term,
            "updates": list(served.updates),
            "next_after": served.next_after,
            "resync": served.resync,
            "store": self._store,
        }
        if served.restored:
            body["restored"] = True
        return body

    def trim(self) -> None:
        """Drop what every rank of the lane has read past (called with the lock held)."""
        listed = [m.after for r, m in self.members.items() if r in self.cache.ranks]
        group = self.cache.group
        if listed and group is not None:
            # an ``after`` past what the lane holds (from before a restored log) counts as its end
            self.cache.trim_below(min(*listed, group.hi))
        self._stats.peak("cache_bytes", self.cache.nbytes)
        self._stats.add("cache_dropped", self.cache.dropped - self._dropped)
        self._dropped = self.cache.dropped

    # -- the channel (on the upstream loop) ------------------------------------------------------

    async def _run(self) -> None:
        """Keep a channel open for the eligible members: open it from the lowest offset they
        need, and again when it ends (after a backoff) or the ranks it should carry change."""
        loop = asyncio.get_running_loop()
        while True:
            self._wake.clear()
            with self._cond:
                if self._closed:
                    return
                ranks, after, authorization, view = self._next_channel(frozenset())
                stream = Stream(frozenset(ranks), after, authorization) if ranks else None
                self._stream = stream
            if stream is None:
                await self._woken(None)
                continue
            self._link.authorization = authorization
            try:
                channel = await self._link.open(
                    group=self.group,
                    ranks=ranks,
                    after=after,
                    view=view,
                    on_updates=functools.partial(self._pushed, stream),
                )
            except (ChannelRefused, OSError, TimeoutError, ChannelClosed) as exc:
                self._failed(stream, exc)
                await self._back_off()
                continue
            opened = loop.time()
            self._relay.lane_channel(+1)
            try:
                ended = await self._carry(channel, stream)
            finally:
                channel.close()
                self._link.closed(channel)  # a leader the coordinator named: the next goes there
                self._relay.lane_channel(-1)
                with self._cond:
                    if self._stream is stream:
                        self._stream = None
            if loop.time() - opened >= BACKOFF_MAX_S:
                self._backoff = BACKOFF_S
            if ended:
                log.info("relay: the updates channel of %s ended: %s", self.group, channel.closed)
                await self._back_off()

    async def _back_off(self) -> None:
        await asyncio.sleep(self._backoff)
        self._backoff = min(self._backoff * 2, BACKOFF_MAX_S)

    async def _carry(self, channel: HostChannel, stream: Stream) -> bool:
        """Wait while ``channel`` carries what it should: True when it ended, False when the
        ranks it should carry changed (or the lane closed)."""
        while True:
            self._wake.clear()
            with self._cond:
                if self._closed:
                    return False
                ranks, _, authorization, _ = self._next_channel(stream.ranks)
            if frozenset(ranks) != stream.ranks or authorization != stream.authorization:
                return False
            if await self._woken(channel.ended):
                return True

    async def _woken(self, ended: asyncio.Future[None] | None) -> bool:
        """Wait for a nudge, for ``ended`` or ``IDLE_CHECK_S``; whether ``ended`` is done."""
        wake = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait(
                [wake] if ended is None else [wake, ended],
                timeout=IDLE_CHECK_S,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            wake.cancel()
        return ended is not None and ended.done()

    def _pushed(self, stream: Stream, body: Mapping[str, Any]) -> None:
        """A push of the channel carrying ``stream``: into the cache, as the fact it states
        about the span from the previous push on, and the waiting polls woken. A push whose
        updates are not the protocol's fails the lane like a channel that could not open (its
        polls then go upstream on their own)."""
        try:
            updates = decode_updates(body.get("updates") or ())
        except UpdateError as exc:
            self._failed(stream, exc)
            return
        with self._cond:
            if self._stream is not stream:
                return  # a channel being closed: the next one carries what matters
            after = stream.after
            next_after = int(body.get("next_after") or after)
            stream.after = next_after
            self._answers += 1
            self._failure = None
            self._backoff = BACKOFF_S  # the channel works: if it ends, open another at once
            self._store, self._term = body.get("store"), body.get("term")
            self.cache.add(
                sorted(stream.ranks),
                after,
                updates,
                next_after,
                bool(body.get("resync")),
                bool(body.get("restored")),
            )
            if (until := self.cache.held_until()) is not None:
                # the others' polls wait for the checkpoint rank's, or for the lead's end
                self._upstream.loop.call_later(
                    max(0.0, until - time.monotonic()) + 0.001, self._notify
                )
            self.trim()
            self._cond.notify_all()
        self._stats.add("lane_pushes")

    def _failed(self, stream: Stream, exc: Exception) -> None:
        """The channel could not be opened: the waiting polls get the error."""
        where = self._upstream.where
        reply = (
            refused(exc, where)
            if isinstance(exc, ChannelRefused)
            else error(COORDINATOR_UNAVAILABLE, unreachable(where, exc))
        )
        with self._cond:
            if self._stream is stream:
                self._stream = None
            if self._closed:
                return
            log.warning("relay: the updates channel of %s failed: %s", self.group, exc)
            self._answers += 1
            self._failure = (self._answers, reply)
            if reply[0] in REFUSED:
                # the coordinator no longer takes these ranks together: each proves itself
                # with a poll of its own again
                self.members.clear()
                self.cache.ranks.clear()
            self._cond.notify_all()

    def _next_channel(
        self, carried: frozenset[int]
    ) -> tuple[list[int], int, str | None, int | None]:
        """The ranks, ``after``, door and ``view`` of the channel the lane should have (the lock
        is held): the members it carries now or may carry. Ranks idle for ``RANK_IDLE_S`` leave
        the lane first."""
        now = time.monotonic()
        idle = [r for r, m in self.members.items() if not m.waiting and now - m.seen > RANK_IDLE_S]
        for rank in idle:
            del self.members[rank]
            self.cache.forget(rank)
        ranks = sorted(r for r in self.members if r in carried or self._eligible(r))
        ranks = ranks[:MAX_QUERY_RANKS]
        spans = self.cache.ranks
        after = min(
            (spans[r].hi if r in spans else self.members[r].after for r in ranks), default=0
        )
        tokens = [t for t in (self.members[r].token for r in ranks) if t is not None]
        authorization = "Bearer " + ",".join(tokens) if tokens else None
        views = {self.members[r].view for r in ranks}
        view = views.pop() if len(views) == 1 else None
        return ranks, after, authorization, int(view) if view and view.isdigit() else None


def _upstream_error(exc: Exception) -> Reply:
    if isinstance(exc, CoordinatorError):
        return passed_on(exc.status, exc.code, exc.detail)
    return error(COORDINATOR_UNAVAILABLE, str(exc))


# -- the relay -------------------------------------------------------------------------------


class Relay:
    """The relay's HTTP server, its lanes and its upstream loop; ``url`` is what the workers
    get as FOLDPLANE_RELAY.

    ``stats`` counts what it did: worker polls served by a lane (``polls_lane``) or forwarded
    on their own (``polls_solo``), lane channels opened (``lane_channels``), the most open at
    once (``lane_channels_max``) and the pushes they brought (``lane_pushes``); worker event
    requests (``events_requests``), upstream event batches (``events_upstream``, with
    ``events_sent`` events; ``events_merged`` of them carried several workers' requests) and
    the events channels opened for them (``events_channels``); the largest a lane's cache grew
    (``cache_bytes``) and the updates dropped to keep it within its bound before every rank had
    read them (``cache_dropped``).
    """

    def __init__(
        self,
        addresses: str | Sequence[str],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        timeout_s: float = 10.0,
        cache_bytes: int = CACHE_BYTES,
    ) -> None:
        self.addresses = addresses
        self.timeout_s = timeout_s
        self.cache_bytes = cache_bytes
        self.stats = Counters(
            "polls_lane",
            "polls_solo",
            "lane_channels",
            "lane_channels_max",
            "lane_pushes",
            "events_requests",
            "events_upstream",
            "events_sent",
            "events_merged",
            "events_channels",
            "cache_bytes",
            "cache_dropped",
        )
        self._lane_channels = 0  # open now
        self.upstream = Upstream(addresses, timeout_s, self.stats)
        self._solo_client = CoordinatorClient(addresses, timeout_s=timeout_s)
        #: the lanes that merge the workers' event requests: heartbeats, as the agent sends
        #: them, in a lane of their own, so a beat never waits behind a slow batch of events
        self.events = EventsLane(self.upstream, self.stats, "events")
        self.beats = EventsLane(self.upstream, self.stats, "beats")
        self._lanes: dict[tuple[str, str | None], UpdatesLane] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._started = False
        self._server = _Server((host, port), _Handler)
        self._server.relay = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="foldplane-relay", daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> Relay:
        self.upstream.start()
        self.events.start()
        self.beats.start()
        self._thread.start()
        self._started = True
        log.info("relay on %s for %s", self.url, self.addresses)
        return self

    def close(self) -> None:
        """Stop serving, close the channels (the batches in flight get ``503``); idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            lanes = list(self._lanes.values())
        if self._started:
            self._server.shutdown()
        self._server.server_close()
        for lane in lanes:
            lane.close()
        self.upstream.close()
        self.events.close()
        self.beats.close()
        self._solo_client.close()

    def __enter__(self) -> Relay:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def lane(self, group: str, protocol: str | None) -> UpdatesLane | None:
        with self._lock:
            if self._closed:
                return None
            lane = self._lanes.get((group, protocol))
            if lane is None:
                lane = self._lanes[(group, protocol)] = UpdatesLane(
                    group, protocol, self, self.cache_bytes
                )
            return lane

    def lane_channel(self, delta: int) -> None:
        """A lane's channel opened (+1) or ended (-1)."""
        with self._lock:
            self._lane_channels += delta
            if delta > 0:
                self.stats.add("lane_channels")
                self.stats.peak("lane_channels_max", self._lane_channels)

    # -- what the handler calls ------------------------------------------------------------------

    def post_events(self, body: Any, token: str | None, nbytes: int) -> Reply:
        events = body.get("events") if isinstance(body, dict) else None
        if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
            return error(INVALID_REQUEST, 'the body must be {"events": [objects]}')
        if len(events) > MAX_EVENTS:
            return error(INVALID_REQUEST, f"{len(events)} events; at most {MAX_EVENTS}")
        if not events:
            return 200, {"term": None, "results": []}
        if nesting(body) > MAX_JSON_DEPTH:
            # what the coordinator answers such a body (its channel cannot say which batch)
            return error(
                NESTING_TOO_DEEP,
                f"the body nests arrays and objects more than {MAX_JSON_DEPTH} levels deep, "
                "the limit (--max-json-depth)",
            )
        beats = all(e.get("type") == "heartbeat" for e in events)
        return (self.beats if beats else self.events).submit(events, token, nbytes)

    def get_updates(self, query: Mapping[str, list[str]], token: str | None) -> Reply:
        args = _poll_args(query)
        if isinstance(args, str):
            return error(INVALID_REQUEST, args)
        if args is None:  # not the one-rank form: the coordinator answers it
            params = {k: v[-1] for k, v in query.items()}
            return self.forward_poll(params, token)
        lane = self.lane(args.group, args.protocol)
        if lane is None:
            return error(COORDINATOR_UNAVAILABLE, "the relay is shutting down")
        return lane.poll(args, token)

    def forward_poll(self, params: Mapping[str, Any], token: str | None) -> Reply:
        """One worker's poll, upstream over HTTP as it came (with its own token)."""
        headers = {"authorization": f"Bearer {token}"} if token else None
        try:
            timeout = min(float(params.get("timeout", QUERY.poll_timeout_s)), MAX_POLL_S)
        except (TypeError, ValueError):
            timeout = MAX_POLL_S
        try:
            return 200, self._solo_client.request(
                "GET",
                "/agents/updates",
                params=params,
                headers=headers,
                timeout_s=timeout + self.timeout_s,
            )
        except (CoordinatorError, CoordinatorUnavailable, RuntimeError) as exc:
            return _upstream_error(exc)


def _poll_args(query: Mapping[str, list[str]]) -> PollArgs | str | None:
    """The one-rank poll a query asks for, None for another form, or what is wrong with it."""
    one = {k: v[-1] for k, v in query.items()}
    if "ranks" in one or "rank" not in one or "group" not in one:
        return None
    try:
        rank = int(one["rank"])
        after = int(one.get("after", 0))
        timeout = float(one.get("timeout", QUERY.poll_timeout_s))
    except ValueError as exc:
        return f"rank, after and timeout must be numbers: {exc}"
    if rank < 0 or after < 0 or not timeout >= 0:
        return "rank, after and timeout must not be negative"
    return PollArgs(
        one["group"],
        rank,
        after,
        min(timeout, MAX_POLL_S),
        one.get("protocol"),
        one.get("view"),
        one.get("features"),
    )


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    relay: Relay

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a worker that died mid-request (the launcher reports it): not the relay's failure
        log.debug("relay: a request from %s ended early", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    #: TCP_NODELAY on every worker connection. With Nagle's algorithm on, a reply's second
    #: segment waits for the worker to acknowledge the first, and the worker's TCP delays that
    #: acknowledgement by up to 40 ms: every update a worker receives would come that much late.
    disable_nagle_algorithm = True
    #: an idle worker connection is closed after this many seconds
    timeout = 2 * MAX_POLL_S

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path != "/agents/updates":
            self._reply(error(NOT_FOUND, f"the relay serves no GET {url.path}"))
            return
        self._reply(self.server.relay.get_updates(parse_qs(url.query), self._token()))

    def do_POST(self) -> None:
        url = urlsplit(self.path)
        length = int(self.headers.get("content-length") or 0)
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            self._reply(error(BODY_TOO_LARGE, f"{length} bytes; at most {MAX_BODY_BYTES}"))
            return
        raw = self.rfile.read(length)
        if url.path != "/agents/events":
            self._reply(error(NOT_FOUND, f"the relay serves no POST {url.path}"))
            return
        try:
            body = json.loads(raw)
        except ValueError as exc:
            self._reply(error(INVALID_REQUEST, f"the body is not JSON: {exc}"))
            return
        self._reply(self.server.relay.post_events(body, self._token(), length))

    def _token(self) -> str | None:
        scheme, _, token = (self.headers.get("authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        return token.strip()

    def _reply(self, reply: Reply) -> None:
        status, body = reply
        data = msgspec.json.encode(body)  # its updates are Structs
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        if self.close_connection:
            # said, not only done: a client that reads no "close" sends its next request on
            # this connection and finds it shut
            self.send_header("connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("relay: " + format, *args)
