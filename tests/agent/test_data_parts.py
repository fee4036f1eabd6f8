"""How ``EpochTracker`` keeps this rank's part from the data updates (docs/data.md): whole at
the plan and in a resync, each later decision's ``data_moves`` applied to it in order; an old
decision is skipped, a gap or moves that do not fit leave the part as it was and say so."""

from __future__ import annotations

from typing import Any

import pytest

from foldplane.facets.epochs.cursor import PartMismatch, apply_moves
from foldplane.facets.epochs.protocol import DataAssignmentUpdate, DataMovesUpdate, EpochPlanUpdate
from foldplane.facets.epochs.worker import EpochTracker, Part

PLAN = EpochPlanUpdate(
    offset=1,
    group="g",
    version=1,
    epoch=0,
    dataset_size=1000,
    seed=0,
    shuffle=True,
    split="equal",
    grain=1,
    lookahead=10,
    reclaim=False,
)


def whole(
    rank: int, assignment: int, processed: int, remaining: list[list[int]]
) -> DataAssignmentUpdate:
    return DataAssignmentUpdate(
        offset=1,
        group="g",
        epoch=0,
        rank=rank,
        assignment=assignment,
        processed=processed,
        remaining=tuple((s, n) for s, n in remaining),
    )


def moves(
    assignment: int, *moved: tuple[int, int, int, int], reported: list[int] | None = None
) -> DataMovesUpdate:
    return DataMovesUpdate(
        offset=1,
        group="g",
        epoch=0,
        assignment=assignment,
        moves=moved,
        reported=tuple(reported or ()),
    )


def tracker(rank: int, *updates: Any) -> EpochTracker:
    t = EpochTracker(rank, lambda *_: None)
    for u in (PLAN, *updates):
        t.on_update(u)
    return t


def test_a_donor_loses_its_tail_and_a_taker_appends_in_order() -> None:
    decision = moves(2, (2, 0, 600, 50), (2, 1, 650, 50), (2, 0, 900, 10), reported=[2])
    t0 = tracker(0, whole(0, 1, 100, [[100, 150]]), decision)
    assert t0.parts[0] == Part(0, 2, 100, [(100, 150), (600, 50), (900, 10)])
    t2 = tracker(2, whole(2, 1, 0, [[500, 200], [900, 10]]), decision)
    # it left: its sequence ends at what the coordinator counted processed (500..599)
    assert t2.parts[0] == Part(0, 2, 100, [])
    assert t2.accepted[0] == 100


def test_a_decision_that_does_not_touch_the_rank_only_moves_its_assignment_on() -> None:
    t = tracker(3, whole(3, 1, 40, [[750, 250]]), moves(2, (1, 0, 400, 10)))
    assert t.parts[0] == Part(0, 2, 40, [(750, 250)]) and t.error is None


def test_a_rank_that_holds_nothing_at_the_plan_takes_its_first_share() -> None:
    t = tracker(3, moves(2, (0, 3, 200, 20)))
    assert t.parts[0] == Part(0, 2, 0, [(200, 20)])


def test_a_decision_already_in_a_resynced_part_is_skipped() -> None:
    t = tracker(0, whole(0, 3, 100, [[100, 50]]), moves(3, (0, 1, 140, 10)))
    assert t.parts[0] == Part(0, 3, 100, [(100, 50)])


def test_a_resync_replaces_the_part_even_behind_it() -> None:
    # a log restored from an older copy: its state is the truth from now on
    t = tracker(0, whole(0, 4, 100, [[100, 50]]), whole(0, 2, 80, [[80, 90]]))
    assert t.parts[0] == Part(0, 2, 80, [(80, 90)])


def test_a_gap_leaves_the_part_and_says_which_decisions_never_arrived() -> None:
    t = tracker(0, whole(0, 1, 0, [[0, 100]]), moves(3, (0, 1, 90, 10)))
    assert t.parts[0] == Part(0, 1, 0, [(0, 100)])
    assert t.error is not None and "decisions 2..2 never arrived" in t.error


def test_moves_that_are_not_the_end_of_the_part_are_refused() -> None:
    t = tracker(0, whole(0, 1, 0, [[0, 100]]), moves(2, (0, 1, 50, 10)))
    assert t.parts[0] == Part(0, 1, 0, [(0, 100)])
    assert t.error is not None and "not the end of its part" in t.error
    with pytest.raises(PartMismatch, match="gave 20 positions .* holds 10"):
        apply_moves(0, 0, [(0, 10)], moves(2, (0, 1, 0, 20)))
