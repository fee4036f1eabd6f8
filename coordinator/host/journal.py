"""The in-memory journals behind ``GET /agents/updates``: what concerns each rank, by offset.

Rules:

- ``view_prepare``, ``view_committed`` and ``shutdown_with_save`` concern every rank of a group
  (a rank must know the view even when it is not a member), so they go to the group's journal;
  ``rank_state`` goes to the journal of the rank it is about. A rank reads the merge of both.
- Every update carries the offset of the record whose fold produced it. Several updates may share
  an offset; a reader always gets all of them together, because it gets everything ``> after``.
- Journals are bounded in bytes (the JSON they hold), not in entries: a view change's update is
  a delta whose size is what changed, so a byte bound holds many small ones and few large ones
  alike. The *floor* of a journal is the highest offset it may have forgotten:
  entries above the floor are complete. A reader whose ``after`` is below the floor cannot be
  answered from the journal and must resync from the current state (:meth:`since` says so by
  returning None). After a restart the floor starts at the snapshot's offset, since the updates
  folded before it were never replayed into memory.
- A dropped entry that its rank had not yet read is counted as *undelivered*: the broadcast is
  best effort, and the metric says how much of it was lost (the rank then resyncs).
- An update is kept as its JSON, encoded once when it is published: a view change's updates go
  to every agent host's long poll, and a 512-rank ``view_committed`` is about 12 kB of JSON.
- **Nothing is read before it is projected.** A published update becomes visible to readers
  only at the next :meth:`UpdateJournals.wake`, which the host calls once the batch's
  projection rows are written: whoever hears of a view can read it in ``/views/history``, and
  no reader is handed an offset the host has not finished carrying out.
- A long poll that finds nothing waits on a future of its group. A publish wakes nobody by
  itself: the host calls :meth:`UpdateJournals.wake` once the updates' projection rows are
  written, which queues the group's waiting polls, and then :meth:`UpdateJournals.release`,
  which answers them oldest first, all at once or a limited number at a time (the host paces a
  view change's burst of answers while heartbeats are queued, see ``coordinator.host.pacing``).
- **The saver hears of a shutdown first.** The host can :meth:`UpdateJournals.hold` a group's
  ``shutdown_with_save`` for its checkpoint rank: until a reader of that rank has been handed
  it (:meth:`UpdateJournals.mark_delivered`) or the host lets it go (:meth:`UpdateJournals.
  let_go`, at its bound), a reader of the group's other ranks sees nothing from its offset on,
  and an empty answer never moves such a reader past it (:meth:`UpdateJournals.horizon`). A
  resync names the directive at once (it is the current state).

This module is plain data plus those futures; the host owns it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence

import msgspec

from ...wire.updates import AgentUpdate, UpdateReader
from ..fold import registry

#: An update: one of ``wire.updates``' Structs.
Update = AgentUpdate
#: An update as the journal keeps it: its offset and its JSON.
Entry = tuple[int, msgspec.Raw]

_encode = msgspec.json.Encoder().encode


def encoded(update: Update) -> msgspec.Raw:
    """An update's JSON, ready to be spliced into an answer (encoded by msgspec, once)."""
    return msgspec.Raw(_encode(update))


def decoded(raw: msgspec.Raw, reader: UpdateReader | None = None) -> Update:
    """The update an entry's JSON is (its Struct: the protocol's, or one of the facets that
    ``reader`` reads; the command line's facets when None)."""
    return (reader or registry.default().updates).decode_update(raw)


class _Journal:
    __slots__ = ("entries", "floor", "bytes")

    def __init__(self, floor: int) -> None:
        self.entries: deque[Entry] = deque()
        self.floor = floor
        self.bytes = 0

    def append(self, offset: int, raw: msgspec.Raw, limit: int) -> list[int]:
        """Keep an update; forget the oldest while over ``limit`` bytes (the newest is always
        kept); the offsets forgotten."""
        self.entries.append((offset, raw))
        self.bytes += len(raw)
        dropped: list[int] = []
        while self.bytes > limit and len(self.entries) > 1:
            old, old_raw = self.entries.popleft()
            self.bytes -= len(old_raw)
            self.floor = old
            dropped.append(old)
        return dropped

    def since(self, after: int) -> list[Entry]:
        out: list[Entry] = []
        for entry in reversed(self.entries):
            if entry[0] <= after:
                break
            out.append(entry)
        out.reverse()
        return out


