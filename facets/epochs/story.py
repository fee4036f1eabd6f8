"""The data part of a rank's story (coordinator/host/story.py): which range of an epoch a rank
held, how far it got, who took over what it left, and what it was given and from whom.

Read from what the fold did, like the rest of the story: the epoch effects (``EpochPlanned``,
``AssignmentChanged``, ``EpochCompleted``) and, for what a rank held just before a move and
what it holds after it (a move carries only what moved), its part in the fold's ``epochs``
facet read just before and just after the step. Positions are positions of the
epoch's permutation (docs/data.md), written as inclusive ranges: ``10,000..14,999``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...coordinator.fold.effects import Effect
from ...coordinator.fold.machine import Coordinator
from ...coordinator.fold.reasons import abridged
from ...coordinator.host.facets import Entry, RankStoryPart
from ...eventlog import Record
from .effects import (
    AssignmentChanged,
    EpochCompleted,
    EpochPlanned,
    Move,
)
from .partition import split_at

#: Segments listed in one phrase before the rest are counted.
SEGMENTS_LISTED = 3

#: What a rank held of the open epoch just before a step: its sequence and its cursor.
Holding = tuple[tuple[tuple[int, int], ...], int]


def holding_of(machine: Coordinator, group: str, rank: int) -> Holding | None:
    """``rank``'s part of ``group``'s open epoch in the fold now (read only), or None."""
    e = machine.facet("epochs").epoch(group)
    if e is None or e.completed is not None:
        return None
    h = e.holdings.get(rank)
    return None if h is None else (tuple(h.sequence), h.processed)


def epoch_entry(
    effect: Any,
    rank: int,
    before: Holding | None,
    machine: Coordinator,
    *,
    was_active: bool,
    active: bool,
) -> tuple[str, str, dict[str, Any]] | None:
    """``(event, reason, fields)`` for an epoch effect that concerns ``rank``, or None.
    ``before`` is what the rank held just before the step, ``machine`` the fold just after it;
    ``was_active`` and ``active``: whether it was in the group's active ranks just before the
    step and is just after."""
    if isinstance(effect, EpochPlanned):
        return _planned(effect, rank)
    if isinstance(effect, AssignmentChanged):
        after = holding_of(machine, effect.group, rank)
        return _changed(
            effect, rank, before, after, joined=active and not was_active, left=not active
        )
    if isinstance(effect, EpochCompleted):
        e = machine.facet("epochs").epoch(effect.group)
        size = f" of {e.plan.dataset_size:,}" if e is not None else ""
        n = effect.processed.get(rank, 0)
        return (
            "epoch_completed",
            f"epoch {effect.epoch} complete: every position processed once; it processed "
            f"{n:,}{size}",
            {"epoch": effect.epoch, "processed": n},
        )
    return None


class EpochStory(RankStoryPart):
    """The epochs facet's part of a rank's story: each decision about its part."""

    held: Holding | None = None

    def before(self, machine: Coordinator, concerned: bool) -> None:
        self.held = holding_of(machine, self.group, self.rank) if concerned else None

    def effect(
        self,
        record: Record,
        effect: Effect,
        machine: Coordinator,
        *,
        was_active: bool,
        active: bool,
    ) -> Entry | None:
        return epoch_entry(
            effect, self.rank, self.held, machine, was_active=was_active, active=active
        )

    def summary(self, machine: Coordinator) -> str | None:
        return part_summary(machine, self.group, self.rank)


def epoch_label(entry: dict[str, Any]) -> str:
    return f"{entry['event']} e{entry['epoch']}"


def _planned(effect: EpochPlanned, rank: int) -> tuple[str, str, dict[str, Any]]:
    plan = effect.plan
    what = (
        f"epoch {effect.epoch} planned over version {effect.version} "
        f"({plan['dataset_size']:,} positions, {plan['split']} split"
        f"{', shuffled with seed ' + str(plan['seed']) if plan['shuffle'] else ''})"
    )
    mine = next((r for r in effect.ranges if r.rank == rank), None)
    held = list(mine.remaining) if mine is not None else []
    says = f"it holds {segments_text(held)}" if held else "it holds nothing (not active)"
    return (
        "epoch_planned",
        f"{what}: {says}",
        {"epoch": effect.epoch, "assignment": effect.assignment, "held": _lists(held)},
    )


def _changed(
    effect: AssignmentChanged,
    rank: int,
    before: Holding | None,
    after: Holding | None,
    *,
    joined: bool,
    left: bool,
) -> tuple[str, str, dict[str, Any]] | None:
    gave = [m for m in effect.moves if m.from_rank == rank]
    got = [m for m in effect.moves if m.to_rank == rank]
    if not gave and not got:
        return None
    now = None if after is None else (after[1], split_at(after[0], after[1])[1])
    head = f"epoch {effect.epoch}"
    phrases: list[str] = []
    if gave:
        total = sum(m.length for m in gave)
        takers = sorted({m.to_rank for m in gave})
        each = _by_rank(gave, lambda m: m.to_rank)
        if left and now is not None and not now[1]:
            held = segments_text(before[0]) if before is not None else "its part"
            processed = now[0]
            phrases.append(
                f"rank {rank} held {held}; it had processed {processed:,} when it left view "
                f"{effect.version}; {_ranks_word(takers)} took its remaining {total:,} ({each})"
            )
        else:
            phrases.append(
                f"rank {rank} gave {total:,} of its remaining positions to "
                f"{_ranks_word(takers)} ({each})"
            )
    if got:
        total = sum(m.length for m in got)
        donors = sorted({m.from_rank for m in got})
        each = _by_rank(got, lambda m: m.from_rank, ranges=True)
        if effect.cause == "reclaim":
            how = "it had finished its part and reclaimed"
        elif joined:
            how = f"it joined view {effect.version} and got"
        else:
            how = f"with view {effect.version} it got"
        phrases.append(f"{how} {total:,} positions from {_ranks_word(donors)} ({each})")
    reason = f"{head}: " + "; ".join(phrases) + f" [{effect.cause}: {effect.detail}]"
    fields: dict[str, Any] = {
        "epoch": effect.epoch,
        "assignment": effect.assignment,
        "version": effect.version,
        "cause": effect.cause,
        "moves": [[m.from_rank, m.to_rank, m.start, m.length] for m in [*gave, *got]],
    }
    if now is not None:
        fields["processed"] = now[0]
        fields["remaining"] = _lists(now[1])
    if before is not None:
        fields["held"] = _lists(before[0])
    return "assignment_changed", reason, fields


def _by_rank(moves: list[Move], key: Any, *, ranges: bool = False) -> str:
    """``0: 1,256 from 11,234, 1: ...``: what each counterpart took (where it starts), or with
    ``ranges`` what each one gave (``0: 175 in 1,325..1,499``); with one counterpart, only
    where."""
    parts: list[str] = []
    others = sorted({key(m) for m in moves})
    for other in others:
        mine = [(m.start, m.length) for m in moves if key(m) == other]
        total = sum(n for _, n in mine)
        many = ranges or len(mine) > 1
        where = f"in {segments_text(mine)}" if many else f"from {mine[0][0]:,}"
        parts.append(where if len(others) == 1 else f"{other}: {total:,} {where}")
    return abridged(parts)


def segments_text(segments: Iterable[tuple[int, int]]) -> str:
    """``10,000..14,999, 15,200..15,299``: inclusive ranges (a few, then a count)."""
    items = [(s, n) for s, n in segments if n > 0]
    text = ", ".join(f"{s:,}..{s + n - 1:,}" for s, n in items[:SEGMENTS_LISTED])
    if len(items) > SEGMENTS_LISTED:
        text += f", ... (+{len(items) - SEGMENTS_LISTED} more ranges)"
    return text or "nothing"


def part_summary(machine: Coordinator, group: str, rank: int) -> str | None:
    """``epoch 0: processed 4,200, 800 remaining``: the rank's part of the group's epoch."""
    e = machine.facet("epochs").epoch(group)
    if e is None:
        return None
    h = e.holdings.get(rank)
    if h is None:
        return f"epoch {e.number}: it holds nothing"
    state = "complete" if e.completed is not None else "open"
    return f"epoch {e.number} ({state}): processed {h.processed:,}, {h.remaining:,} remaining"


def _ranks_word(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + abridged([str(r) for r in ranks])


def _lists(segments: Iterable[tuple[int, int]]) -> list[list[int]]:
    return [[s, n] for s, n in segments]
