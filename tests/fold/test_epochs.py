"""Epoch plans in the fold: the first split, progress, redistribution when a rank leaves, a
joiner's share, reclaim, and every refusal (records at chosen times in, effects out)."""

from __future__ import annotations

from typing import Any

import pytest

from foldplane.coordinator.fold.effects import Refused
from foldplane.coordinator.fold.machine import Coordinator
from foldplane.facets.epochs.effects import (
    AssignmentChanged,
    EpochCompleted,
    EpochPlanned,
    PartSent,
)
from foldplane.facets.epochs.inputs import complete_plan
from foldplane.facets.epochs.partition import covers_exactly
from tests.fold.script import Script, of, one


def plan(s: Script, group: str = "g", **fields: Any) -> list[Any]:
    body = {"epoch": 0, "dataset_size": 1000, **fields}
    return s.record("epoch_plan", group, None, complete_plan(body))


def progress(
    s: Script,
    rank: int,
    processed: int,
    *,
    epoch: int = 0,
    assignment: int | None = None,
    rate: float | None = None,
    group: str = "g",
) -> list[Any]:
    e = s.m.facet("epochs").epoch(group)
    if assignment is None:
        assignment = e.holdings[rank].assignment if e and rank in e.holdings else 1
    payload: dict[str, Any] = {
        "incarnation": s.inc(rank, group),
        "epoch": epoch,
        "assignment": assignment,
        "processed": processed,
    }
    if rate is not None:
        payload["rate"] = rate
    return s.record("progress", group, rank, payload)


def sequences(m: Coordinator, group: str = "g") -> dict[int, list[tuple[int, int]]]:
    e = m.facet("epochs").epoch(group)
    assert e is not None
    return {r: list(h.sequence) for r, h in e.holdings.items()}


def assert_covers(m: Coordinator, group: str = "g") -> None:
    e = m.facet("epochs").epoch(group)
    assert e is not None
    assert covers_exactly(sequences(m, group).values(), e.plan.dataset_size) is None
    assert e.unprocessed == sum(h.remaining for h in e.holdings.values())


def formed(world_size: int = 4, **config: Any) -> Script:
    s = Script()
    s.form(world_size=world_size, **config)
    return s


def kill(s: Script, rank: int) -> list[Any]:
    """A reported death, then the auto-deactivation's barrier."""
    out = s.death(rank)
    out += s.at(1).tick()  # the reconciliation window (none for a death) and the settle
    out += s.ack_all()
    return out


def test_an_equal_plan_gives_each_active_rank_a_contiguous_range_in_rank_order() -> None:
    s = formed()
    planned = one(plan(s), EpochPlanned)
    assert [(r.rank, r.processed, r.remaining) for r in planned.ranges] == [
        (0, 0, ((0, 250),)),
        (1, 0, ((250, 250),)),
        (2, 0, ((500, 250),)),
        (3, 0, ((750, 250),)),
    ]
    assert planned.version == 1 and planned.assignment == 1
    assert_covers(s.m)


def test_grains_are_whole_and_the_partial_grain_goes_to_the_largest_share() -> None:
    s = formed(world_size=3)
    planned = one(plan(s, dataset_size=1000, grain=32), EpochPlanned)
    sizes = [sum(n for _, n in r.remaining) for r in planned.ranges]
    assert sum(sizes) == 1000
    # 31 grains over 3 ranks: 11, 10, 10 grains; the last 8 positions to the biggest share
    assert sizes == [11 * 32 + 8, 320, 320]


def test_ratios_split_by_the_ranks_ratios() -> None:
    s = formed()
    planned = one(plan(s, split="ratios", partition_ratios=[1, 1, 2, 0]), EpochPlanned)
    sizes = {r.rank: sum(n for _, n in r.remaining) for r in planned.ranges}
    assert sizes == {0: 250, 1: 250, 2: 500}  # rank 3 holds nothing


