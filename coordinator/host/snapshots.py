"""The host's snapshots: their format, when one is taken, and where a restart starts from.

A snapshot is the fold's state plus the host's own (:class:`HostState`) at one offset, saved
under :data:`CONSUMER`; a restart folds only the records after it. Compaction keeps snapshots
too (``Log.kept_snapshots``); :func:`restore_state` starts from the newest usable one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import msgspec

from ...eventlog import Log, LogError
from ..fold import registry
from ..fold.machine import Coordinator
from ..fold.registry import Facets
from .metrics import HostMetrics
from .ready import HostState

log = logging.getLogger("foldplane.host")

#: The name under which the host keeps its snapshot and its projection consumer offset.
CONSUMER = "coordinator"
SNAPSHOT_FORMAT = 1

#: Records folded since the last snapshot that make the next one due.
SNAPSHOT_EVERY = 20_000
#: Heartbeats written since the last snapshot that make the next one due. A shared heartbeat
#: record carries the beats of a whole group, and a restart folds each of them (about half a
#: microsecond a beat): this bounds that work to about a second, whatever the group's size,
#: while a group of 4,096 ranks beating once a second is saved every 8 minutes or so, not
#: every ``SNAPSHOT_INTERVAL_S`` (a snapshot is about 340 bytes a rank, written to the WAL
#: and again to the database file: saved every 30 s, that was about 80 kB a rank-hour, some
#: 60 times what the log itself grows by).
SNAPSHOT_BEATS = 2_000_000
#: Seconds after which a snapshot is due anyway once records arrived since the last one (a
#: small group's heartbeats reach ``SNAPSHOT_BEATS`` only after hours).
SNAPSHOT_INTERVAL_S = 3600.0


def encode_snapshot(machine: Coordinator, state: HostState) -> bytes:
    """The snapshot of ``machine`` and ``state`` at the fold's offset."""
    return msgspec.json.encode(
        {
            "format": SNAPSHOT_FORMAT,
            "fold": machine.snapshot(),
            "host": msgspec.to_builtins(state),
        }
    )


def decode_snapshot(data: bytes, facets: Facets | None = None) -> tuple[Coordinator, HostState]:
    """The fold of ``facets`` (the command line's when None) and the host state a snapshot
    holds; ValueError for another format."""
    facets = facets or registry.default()
    doc = msgspec.json.decode(data)
    if doc.get("format") != SNAPSHOT_FORMAT:
        raise ValueError(f"snapshot format {doc.get('format')!r}, expected {SNAPSHOT_FORMAT}")
    host = doc["host"]
    # the facets' latest updates are Structs of every type the facets read (their
    # ``Facets.updates``): each is converted by its type, the rest of the state as declared
    latest = {g: _updates(facets, by) for g, by in host.pop("latest", {}).items()}
    by_rank = {
        g: {r: _updates(facets, by) for r, by in ranks.items()}
        for g, ranks in host.pop("latest_by_rank", {}).items()
    }
    state = msgspec.convert(host, HostState)
    state.latest, state.latest_by_rank = latest, by_rank
    return Coordinator.from_snapshot(doc["fold"], facets), state


def _updates(facets: Facets, by_kind: dict[str, Any]) -> dict[str, Any]:
    return {kind: facets.updates.convert_update(u) for kind, u in by_kind.items()}


async def restore_state(log_: Log, facets: Facets | None = None) -> tuple[Coordinator, HostState]:
    """The latest usable snapshot: the host's own, or the latest one compaction kept when that
    is newer (records may have been removed behind it, so an older start cannot be folded).
    With neither, a fold from scratch; on a compacted log that is impossible, so it fails."""
    candidates: list[tuple[int, str, bytes | None]] = []
    snap = await log_.load_snapshot(CONSUMER)
    if snap is not None:
        candidates.append((snap[0], "snapshot", snap[1]))
    kept = await log_.kept_snapshots(CONSUMER)
    if kept:
        candidates.append((kept[-1], "kept snapshot", None))
    for offset, what, data in sorted(candidates, key=lambda c: c[0], reverse=True):
        if data is None:
            data = await log_.load_kept_snapshot(CONSUMER, offset)
        try:
            return decode_snapshot(data or b"", facets)
        except Exception as exc:  # an older format, or a damaged blob: try the next one
            log.warning("%s at offset %d unusable (%s)", what, offset, exc)
    removed = await log_.removed_ranges()
    if removed:
        raise LogError(
            f"{log_.where} was compacted up to offset {removed[-1].last} and no snapshot "
            "behind which its records were removed can be read; it cannot be folded"
        )
    if candidates:
        log.warning("no usable snapshot; replaying the whole log")
    return Coordinator(facets), HostState()


