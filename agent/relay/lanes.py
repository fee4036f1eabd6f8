"""``GET /agents/updates``: per ``(group, protocol)`` one lane keeps one channel open for the
local ranks and answers each worker's poll from what it pushed (:class:`~.cache.UpdateCache`)."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ...wire.codes import (
    COORDINATOR_UNAVAILABLE,
)
from ...wire.ranks import MAX_QUERY_RANKS
from ...wire.updates import UpdateError, UpdateReader
from ..channel import ChannelClosed, ChannelLink, ChannelRefused, HostChannel
from .cache import Served, UpdateCache
from .replies import REFUSED, Body, Counters, Reply, error, refused, unreachable
from .upstream import Upstream

log = logging.getLogger("foldplane.relay")

#: A rank whose worker has not polled for this long leaves its lane.
RANK_IDLE_S = 30.0
#: How often a lane looks for ranks gone idle while nothing else happens.
IDLE_CHECK_S = RANK_IDLE_S / 3
#: After a lane's channel failed to open or ended, it waits this long, doubling up to
#: ``BACKOFF_MAX_S``; a channel that brought a push, or stayed open that long, starts it again.
BACKOFF_S = 0.05
BACKOFF_MAX_S = 2.0


class LaneOwner(Protocol):
    """What a lane uses of its relay (:class:`~.server.Relay`)."""

    stats: Counters
    upstream: Upstream
    timeout_s: float
    #: the updates its lanes read: the protocol's and every facet's it carries
    updates: UpdateReader

    def forward_poll(self, params: Mapping[str, Any], token: str | None) -> Reply: ...

    def lane_channel(self, delta: int) -> None: ...


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
        relay: LaneOwner,
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
        polls then go upstream on their own). The updates are read with the relay's reader
        (the protocol's and its facets'), which leaves out a type it does not read."""
        try:
            updates = self._relay.updates.decode_updates(body.get("updates") or ())
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
