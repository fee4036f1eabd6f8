"""The projection rows a host derived and the log does not hold yet.

A leader writes them after each batch, with the consumer offset; rows whose write failed are
kept and written with the next batch. A standby writes nothing: it *holds* the rows it derives
until the leader's stored consumer offset shows them written, so a new leader can write what
its predecessor may not have (see ``coordinator.host.replica``).
"""

from __future__ import annotations

import logging

from ...eventlog import Log, LogError, ProjectionRow
from .ready import RowKey
from .snapshots import CONSUMER

log = logging.getLogger("foldplane.host")


class ProjectionRows:
    """Rows to write (``unwritten``) or, while holding, rows kept aside (``held``);
    ``projected``: the consumer offset the log is known to hold."""

    def __init__(self, log_: Log, *, projected: int) -> None:
        self.log = log_
        self.projected = projected
        self.unwritten: dict[RowKey, ProjectionRow] = {}
        self.held: dict[RowKey, ProjectionRow] = {}
        self.holding = False

    def add(self, rows: dict[RowKey, ProjectionRow]) -> None:
        """Rows derived from a batch (a later row of the same identity replaces an earlier)."""
        (self.held if self.holding else self.unwritten).update(rows)

    async def write(self, offset: int) -> None:
        """Write the unwritten rows with consumer offset ``offset``; a failure is logged and
        the rows are kept for the next write.

        Not durable (no fsync of its own): the rows are derived from records already on disk,
        and a start derives again every row after the consumer offset it finds stored, so a
        power loss that undoes this write (rows and offset together) loses nothing. The next
        append's fsync makes it durable with it."""
        rows = self.unwritten
        if not rows:
            return
        try:
            await self.log.write_projections(
                list(rows.values()), consumer=CONSUMER, offset=offset, durable=False
            )
        except LogError as exc:
            log.error("writing %d projection rows failed: %s", len(rows), exc)
            return
        self.projected = offset
        rows.clear()

    def hold(self) -> None:
        """Stop writing: every row not written yet, and every later one, is held."""
        self.holding = True
        self.held.update(self.unwritten)
        self.unwritten.clear()

    async def write_held(self, offset: int) -> None:
        """Stop holding, and write every held row with consumer offset ``offset``; a failure
        raises (and the rows stay unwritten)."""
        self.holding = False
        self.unwritten.update(self.held)
        self.held.clear()
        if self.unwritten:
            await self.log.write_projections(
                list(self.unwritten.values()), consumer=CONSUMER, offset=offset
            )
            self.unwritten.clear()
            self.projected = offset

    async def settle(self, offset: int) -> None:
        """Drop the held rows once the log's stored consumer offset reaches ``offset`` (the
        leader wrote every row a fold up to there derives)."""
        if self.held:
            stored = await self.log.get_consumer_offset(CONSUMER)
            if stored >= offset:
                self.held.clear()
            self.projected = max(self.projected, stored)