def test_progress_moves_the_cursor_and_the_last_report_completes_the_epoch() -> None:
    s = formed()
    plan(s)
    for r in range(4):
        assert progress(s, r, 100) == []
    e = s.m.facet("epochs").epoch("g")
    assert e.unprocessed == 600
    out: list[Any] = []
    for r in range(4):
        out += progress(s, r, 250)
    done = one(out, EpochCompleted)
    assert done.processed == {0: 250, 1: 250, 2: 250, 3: 250}
    # the same report again is accepted and changes nothing
    assert progress(s, 0, 250) == []


def test_a_rank_leaving_the_view_gives_its_remainder_to_the_survivors() -> None:
    s = formed()
    plan(s)
    for r in range(4):
        progress(s, r, 100)
    out = kill(s, 2)
    changed = one(out, AssignmentChanged)
    assert changed.cause == "view_committed" and changed.version == 2
    # rank 2 read 100 of 500..749: its 150 left (600..749) go to 0, 1, 3 in rank order
    assert [(m.from_rank, m.to_rank, m.start, m.length) for m in changed.moves] == [
        (2, 0, 600, 50),
        (2, 1, 650, 50),
        (2, 3, 700, 50),
    ]
    # the change is its moves and whose cursor is the end of its part; the parts are the fold's
    assert changed.reported == (2,)
    e = s.m.facet("epochs").epoch("g")
    assert e.holdings[2].remaining == 0 and e.holdings[2].processed == 100
    assert e.holdings[0].remaining_segments() == [(100, 150), (600, 50)]
    assert "rank 2 left the view" in changed.detail
    assert_covers(s.m)
    # the dead rank's part is now only what it reported
    assert sequences(s.m)[2] == [(500, 100)]


def test_a_replacement_gets_a_fair_share_from_the_others_tails_not_the_dead_ranks_range() -> None:
    s = formed(world_size=4)
    plan(s, dataset_size=1200, lookahead=10)
    for r in range(4):
        progress(s, r, 100)
    kill(s, 3)  # 200 left of rank 3's 900..1199 -> ranks 0..2
    for r in range(3):
        progress(s, r, 200)
    s.join(3, incarnation="g-3-b")
    s.links(3)
    out = s.propose("activate", [3])
    out += s.ack_all()
    changed = one(out, AssignmentChanged)
    assert changed.cause == "view_committed"
    e = s.m.facet("epochs").epoch("g")
    # 3 x (300 + 67ish - 200) left, the joiner takes about a quarter of it
    got = e.holdings[3].remaining
    assert got > 0
    assert all(m.to_rank == 3 and m.from_rank in (0, 1, 2) for m in changed.moves)
    # never a position the dead incarnation had reported
    assert all(not (900 <= m.start < 1000) for m in changed.moves)
    # donors keep at least their lookahead beyond what they reported
    for d in (0, 1, 2):
        assert e.holdings[d].remaining >= 10
        assert e.holdings[d].fence == e.assignment
    assert_covers(s.m)


def test_a_donor_report_against_the_assignment_before_the_move_is_stale() -> None:
    s = formed()
    plan(s, lookahead=0)
    for r in range(4):
        progress(s, r, 100)
    kill(s, 3)
    s.join(3, incarnation="g-3-b")
    s.links(3)
    s.propose("activate", [3])
    s.ack_all()
    e = s.m.facet("epochs").epoch("g")
    fence = e.holdings[0].fence
    assert fence > 1
    refused = one(progress(s, 0, 150, assignment=1), Refused)
    assert refused.code == "stale_assignment"
    assert f"shortened at assignment {fence}" in refused.message
    assert progress(s, 0, 150, assignment=fence) == []