class UpdateJournals:
    """Bounded per-group and per-(group, rank) update journals with long-poll wake-ups."""

    def __init__(
        self,
        *,
        floor: int = 0,
        group_limit_bytes: int = 8 << 20,
        rank_limit_bytes: int = 16 << 10,
    ) -> None:
        self._start_floor = floor
        self._group_limit = group_limit_bytes
        self._rank_limit = rank_limit_bytes
        self._groups: dict[str, _Journal] = {}
        self._ranks: dict[tuple[str, int], _Journal] = {}
        self._world: dict[str, int] = {}
        self._delivered: dict[tuple[str, int], int] = {}
        #: per group, the newest offset published to any of its ranks' journals and the highest
        #: floor among them: a reader after both needs none of those journals (nearly every
        #: reader: a rank's own updates are rare beside the group's)
        self._ranks_top: dict[str, int] = {}
        self._ranks_floor: dict[str, int] = {}
        self._waiting: dict[str, dict[asyncio.Future[None], None]] = {}
        self._releasing: deque[asyncio.Future[None]] = deque()
        self._share = 0
        self._dirty: set[str] = set()
        #: the newest offset published, and the newest readers may see (up to the last wake)
        self._published = floor
        self._visible = floor
        self.undelivered = 0
        #: per group, a shutdown directive held for its checkpoint rank: (rank, offset)
        self._held: dict[str, tuple[int, int]] = {}

    def set_world_size(self, group: str, world_size: int) -> None:
        self._world[group] = world_size

    @property
    def bytes(self) -> int:
        """The JSON every journal holds, in bytes."""
        return sum(j.bytes for j in self._groups.values()) + sum(
            j.bytes for j in self._ranks.values()
        )

    # -- writing (the host loop) ---------------------------------------------------------------

    def publish_group(self, group: str, update: Update) -> None:
        journal = self._groups.get(group)
        if journal is None:
            journal = self._groups[group] = _Journal(self._start_floor)
        offset = update.offset
        self._published = max(self._published, offset)
        for dropped in journal.append(offset, encoded(update), self._group_limit):
            delivered = self._delivered
            self.undelivered += sum(
                1
                for rank in range(self._world.get(group, 0))
                if delivered.get((group, rank), -1) < dropped
            )
        self._dirty.add(group)

    def publish_rank(self, group: str, rank: int, update: Update) -> None:
        key = (group, rank)
        journal = self._ranks.get(key)
        if journal is None:
            journal = self._ranks[key] = _Journal(self._start_floor)
        offset = update.offset
        self._published = max(self._published, offset)
        for dropped in journal.append(offset, encoded(update), self._rank_limit):
            if self._delivered.get(key, -1) < dropped:
                self.undelivered += 1
        self._ranks_top[group] = max(self._ranks_top.get(group, 0), offset)
        self._ranks_floor[group] = max(self._ranks_floor.get(group, 0), journal.floor)
        self._dirty.add(group)

    def hold(self, group: str, rank: int, offset: int) -> None:
        """Show the updates of ``group`` from ``offset`` on (its ``shutdown_with_save``) to a
        reader of ``rank`` (the checkpoint rank) before any other reader of the group: the
        others see them once that rank has been handed them, or at :meth:`let_go`."""
        self._held[group] = (rank, offset)

    def let_go(self, group: str) -> bool:
        """End ``group``'s hold: its waiting readers are answered now (the host's wake already
        made the held updates visible); whether there was a hold."""
        if self._held.pop(group, None) is None:
            return False
        for future in self._waiting.pop(group, {}):
            if not future.done():
                future.set_result(None)
        return True

    def horizon(self, group: str, ranks: Sequence[int], applied: int) -> int:
        """How far a reader of ``ranks`` that got nothing may move on: ``applied``, or just
        before a shutdown held for a rank it does not read."""
        held = self._held.get(group)
        if held is not None and held[0] not in ranks:
            return min(applied, held[1] - 1)
        return applied

    def wake(self) -> None:
        """Queue, for release, the long polls of every group that got updates since the last
        wake, and make what was published visible; :meth:`release` answers them."""
        self._visible = self._published
        for group in self._dirty:
            waiting = self._waiting.pop(group, None)
            if waiting:
                self._releasing.extend(waiting)
                self._share = 0  # a new burst: :meth:`release_share` sizes its share afresh
        self._dirty.clear()

    def release(self, limit: int | None = None) -> int:
        """Wake up to ``limit`` queued long polls (all of them when None), oldest first;
        how many are still queued after."""
        releasing = self._releasing
        woken = 0
        while releasing and (limit is None or woken < limit):
            future = releasing.popleft()
            if not future.done():
                future.set_result(None)
                woken += 1
        return len(releasing)

    def release_share(self, least: int, spread: int) -> int:
        """Answer one share of the queued polls: the queue as it stood when its last burst
        arrived, spread over ``spread`` shares, at least ``least`` polls a share; how many are
        still queued after."""
        if not self._share:
            self._share = max(least, -(-len(self._releasing) // spread))
        return self.release(self._share)

    @property
    def releasing(self) -> int:
        """Polls woken and not yet answered (some may have ended meanwhile)."""
        return len(self._releasing)

    def wake_all(self) -> None:
        self._visible = self._published
        self._held.clear()
        for waiting in self._waiting.values():
            self._releasing.extend(waiting)
        self._waiting.clear()
        self.release()

    # -- reading (request handlers) ------------------------------------------------------------

    def floor(self, group: str, ranks: Sequence[int]) -> int:
        floors = [self._start_floor]
        if (journal := self._groups.get(group)) is not None:
            floors.append(journal.floor)
        if self._ranks_floor.get(group, 0) > self._start_floor:
            for rank in ranks:
                if (journal := self._ranks.get((group, rank))) is not None:
                    floors.append(journal.floor)
        return max(floors)

    def since(self, group: str, ranks: Sequence[int], after: int) -> list[Update] | None:
        """Updates for ``ranks`` of ``group`` with offset > ``after`` in offset order (the
        group's once, and each rank's own), or None when some of them may have been forgotten
        (the caller must resync)."""
        entries = self.entries_since(group, ranks, after)
        return None if entries is None else [decoded(raw) for _, raw in entries]

    def entries_since(self, group: str, ranks: Sequence[int], after: int) -> list[Entry] | None:
        """:meth:`since` as the journal keeps them: ``(offset, JSON)``."""
        if after < self.floor(group, ranks):
            return None
        merged: list[Entry] = []
        if (journal := self._groups.get(group)) is not None:
            merged.extend(journal.since(after))
        if after < self._ranks_top.get(group, 0):
            for rank in ranks:
                if (journal := self._ranks.get((group, rank))) is not None:
                    merged.extend(journal.since(after))
        if len(merged) > 1:
            merged.sort(key=_offset)  # stable: updates of one offset keep their publish order
        visible = self._visible
        held = self._held.get(group)
        if held is not None and held[0] not in ranks:
            visible = min(visible, held[1] - 1)
        if merged and merged[-1][0] > visible:
            merged = [entry for entry in merged if entry[0] <= visible]
        return merged

    def mark_delivered(self, group: str, ranks: Sequence[int], offset: int) -> None:
        """``ranks`` have been handed ``group``'s updates up to ``offset``; a hold for one of
        them ends once it reaches the held offset (the group's other readers are answered)."""
        delivered = self._delivered
        for rank in ranks:
            key = (group, rank)
            if offset > delivered.get(key, -1):
                delivered[key] = offset
        held = self._held.get(group)
        if held is not None and offset >= held[1] and held[0] in ranks:
            self.let_go(group)

    def waiter(self, group: str) -> asyncio.Future[None]:
        """A future that the next publish to ``group`` resolves, once :meth:`wake` has queued
        it and :meth:`release` reaches it. Take it after finding no updates with nothing awaited
        in between (so no publish falls between the two), and :meth:`forget` it when done."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting = self._waiting.get(group)
        if waiting is None:
            waiting = self._waiting[group] = {}
        waiting[future] = None
        return future

    def waiting(self, group: str) -> int:
        """How many readers of ``group`` wait on a :meth:`waiter`, not yet woken."""
        return len(self._waiting.get(group, ()))

    def forget(self, group: str, future: asyncio.Future[None]) -> None:
        """Drop a waiter that was not (or no longer) waited on."""
        waiting = self._waiting.get(group)
        if waiting is not None:
            waiting.pop(future, None)


def _offset(entry: Entry) -> int:
    return entry[0]
