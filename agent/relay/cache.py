"""What a lane's channel pushed, cached per rank by offset and bounded in bytes (pure: no
thread, no I/O; a clock only where a shutdown is held for its checkpoint rank)."""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ...wire.updates import (
    AgentUpdate,
    ShutdownUpdate,
    addressed_rank,
)
from ...wire.updates import encode as encode_update

#: The bytes of updates a lane keeps, at most.
CACHE_BYTES = 4 * 1024 * 1024
#: How long a lane keeps a ``shutdown_with_save`` from its other ranks' workers while the
#: worker of its checkpoint rank has not been handed it (the coordinator's default
#: ``--shutdown-lead-s``, which orders the hosts; this orders the workers of one host).
SHUTDOWN_LEAD_S = 2.0


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