def test_a_report_from_before_a_deactivation_and_reactivation_is_never_credited_to_the_new_share() -> (
    None
):
    """docs/data.md: a progress report is bound to the assignment it was made under. Rank 0
    read to 60 under the first split, 57 were accepted, then it was deactivated (its part cut
    at 57) and activated again (a new share appended): a late report of 60 against the part as
    it was at the cut must not count 3 positions of the new share it never read."""
    s = formed()
    plan(s, lookahead=10)
    for r in range(4):
        progress(s, r, 57)
    s.propose("deactivate", [0])
    s.ack_all()
    e = s.m.facet("epochs").epoch("g")
    cut = e.assignment
    assert e.holdings[0].held == 57 and e.holdings[0].fence == cut
    s.propose("activate", [0])
    s.ack_all()
    grown = e.assignment
    assert grown == cut + 1 and e.holdings[0].held > 57
    # before the cut: stale by the fence
    assert one(progress(s, 0, 60, assignment=1), Refused).code == "stale_assignment"
    # at the cut: the part then held 57; the 3 more are positions given at the reactivation
    refused = one(progress(s, 0, 60, assignment=cut), Refused)
    assert refused.code == "stale_assignment"
    assert f"grew at assignment {grown} after its first 57 positions" in refused.message
    assert e.holdings[0].processed == 57
    # what it made under the part it holds now counts, and the same count again changes nothing
    assert progress(s, 0, 60, assignment=grown) == []
    assert progress(s, 0, 60, assignment=cut) == []
    assert e.holdings[0].processed == 60
    assert_covers(s.m)


def test_growth_binds_only_reports_that_reach_into_it() -> None:
    """A rank that was given more (a joiner's share, a reclaim) still has its reports against
    the assignment before it accepted, up to what it held then."""
    s = formed(world_size=2)
    plan(s, split="throughput", lookahead=0)
    progress(s, 1, 100, rate=100.0)
    out = progress(s, 0, 500, rate=200.0)  # rank 0 ran dry and reclaimed from rank 1
    changed = one(out, AssignmentChanged)
    e = s.m.facet("epochs").epoch("g")
    assert e.holdings[0].grown == [(changed.assignment, 500)]
    assert one(progress(s, 0, 501, assignment=1), Refused).code == "stale_assignment"
    assert progress(s, 0, 501, assignment=changed.assignment) == []


def test_a_replacement_of_a_rank_that_finished_its_part_is_sent_it_whole() -> None:
    """Rank 2 reported its whole part and then died: no move says so, so its replacement is
    sent its part as the fold holds it (everything processed), and its reports go on from
    there; with its activation it takes a share of what is unclaimed."""
    s = formed()
    plan(s, lookahead=10)
    progress(s, 2, 250)
    for r in (0, 1, 3):
        progress(s, r, 20)
    kill(s, 2)
    joined = s.join(2, incarnation="g-2-b")
    sent = one(joined, PartSent)
    e = s.m.facet("epochs").epoch("g")
    assert (sent.rank, sent.processed, sent.remaining) == (2, 250, ())
    assert sent.assignment == e.assignment
    s.links(2)
    s.propose("activate", [2])
    out = s.ack_all()
    changed = one(out, AssignmentChanged)
    assert {m.to_rank for m in changed.moves} == {2}
    got = e.holdings[2].remaining
    # its reports count on from its predecessor's
    assert progress(s, 2, 250 + got, assignment=e.assignment) == []
    assert_covers(s.m)
    # the same incarnation joining again is not a new process: nothing is sent
    assert of(s.join(2, incarnation="g-2-b"), PartSent) == []


def test_reclaim_takes_from_the_slowest_tail_so_both_finish_together() -> None:
    s = formed(world_size=2)
    plan(s, split="throughput", lookahead=0)  # reclaim is on by default for throughput
    progress(s, 0, 100, rate=200.0)
    progress(s, 1, 100, rate=100.0)
    out = progress(s, 0, 500, rate=200.0)  # rank 0 ran dry; rank 1 has 400 left at 100/s
    changed = one(out, AssignmentChanged)
    assert changed.cause == "reclaim"
    # rank 0 is twice as fast: it takes two thirds of rank 1's 400
    assert [(m.from_rank, m.to_rank, m.length) for m in changed.moves] == [(1, 0, 266)]
    assert changed.moves[0].start == 1000 - 266
    assert_covers(s.m)


