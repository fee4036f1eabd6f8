"""Heartbeats that share a record: the host's buffer of beats waiting to be appended together.

Every heartbeat is in the log, but a record per beat would make the log grow by records: an
8,192-rank job beating once a second would append 708 M records a day. So the host keeps the
beats that arrive within ``flush_s`` of each other and appends them as **one** ``heartbeat``
record per group, ``{"ranks": <rank set>}`` (``wire.ranks``: a bitmap of the group at most), and
answers each beat with that record's offset once it is durable. The fold sees each beat: the
record names every rank that beat, and each is alive as of the record's time.

The rules:

- A beat is checked against the fold when the host admits it (a stale incarnation is answered
  then), and **again right before its record is appended**, against the state that record
  will be folded on: a join, exit or death appended while the beat waited makes it stale, and
  it is answered as such instead of being written. The host admits a submission of nothing but
  beats when it turns for another input, or when the oldest of them is due: they wait for a
  shared record anyway, so the host's loop does not turn for each host's beats.
- Beats wait at most ``flush_s`` from their arrival. A ``tick`` flushes every waiting beat first, in
  the same append, so no rank times out while its beat waits here.
- One rank beating twice within a window is one fact at the record's time: the rank is named
  once, and both beats get the record's offset.

This module is plain data; the host owns it and its timing. It keeps what the host hands it,
per group, in arrival order: the host's bundles of the beats each submission brought
(``coordinator.host.inputs.Beats``), counted by the beats they carry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class _Waiting(Generic[T]):
    __slots__ = ("since", "beats", "count")

    def __init__(self, since: float) -> None:
        self.since = since
        #: what waits, in arrival order, and how many beats that is
        self.beats: list[T] = []
        self.count = 0


class HeartbeatBuffer(Generic[T]):
    """Beats per group, waiting for their shared record."""

    def __init__(self, flush_s: float) -> None:
        if flush_s < 0:
            raise ValueError(f"heartbeat flush interval must be >= 0 seconds, got {flush_s}")
        self.flush_s = flush_s
        self._groups: dict[str, _Waiting[T]] = {}
        self.waiting = 0

    def add(self, group: str, beats: T, count: int, now: float) -> None:
        """``beats`` of ``group`` (``count`` of them) wait from ``now``."""
        waiting = self._groups.get(group)
        if waiting is None:
            waiting = self._groups[group] = _Waiting(now)
        waiting.beats.append(beats)
        waiting.count += count
        self.waiting += count

    def deadline(self) -> float | None:
        """When the oldest waiting group falls due, or None when nothing waits."""
        if not self._groups:
            return None
        return min(w.since for w in self._groups.values()) + self.flush_s

    def take(self, now: float, *, everything: bool = False) -> list[tuple[str, list[T]]]:
        """The groups whose beats are due (all of them with ``everything``), in group order,
        removed from the buffer."""
        due = sorted(
            g for g, w in self._groups.items() if everything or now >= w.since + self.flush_s
        )
        out = []
        for g in due:
            waiting = self._groups.pop(g)
            self.waiting -= waiting.count
            out.append((g, waiting.beats))
        return out

    def drain(self, fail: Callable[[T], Any]) -> None:
        """Give up everything waiting (the host is stopping)."""
        for waiting in self._groups.values():
            for beats in waiting.beats:
                fail(beats)
        self._groups.clear()
        self.waiting = 0
