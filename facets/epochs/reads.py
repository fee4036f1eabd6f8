"""The epochs facet's read model: what its routes and console panel read, as the host publishes
it once per cycle (``coordinator/fold/facets.py``, ``Facet.read_model``).

Each group's open (or last) epoch is rendered when it changes: its fields at once, its ranks'
rows one by one. A ``progress`` report moves one rank's cursor (and rate), so the next model
renders that rank's row again and shares every other row with the model before; a plan, a
move (a reclaim, a view's moves) or a restored snapshot renders the group's rows again. A group
no record changed is the model before's, shared. Nothing here is edited once built: ``status``
hands out a fresh top-level dict whose rows are shared (a reader replaces ``ranks``, never
edits a row).
"""

from __future__ import annotations

from typing import Any

import msgspec

from .state import GroupEpochs, Holding


def _row(ge: GroupEpochs, rank: int, h: Holding) -> dict[str, Any]:
    return {
        "rank": rank,
        "held": h.held,
        "processed": h.processed,
        "remaining": [list(s) for s in h.remaining_segments()],
        "assignment": h.assignment,
        "fence": h.fence,
        "rate": ge.rates.get(rank),
    }


class GroupEpochReads:
    """One group's epochs as of one cycle: the open (or last) epoch's fields (None before the
    first plan), its ranks' rows in rank order, and the count of decisions made."""

    __slots__ = ("head", "rows", "index", "changes")

    def __init__(
        self,
        head: dict[str, Any] | None,
        rows: tuple[dict[str, Any], ...],
        index: dict[int, int],
        changes: int,
    ) -> None:
        self.head = head
        self.rows = rows
        #: rank -> its row's position in ``rows`` (shared while the ranks held do not change)
        self.index = index
        self.changes = changes

    @classmethod
    def of(cls, group: str, ge: GroupEpochs) -> GroupEpochReads:
        """Rendered whole."""
        e = ge.current
        if e is None:
            return cls(None, (), {}, ge.changes)
        ranks = sorted(e.holdings)
        rows = tuple(_row(ge, r, e.holdings[r]) for r in ranks)
        return cls(_head(group, ge), rows, {r: i for i, r in enumerate(ranks)}, ge.changes)

    def with_ranks(self, group: str, ge: GroupEpochs, ranks: set[int]) -> GroupEpochReads:
        """This group's model with ``ranks``' rows and the epoch's fields rendered again (the
        epoch and the ranks it holds unchanged since, as a progress report leaves them)."""
        e = ge.current
        if e is None or self.head is None or len(e.holdings) != len(self.index):
            return GroupEpochReads.of(group, ge)
        rows = list(self.rows)
        index = self.index
        for rank in ranks:
            at = index.get(rank)
            h = e.holdings.get(rank)
            if (at is None) != (h is None):
                return GroupEpochReads.of(group, ge)
            if at is not None and h is not None:
                rows[at] = _row(ge, rank, h)
        return GroupEpochReads(_head(group, ge), tuple(rows), index, ge.changes)


def _head(group: str, ge: GroupEpochs) -> dict[str, Any]:
    e = ge.current
    assert e is not None
    return {
        "group": group,
        "epoch": e.number,
        "plan": msgspec.to_builtins(e.plan),
        "offset": e.offset,
        "version": e.version,
        "assignment": e.assignment,
        "status": "complete" if e.completed is not None else "open",
        "completed_offset": e.completed,
        "dataset_size": e.plan.dataset_size,
        "unprocessed": e.unprocessed,
    }


class EpochsReads:
    """The epochs facet as of one cycle (see the module docstring)."""

    __slots__ = ("_groups",)

    def __init__(self, groups: dict[str, GroupEpochReads]) -> None:
        self._groups = groups

    def planned(self, group: str) -> bool:
        """Whether ``group`` has an epoch plan (open or completed)."""
        got = self._groups.get(group)
        return got is not None and got.head is not None

    def changes(self, group: str) -> int:
        """How many decisions about ``group``'s epochs were made (its ``assignment`` rows)."""
        got = self._groups.get(group)
        return 0 if got is None else got.changes

    def status(self, group: str) -> dict[str, Any] | None:
        """The open or last epoch of ``group`` as plain data (``GET /groups/{g}/epochs``)."""
        got = self._groups.get(group)
        if got is None or got.head is None:
            return None
        return {**got.head, "ranks": list(got.rows)}


def read_model(
    groups: dict[str, GroupEpochs],
    previous: EpochsReads | None,
    dirty: dict[str, set[int] | None],
) -> EpochsReads:
    """The facet's read model (``Epochs.read_model``): from scratch when ``previous`` is None,
    else ``previous`` with the groups of ``dirty`` rendered again (a set: only those ranks'
    rows; None: the whole group)."""
    if previous is None:
        return EpochsReads({name: GroupEpochReads.of(name, ge) for name, ge in groups.items()})
    if not dirty:
        return previous
    out = dict(previous._groups)  # noqa: SLF001 - the model of the same module
    for name, ranks in dirty.items():
        ge = groups.get(name)
        old = out.get(name)
        if ge is None:
            out.pop(name, None)
        elif ranks is None or old is None:
            out[name] = GroupEpochReads.of(name, ge)
        else:
            out[name] = old.with_ranks(name, ge, ranks)
    return EpochsReads(out)