class Snapshots:
    """Takes the host's snapshots, one at a time: every ``every`` records or ``beats``
    heartbeats (``metrics.heartbeats``, the beats written into shared records), whichever
    comes first, or ``interval_s`` seconds after the last one when records arrived since.

    ``offset`` is the offset of the last snapshot saved (or restored from); ``clock`` is a
    monotonic clock in seconds.
    """

    def __init__(
        self,
        log_: Log,
        metrics: HostMetrics,
        *,
        offset: int,
        every: int = SNAPSHOT_EVERY,
        beats: int = SNAPSHOT_BEATS,
        interval_s: float = SNAPSHOT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if every < 1 or beats < 1:
            raise ValueError(
                f"a snapshot falls due after at least 1 record and 1 heartbeat, got every={every} "
                f"and beats={beats}"
            )
        self.log = log_
        self.metrics = metrics
        self.offset = offset
        self.every = every
        self.beats = beats
        self.interval_s = interval_s
        self.clock = clock
        self.taken_at = clock()
        #: ``metrics.heartbeats`` when the last snapshot was encoded
        self.beats_at = metrics.heartbeats
        self.writing: asyncio.Task[None] | None = None

    def due(self, offset: int) -> bool:
        """Whether the fold at ``offset`` should be saved now."""
        if offset <= self.offset:
            return False
        return (
            offset - self.offset >= self.every
            or self.metrics.heartbeats - self.beats_at >= self.beats
            or self.clock() - self.taken_at >= self.interval_s
        )

    def maybe_start(self, machine: Coordinator, state: HostState) -> None:
        """Start a snapshot when one is due and none is being written.

        The state is encoded here, between two batches, so it is exactly the fold at its
        offset; the write runs beside the next batches instead of holding them up (a large
        group's snapshot would otherwise stall every input queued behind its commit). A
        restart therefore folds at most ``every`` records plus what arrived while one
        snapshot was being written. The caller starts one only once every projection row up
        to the fold's offset is written, so a restart from it never misses a row.
        """
        if self.writing is not None and not self.writing.done():
            return
        if self.due(machine.offset):
            data = encode_snapshot(machine, state)
            self.writing = asyncio.get_running_loop().create_task(
                self._save(machine.offset, data, beats=self.metrics.heartbeats)
            )

    async def take(self, machine: Coordinator, state: HostState) -> None:
        """Save the fold and ``state`` at the fold's offset now, and wait for it (after the
        one being written, if any); a failed save raises."""
        await self.settle()
        offset = machine.offset
        if offset == self.offset:
            return
        beats = self.metrics.heartbeats
        await self._save(offset, encode_snapshot(machine, state), beats=beats, quiet=False)

    async def settle(self) -> None:
        """Wait for the snapshot being written, if any, to land."""
        if self.writing is not None:
            await self.writing

    async def _save(self, offset: int, data: bytes, *, beats: int, quiet: bool = True) -> None:
        try:
            await self.log.save_snapshot(CONSUMER, offset, data)
        except LogError as exc:  # StaleTermError too: a deposed leader writes no snapshot
            if not quiet:
                raise
            # the next one retries; until then a restart folds a longer tail
            log.error("snapshot at offset %d failed: %s", offset, exc)
            return
        self.offset = offset
        self.beats_at = beats
        self.taken_at = self.clock()
        self.metrics.snapshots += 1