def test_a_move_fences_only_the_ranks_it_shortens() -> None:
    s = formed(world_size=3)
    plan(s, dataset_size=900, split="throughput", lookahead=0)
    progress(s, 2, 10, rate=100.0)
    progress(s, 1, 10, rate=100.0)
    out = progress(s, 0, 300, rate=200.0)  # rank 0 ran dry: it reclaims from one of 1, 2
    changed = one(out, AssignmentChanged)
    (donor,) = {m.from_rank for m in changed.moves}
    other = 3 - donor  # the rank the move did not touch
    e = s.m.facet("epochs").epoch("g")
    assert e.holdings[other].fence == 0 and e.holdings[donor].fence == changed.assignment
    # the untouched rank's report against the first split is still good; the donor's is stale
    assert progress(s, other, 20, assignment=1) == []
    refused = one(progress(s, donor, 20, assignment=1), Refused)
    assert refused.code == "stale_assignment"
    assert progress(s, donor, 20, assignment=changed.assignment) == []


def test_reclaim_never_takes_the_donors_lookahead() -> None:
    s = formed(world_size=2)
    plan(s, split="throughput", lookahead=390)
    progress(s, 0, 500, rate=200.0)  # rank 1 has 500 left, 390 of them inside its lookahead
    e = s.m.facet("epochs").epoch("g")
    # a third of 500 would balance the rates, but only 110 lie beyond the lookahead
    assert e.holdings[1].remaining == 390
    assert e.holdings[0].remaining == 110
    assert_covers(s.m)


def test_without_reclaim_a_finished_rank_waits() -> None:
    s = formed(world_size=2)
    plan(s)
    assert of(progress(s, 0, 500), AssignmentChanged) == []


@pytest.mark.parametrize(
    ("fields", "code", "text"),
    [
        ({"dataset_size": 0}, "invalid_event", "dataset_size must be an integer in 1.."),
        ({"split": "fastest"}, "invalid_event", "split must be one of"),
        (
            {"split": "ratios", "partition_ratios": [1, 2]},
            "invalid_event",
            "one ratio per rank (4)",
        ),
        ({"split": "ratios", "partition_ratios": [0, 0, 0, 0]}, "invalid_event", "no active rank"),
        ({"grain": 5000}, "invalid_event", "grain 5000 is larger than the dataset"),
        ({"lookahead": -1}, "invalid_event", "lookahead must be an integer"),
        ({"colour": "blue"}, "invalid_event", "unknown field(s) ['colour']"),
    ],
)
def test_a_malformed_plan_is_refused_naming_the_field(fields: dict, code: str, text: str) -> None:
    s = formed()
    refused = one(plan(s, **fields), Refused)
    assert refused.code == code and text in refused.message
    assert s.m.facet("epochs").epoch("g") is None


def test_plans_for_unknown_or_unformed_groups_and_overlapping_epochs_are_refused() -> None:
    s = Script()
    assert one(plan(s, group="nope"), Refused).code == "unknown_group"
    s.create("h", 2)
    assert one(plan(s, group="h"), Refused).code == "group_not_formed"
    s.form()
    plan(s)
    planned_at = s.offset
    again = one(plan(s), Refused)
    assert again.code == "epoch_conflict" and "already planned" in again.message
    other = one(plan(s, dataset_size=999), Refused)
    assert "dataset_size: 1000 (planned) vs 999" in other.message
    still = one(plan(s, epoch=1), Refused)
    assert still.code == "epoch_conflict" and "epoch 0 is still open: 1000 of 1000" in still.message
    # the repeat is answered with the first plan by the host (nothing appended)
    same = complete_plan({"epoch": 0, "dataset_size": 1000})
    assert s.m.repeat_of("epoch_plan", "g", None, same) == planned_at


