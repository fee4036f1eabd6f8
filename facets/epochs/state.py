"""The epochs facet's state in the fold: each group's epochs, the open epoch's plan and what
each rank holds of it (its sequence, its cursor, the assignment it holds), and their snapshot
form. The rules that change them are ``fold.py``'s."""

from __future__ import annotations

from typing import Any

import msgspec

from .effects import RankRange
from .inputs import EpochPlan
from .partition import Segment, length, split_at


class Holding:
    """One rank's part of an epoch."""

    __slots__ = ("sequence", "processed", "fence", "assignment", "grown")

    def __init__(self) -> None:
        #: every range it was given, in the order it reads them (shortened at the end by moves)
        self.sequence: list[Segment] = []
        #: positions of ``sequence`` reported processed, from its front
        self.processed = 0
        #: the assignment of the last move that shortened ``sequence``: older reports are stale
        self.fence = 0
        #: the assignment at which this part last changed (what its agent must hold)
        self.assignment = 0
        #: the moves that lengthened ``sequence`` since ``fence``, in order: (assignment,
        #: positions held before it). A report against an older assignment counts at most those
        self.grown: list[tuple[int, int]] = []

    @property
    def held(self) -> int:
        return length(self.sequence)

    @property
    def remaining(self) -> int:
        return self.held - self.processed

    def remaining_segments(self) -> list[Segment]:
        return split_at(self.sequence, self.processed)[1]

    def as_range(self, rank: int) -> RankRange:
        return RankRange(
            rank=rank,
            processed=self.processed,
            remaining=tuple(self.remaining_segments()),
        )

    def grown_after(self, assignment: int) -> tuple[int, int] | None:
        """The first move after ``assignment`` that lengthened the part: (its assignment,
        positions held before it), or None."""
        return next(((a, n) for a, n in self.grown if a > assignment), None)

    def to_list(self) -> list[Any]:
        return [
            [list(s) for s in self.sequence],
            self.processed,
            self.fence,
            self.assignment,
            [list(g) for g in self.grown],
        ]

    @classmethod
    def from_list(cls, data: list[Any]) -> Holding:
        h = cls()
        sequence, h.processed, h.fence, h.assignment = data[:4]
        h.sequence = [(int(s), int(n)) for s, n in sequence]
        # snapshots before it was kept: no growth known (their reports are bound by the fence)
        h.grown = [(int(a), int(n)) for a, n in (data[4] if len(data) > 4 else [])]
        return h


class Epoch:
    """The open (or last completed) epoch of a group."""

    __slots__ = (
        "plan",
        "offset",
        "version",
        "assignment",
        "decided",
        "holdings",
        "unprocessed",
        "completed",
    )

    def __init__(self, plan: EpochPlan, offset: int, version: int) -> None:
        self.plan = plan
        #: the offset of the plan's record
        self.offset = offset
        #: the view version the plan was made over
        self.version = version
        #: decisions so far (1: the plan's first split)
        self.assignment = 1
        #: the offset of the record of the last decision (the plan's, then the last move's)
        self.decided = offset
        self.holdings: dict[int, Holding] = {}
        #: positions not yet reported processed
        self.unprocessed = plan.dataset_size
        #: the offset of the record that completed it
        self.completed: int | None = None

    @property
    def number(self) -> int:
        return self.plan.epoch

    def holding(self, rank: int) -> Holding:
        h = self.holdings.get(rank)
        if h is None:
            h = self.holdings[rank] = Holding()
        return h

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan": msgspec.to_builtins(self.plan),
            "offset": self.offset,
            "version": self.version,
            "assignment": self.assignment,
            "decided": self.decided,
            "unprocessed": self.unprocessed,
            "completed": self.completed,
            "holdings": [[r, *self.holdings[r].to_list()] for r in sorted(self.holdings)],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Epoch:
        e = cls(msgspec.convert(d["plan"], EpochPlan), d["offset"], d["version"])
        e.assignment = d["assignment"]
        e.decided = d.get("decided", e.offset)  # snapshots before it was kept: the plan's
        e.unprocessed = d["unprocessed"]
        e.completed = d["completed"]
        e.holdings = {int(item[0]): Holding.from_list(item[1:]) for item in d["holdings"]}
        return e


class GroupEpochs:
    """What the facet keeps for one group."""

    __slots__ = ("current", "rates", "changes")

    def __init__(self) -> None:
        #: the open epoch, or the last one (completed); None before the first plan
        self.current: Epoch | None = None
        #: the latest rate each rank reported (positions a second), kept across epochs
        self.rates: dict[int, float] = {}
        #: decisions recorded for this group (plans and moves): their projection rows' numbers
        self.changes = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "current": None if self.current is None else self.current.to_dict(),
            "rates": [[r, self.rates[r]] for r in sorted(self.rates)],
            "changes": self.changes,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GroupEpochs:
        ge = cls()
        ge.current = None if d["current"] is None else Epoch.from_dict(d["current"])
        ge.rates = {int(r): float(v) for r, v in d["rates"]}
        ge.changes = d["changes"]
        return ge


# -- the facet ---------------------------------------------------------------------------------
