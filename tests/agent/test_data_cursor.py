"""A rank's count follows its part (docs/data.md, "A report is bound to the assignment it was
made under"): what the sampler yielded from a share the rank no longer holds counts nothing
when the training loop marks it, so a report never credits a share given later with
positions read from an old one. ``facets.epochs.cursor.ReadCursor`` on its own, then inside the real
``EpochTracker`` fed the updates a deactivation and a reactivation send."""

from __future__ import annotations

from typing import Any

from foldplane.facets.epochs.cursor import ReadCursor, same_until
from foldplane.facets.epochs.worker import EpochTracker, Part
from tests.agent.test_data_parts import PLAN, moves, whole


def read(cursor: ReadCursor, n: int) -> list[int]:
    return [cursor.take() for _ in range(n)]


def test_a_cut_makes_what_was_yielded_beyond_it_void_and_yields_from_it_again() -> None:
    c = ReadCursor()
    read(c, 240)
    assert c.mark(215) == 215
    c.cut(230)
    assert (c.yielded, c.processed, c.void, c.unmarked) == (230, 215, 10, 25)
    # the loader's 25 still in flight: 15 of the part, then the 10 it no longer holds
    assert c.mark(25) == 15
    assert (c.processed, c.unmarked) == (230, 0)
    assert read(c, 2) == [230, 231]


def test_a_cut_below_a_mark_takes_the_mark_back() -> None:
    c = ReadCursor()
    read(c, 240)
    c.mark(235)
    c.cut(230)
    assert (c.yielded, c.processed, c.void) == (230, 230, 5)
    read(c, 4)
    # the void 5 come first (they were yielded first), then the 4 of the new part count
    assert c.mark(9) == 4 and c.processed == 234


def test_voids_keep_their_place_in_the_order_marks_come() -> None:
    c = ReadCursor()
    read(c, 20)
    c.cut(10)  # 10 void at index 10
    read(c, 5)  # 10..14 of a new share
    c.cut(12)  # 12..14 void too, after the first 10
    assert c.void == 13 and c.unmarked == 25
    assert c.mark(10) == 10  # 0..9
    assert c.mark(10) == 0  # the first void
    assert c.mark(2) == 2 and c.processed == 12  # 10, 11
    assert c.mark(3) == 0 and c.unmarked == 0


def test_advance_skips_what_another_incarnation_processed() -> None:
    c = ReadCursor(0)
    read(c, 5)
    c.advance(100)
    assert (c.yielded, c.processed, c.void) == (100, 100, 5)
    assert c.mark(5) == 0
    assert read(c, 1) == [100]


def test_same_until_finds_the_first_position_that_changed() -> None:
    old = [(0, 250)]
    assert same_until(0, old, 0, [(0, 250)], 240) == 240
    assert same_until(0, old, 0, [(0, 230), (900, 10)], 240) == 230
    assert same_until(0, old, 230, [], 240) == 230
    # below the larger base both are processed: they agree there
    assert same_until(0, old, 100, [(100, 150)], 240) == 240
    assert same_until(0, [(0, 10), (50, 10)], 0, [(0, 15), (55, 5)], 20) == 10


class Reports:
    def __init__(self) -> None:
        self.sent: list[tuple[int, int, int]] = []

    def __call__(self, epoch: int, assignment: int, processed: int, rate: Any) -> None:
        self.sent.append((epoch, assignment, processed))


def test_a_deactivated_and_reactivated_rank_counts_only_what_it_read_of_its_new_share() -> None:
    """The schedule of the bug: rank 0 read to 240 of 0..249 with 230 accepted, was
    deactivated (its 20 not reported went to 1..3) and activated again (it took 400..449).
    The 10 it had read beyond 230 are marked after all that: they count nothing, the next
    positions it reads are the new share's, and each report counts what it read of them."""
    reports = Reports()
    t = EpochTracker(0, reports)
    for u in (PLAN, whole(0, 1, 0, [[0, 250]])):
        t.on_update(u)
    c = t.start_reading(0)
    read(c, 240)
    c.mark(230)
    t.want_report(0, None, urgent=True)
    assert reports.sent == [(0, 1, 230)]
    t.on_answer(0, 1, 230, None, "")
    deactivated = moves(2, (0, 1, 230, 7), (0, 2, 237, 7), (0, 3, 244, 6), reported=[0])
    reactivated = moves(3, (1, 0, 400, 50))
    t.on_update(deactivated)
    t.on_update(reactivated)
    assert t.parts[0] == Part(0, 3, 230, [(400, 50)])
    # the training loop now marks the batch it read before: 230..239 of the old share
    assert c.mark(10) == 0 and c.processed == 230
    t.want_report(0, None, urgent=True)
    assert reports.sent == [(0, 1, 230)]  # nothing new to count
    # it reads on from the new share, and counts those
    assert [t.parts[0].position(i) for i in read(c, 10)] == list(range(400, 410))
    c.mark(10)
    t.want_report(0, None, urgent=True)
    assert reports.sent[-1] == (0, 3, 240)


def test_a_part_sent_whole_with_the_same_positions_keeps_what_was_read() -> None:
    reports = Reports()
    t = EpochTracker(1, reports)
    for u in (PLAN, whole(1, 1, 0, [[250, 250]])):
        t.on_update(u)
    c = t.start_reading(0)
    read(c, 40)
    c.mark(20)
    t.on_update(moves(2, (3, 1, 900, 10)))  # it got more: nothing it read changed
    t.on_update(whole(1, 2, 20, [[270, 230], [900, 10]]))  # a resync, same part
    assert c.void == 0 and c.yielded == 40 and c.processed == 20
    assert c.mark(20) == 20