def test_bad_progress_is_refused_and_changes_nothing() -> None:
    s = formed()
    plan(s)
    progress(s, 0, 100)
    cases = [
        (progress(s, 0, 50), "invalid_event", "would go back"),
        (progress(s, 0, 251), "invalid_event", "cannot have processed 251"),
        (progress(s, 0, 120, epoch=7), "unknown_epoch", "epoch 7 is not"),
        (progress(s, 0, 120, assignment=5), "invalid_event", "assignment 5 of epoch 0 does not"),
    ]
    for effects, code, text in cases:
        refused = one(effects, Refused)
        assert refused.code == code and text in refused.message, refused.message
    stale = s.record(
        "progress", "g", 0, {"incarnation": "old", "epoch": 0, "assignment": 1, "processed": 120}
    )
    assert one(stale, Refused).code == "stale_incarnation"
    negative = s.record(
        "progress",
        "g",
        0,
        {"incarnation": s.inc(0), "epoch": 0, "assignment": 1, "processed": -1},
    )
    assert one(negative, Refused).code == "invalid_event"
    assert s.m.facet("epochs").epoch("g").holdings[0].processed == 100


def test_snapshot_and_tail_give_the_full_replay() -> None:
    s = formed()
    plan(s, split="throughput", lookahead=5)
    progress(s, 0, 100, rate=10.0)
    kill(s, 1)
    restored = Coordinator.from_snapshot(s.m.snapshot())
    tail = Script(restored)
    tail.incarnations = dict(s.incarnations)
    tail.now = s.now
    for r in (0, 2, 3):
        a = progress(s, r, 200, rate=20.0)
        b = progress(tail, r, 200, rate=20.0)
        assert a == b
    assert s.m.snapshot() == restored.snapshot()


def test_a_replacement_with_an_empty_part_reclaims_at_once() -> None:
    """Rank 1 finished its part while rank 0 looked much faster, so reclaim took nothing then;
    rank 0 has slowed down since. Rank 1 dies and, the group not deactivating on failure, stays
    in the view; its replacement is sent its part, empty, and reclaims from rank 0 at once
    instead of waiting for the epoch's end."""
    s = formed(world_size=2, auto_deactivate_on_failure=False)
    plan(s, split="throughput", lookahead=0)
    progress(s, 0, 10, rate=1000.0)
    assert of(progress(s, 1, 500, rate=1.0), AssignmentChanged) == []  # too slow to help
    progress(s, 0, 20, rate=1.0)  # rank 0 slowed down to rank 1's pace
    e = s.m.facet("epochs").epoch("g")
    assert e.holdings[1].remaining == 0 and e.holdings[0].remaining == 480
    s.death(1)
    joined = s.join(1, incarnation="g-1-b")
    sent = one(joined, PartSent)
    assert (sent.rank, sent.remaining) == (1, ())
    changed = one(joined, AssignmentChanged)
    assert changed.cause == "reclaim"
    assert [(m.from_rank, m.to_rank, m.length) for m in changed.moves] == [(0, 1, 240)]
    assert_covers(s.m)


def test_twin_a_dry_rank_that_reports_again_reclaims_what_became_spare() -> None:
    s = formed(world_size=2)
    plan(s, split="throughput", lookahead=0)
    progress(s, 0, 10, rate=1000.0)
    assert of(progress(s, 1, 500, rate=1.0), AssignmentChanged) == []
    progress(s, 0, 20, rate=1.0)
    changed = one(progress(s, 1, 500, rate=1.0), AssignmentChanged)
    assert changed.cause == "reclaim" and {m.to_rank for m in changed.moves} == {1}
    assert_covers(s.m)
