"""The epochs facet's effects: an epoch planned, a decision that moved ranges, an epoch
completed, and a replacement's whole part (the glossary of the rest is ``coordinator/fold/
effects.py``)."""

from __future__ import annotations

from typing import Any

import msgspec

from ...coordinator.fold.effects import Effect


class RankRange(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """One rank's part of an epoch after a decision: how many positions of its sequence it has
    reported processed, and what it still holds (``(start, length)`` segments of the epoch's
    permutation, in the order it reads them)."""

    rank: int
    processed: int
    remaining: tuple[tuple[int, int], ...]


class Move(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """Positions ``start .. start + length - 1`` went from ``from_rank``'s remaining work to
    the end of ``to_rank``'s."""

    from_rank: int
    to_rank: int
    start: int
    length: int


class EpochPlanned(Effect, frozen=True, kw_only=True, tag="epoch_planned"):
    """An epoch plan was declared: each active rank of view ``version`` holds its first range
    (assignment 1)."""

    group: str
    epoch: int
    plan: dict[str, Any]
    version: int
    assignment: int
    #: the group's decisions about its epochs so far (its ``assignment`` rows are numbered by it)
    change: int
    ranges: tuple[RankRange, ...]
    offset: int


class AssignmentChanged(Effect, frozen=True, kw_only=True, tag="assignment_changed"):
    """Ranges moved between ranks, as one committed decision (``assignment`` counts them per
    epoch). ``cause`` is ``view_committed`` (ranks left or joined the view ``version``) or
    ``reclaim`` (an idle rank took from the slowest one's tail); ``detail`` says why, for a
    person. ``moves`` is the whole change: each donor's tail leaves its sequence and each
    taker's slices are appended to its own, in the order listed, so every rank's new part is
    its part before the decision with the moves applied (nothing else is carried: a change
    costs its moves, not the parts of the ranks it touched). ``reported``: the ranks whose
    sequence, once what they gave is gone and before what they got is appended, is all
    reported processed (ranks that left the view; ranks that took work with none left): their
    cursor is its end, which a reader that never heard their progress cannot know otherwise."""

    group: str
    epoch: int
    assignment: int
    version: int
    cause: str
    detail: str
    change: int
    moves: tuple[Move, ...]
    reported: tuple[int, ...]
    offset: int


class EpochCompleted(Effect, frozen=True, kw_only=True, tag="epoch_completed"):
    """Every position of the epoch was reported processed, exactly once; ``processed`` is how
    many each rank that held a part processed."""

    group: str
    epoch: int
    processed: dict[int, int]
    offset: int


class PartSent(Effect, frozen=True, kw_only=True, tag="part_sent"):
    """A new incarnation of ``rank`` joined while the rank holds a part of the open epoch: it
    is sent that part whole, as of decision ``assignment`` (``processed``: what its
    predecessors reported, ``remaining``: what it still holds). The decisions in the log do
    not say how far a predecessor's reports got (a rank that finished its part and then died
    left no move behind), so a replacement reading them alone would start at the plan's
    cursor."""

    group: str
    rank: int
    epoch: int
    assignment: int
    processed: int
    remaining: tuple[tuple[int, int], ...]
    offset: int
