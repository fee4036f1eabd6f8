"""The one reader of stored views: full views from a group's view rows, full or delta.

A view row is a full view or a delta from the version before it (``coordinator.fold.projections``,
"View rows"); this module is how everything that reads views from the store (the history and
the console's timeline, replay, compaction's checks) gets full views back. A read that starts at
version ``v`` begins at the checkpoint at or before ``v`` (a full row, at most
``VIEW_CHECKPOINT_EVERY - 1`` versions back), or, on a store written with other checkpoints,
at the nearest full row before that; it never reads a group's whole history to serve one page.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from ...eventlog import Log, ProjectionRow
from ..fold.projections import (
    VIEW_CHECKPOINT_EVERY,
    ViewFold,
    is_delta,
    view_checkpoint_at,
)


@dataclass(frozen=True, slots=True)
class StoredView:
    """One version: its row as stored and the full view document it means."""

    row: ProjectionRow
    doc: dict[str, Any]

    @property
    def version(self) -> int:
        return self.row.seq


class ViewReader:
    """Reads one group's views in version order. It keeps the last view it folded, so a read
    that goes on where the last one ended (the next chunk of a page) reads only the new rows."""

    def __init__(self, log: Log, group: str) -> None:
        self.log = log
        self.group = group
        self._fold = ViewFold()

    async def page(self, after_version: int, limit: int) -> list[StoredView]:
        """Up to ``limit`` views after ``after_version``, in version order (fewer only where
        the group has no more). ViewRowError when the stored rows do not fold."""
        if limit <= 0:
            return []
        fresh = not (after_version > 0 and self._fold.version == after_version)
        if fresh:
            self._fold = ViewFold()
            cursor = view_checkpoint_at(after_version + 1) - 1
        else:
            cursor = after_version  # going on from the view the last read ended with
        out: list[StoredView] = []
        first_read = fresh and cursor > 0
        while len(out) < limit:
            want = limit - len(out) + max(0, after_version - cursor)
            rows = await self._read(cursor, want)
            if first_read and rows and is_delta(rows[0].doc) and cursor > 0:
                # a delta where a full row belongs (a store written with other
                # checkpoints): start a checkpoint further back
                cursor = max(0, cursor - VIEW_CHECKPOINT_EVERY)
                continue
            first_read = False
            for row in rows:
                wanted = row.seq > after_version
                doc = self._fold.add(row, want=wanted)
                cursor = row.seq
                if wanted:
                    assert doc is not None
                    out.append(StoredView(row, doc))
                    if len(out) == limit:
                        break
            if len(rows) < want:
                break
        return out

    async def _read(self, after: int, limit: int) -> list[ProjectionRow]:
        return await self.log.read_projections("view", self.group, after_seq=after, limit=limit)


async def read_views(log: Log, group: str, *, after_version: int, limit: int) -> list[StoredView]:
    """Up to ``limit`` of ``group``'s views after ``after_version``, in version order."""
    return await ViewReader(log, group).page(after_version, limit)


async def get_view(log: Log, group: str, version: int) -> dict[str, Any] | None:
    """Version ``version`` of ``group``'s view, in full; None when there is no such row."""
    if version < 1:
        return None
    got = await ViewReader(log, group).page(version - 1, 1)
    return got[0].doc if got and got[0].version == version else None


#: Views read at a time by :func:`every_view`.
PAGE = 1000


async def every_view(log: Log, group: str) -> AsyncIterator[StoredView]:
    """Every view of ``group``, in version order."""
    reader = ViewReader(log, group)
    after = 0
    while page := await reader.page(after, PAGE):
        for stored in page:
            yield stored
        after = page[-1].version
