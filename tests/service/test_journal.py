"""The update journals: complete above their floor, resync below it, losses counted."""

from __future__ import annotations

import msgspec

from foldplane.coordinator.host.journal import UpdateJournals, encoded
from foldplane.wire.updates import (
    RankSetDelta,
    RankStateUpdate,
    ShutdownUpdate,
    Update,
    ViewCommittedUpdate,
    ViewPrepareUpdate,
    addressed_rank,
)

EMPTY = RankSetDelta()


def upd(offset: int, type_: str = "view_committed", rank: int = 0, pad: str = "") -> Update:
    """A small update of ``type_`` (``pad`` makes a view's JSON that many bytes longer)."""
    if type_ == "rank_state":
        return RankStateUpdate(
            offset=offset,
            group="g",
            rank=rank,
            state="HEALTHY",
            incarnation="i",
            rank_epoch=1,
            reason="",
        )
    if type_ == "view_prepare":
        return ViewPrepareUpdate(
            offset=offset,
            group="g",
            version=1,
            base=0,
            active_ranks=EMPTY,
            absent=[],
            ack_deadline_ts=0,
        )
    if type_ == "shutdown_with_save":
        return ShutdownUpdate(
            offset=offset, group="g", reason="max_failure_exceeded", detail="", checkpoint_rank=1
        )
    assert type_ == "view_committed"
    return ViewCommittedUpdate(
        offset=offset,
        group="g",
        version=1,
        base=0,
        states={},
        cause={"detail": pad},
        ts=0,
        active_ranks=EMPTY,
        healthy_set=EMPTY,
        acked_ranks=EMPTY,
        dropped_ranks=EMPTY,
    )


def test_a_rank_reads_its_own_and_its_groups_updates_in_offset_order():
    j = UpdateJournals()
    j.publish_group("g", upd(3, "view_prepare"))
    j.wake()
    j.publish_rank("g", 1, upd(4, "rank_state"))
    j.wake()
    j.publish_rank("g", 2, upd(5, "rank_state"))
    j.wake()
    j.publish_group("g", upd(6))
    j.wake()
    j.publish_rank("g", 1, upd(6, "rank_state"))
    j.wake()
    assert [(u.offset, u.type) for u in j.since("g", [1], 0)] == [
        (3, "view_prepare"),
        (4, "rank_state"),
        (6, "view_committed"),
        (6, "rank_state"),
    ]
    assert [u.offset for u in j.since("g", [1], 4)] == [6, 6]
    assert j.since("g", [1], 6) == []
    assert [u.offset for u in j.since("g", [2], 0)] == [3, 5, 6]
    assert j.since("other", [0], 0) == []


def test_several_ranks_read_their_groups_updates_once_and_each_ranks_own():
    """One poll per host: the group's updates are not repeated per rank."""
    j = UpdateJournals()
    j.publish_group("g", upd(3, "view_prepare"))
    j.wake()
    j.publish_rank("g", 1, upd(4, "rank_state", rank=1))
    j.wake()
    j.publish_rank("g", 2, upd(5, "rank_state", rank=2))
    j.wake()
    j.publish_rank("g", 3, upd(5, "rank_state", rank=3))
    j.wake()
    j.publish_group("g", upd(6))
    j.wake()
    j.publish_rank("g", 2, upd(6, "rank_state", rank=2))
    j.wake()
    assert [(u.offset, u.type, addressed_rank(u)) for u in j.since("g", [1, 2], 0)] == [
        (3, "view_prepare", None),
        (4, "rank_state", 1),
        (5, "rank_state", 2),
        (6, "view_committed", None),
        (6, "rank_state", 2),
    ]
    assert [u.offset for u in j.since("g", [1, 2], 4)] == [5, 6, 6]
    assert [u.offset for u in j.since("g", [0, 3], 0)] == [3, 5, 6]


def test_below_the_floor_the_reader_must_resync_and_drops_count_as_undelivered():
    size = len(encoded(upd(1)))  # every update below is this long
    state_size = len(encoded(upd(4, "rank_state")))
    j = UpdateJournals(group_limit_bytes=2 * size, rank_limit_bytes=state_size)
    j.set_world_size("g", 2)
    j.publish_group("g", upd(1))
    j.wake()
    j.mark_delivered("g", [0], 1)  # rank 0 read offset 1, rank 1 did not
    j.publish_group("g", upd(2))
    j.wake()
    assert j.since("g", [0], 0) == [upd(1), upd(2)]  # two fit
    j.publish_group("g", upd(3))  # drops offset 1: unread by rank 1 only
    j.wake()
    assert j.undelivered == 1
    assert j.since("g", [0], 0) is None  # offset 1 is gone: resync
    assert [u.offset for u in j.since("g", [0], 1)] == [2, 3]
    j.publish_rank("g", 0, upd(4, "rank_state"))
    j.wake()
    j.publish_rank("g", 0, upd(5, "rank_state"))  # drops 4, unread by rank 0
    j.wake()
    assert j.undelivered == 2
    assert j.since("g", [0], 3) is None
    assert j.since("g", [1], 3) == []  # rank 1's own journal lost nothing
    assert j.since("g", [0, 1], 3) is None  # a poll for both must resync
    assert [u.offset for u in j.since("g", [0], 4)] == [5]


def test_a_journal_is_bounded_in_bytes_not_in_entries():
    small = len(encoded(upd(1)))
    j = UpdateJournals(group_limit_bytes=4 * small)
    for offset in (1, 2, 3, 4):
        j.publish_group("g", upd(offset))
        j.wake()
    assert [u.offset for u in j.since("g", [0], 0)] == [1, 2, 3, 4]  # four small ones fit
    assert j.bytes == 4 * small
    large = upd(5, pad="x" * small)
    assert len(encoded(large)) == 2 * small
    j.publish_group("g", large)  # a large one takes the room of two small ones
    j.wake()
    assert j.since("g", [0], 1) is None
    assert j.since("g", [0], 2) == [upd(3), upd(4), large]
    assert j.bytes == 4 * small
    huge = upd(6, pad="x" * (10 * small))
    j.publish_group("g", huge)  # over the bound on its own: still kept, alone
    j.wake()
    assert j.since("g", [0], 5) == [huge]
    assert j.since("g", [0], 4) is None


def test_after_a_restart_the_floor_is_the_snapshot_offset():
    j = UpdateJournals(floor=100)
    assert j.since("g", [0], 99) is None
    assert j.since("g", [0], 100) == []
    j.publish_group("g", upd(101))
    j.wake()
    assert [u.offset for u in j.since("g", [0], 100)] == [101]


async def test_a_publish_wakes_only_the_waiters_of_its_group():
    j = UpdateJournals()
    mine, theirs = j.waiter("g"), j.waiter("h")
    j.publish_group("g", upd(1))
    j.wake()
    assert not mine.done()  # woken polls are answered when the host releases them
    assert j.releasing == 1
    assert j.release() == 0
    assert mine.done() and not theirs.done()
    assert j.waiter("g") is not mine  # the next waiter waits for the next publish


async def test_before_the_hosts_wake_a_publish_wakes_nobody():
    j = UpdateJournals()
    mine = j.waiter("g")
    j.publish_group("g", upd(1))  # projections are not written yet
    assert j.releasing == 0
    assert j.release() == 0 and not mine.done()


async def test_woken_polls_are_released_oldest_first_a_limited_number_at_a_time():
    j = UpdateJournals()
    waiters = [j.waiter("g") for _ in range(5)]
    j.publish_group("g", upd(1))
    j.wake()
    assert j.release(2) == 3
    assert [w.done() for w in waiters] == [True, True, False, False, False]
    assert j.release(2) == 1
    assert j.release(2) == 0
    assert all(w.done() for w in waiters)


async def test_a_burst_is_answered_in_shares_sized_when_it_arrives():
    j = UpdateJournals()
    first = [j.waiter("g") for _ in range(6)]
    j.publish_group("g", upd(1))
    j.wake()
    assert j.release_share(1, 2) == 3  # 6 spread over 2 shares
    assert [w.done() for w in first] == [True] * 3 + [False] * 3
    assert j.release_share(1, 2) == 0  # the share stays 3, not half of what is left
    second = [j.waiter("g") for _ in range(2)]
    j.publish_group("g", upd(2))
    j.wake()
    assert j.release_share(4, 8) == 0  # a new burst: sized afresh, at least 4
    assert all(w.done() for w in second)


async def test_a_poll_that_ended_meanwhile_takes_no_share_of_a_release():
    j = UpdateJournals()
    gone, expired, forgotten, waiting = (j.waiter("g") for _ in range(4))
    j.forget("g", forgotten)  # answered from the journal instead: never queued
    j.publish_group("g", upd(1))
    j.wake()
    gone.cancel()  # its client went away
    expired.set_result(None)  # its timeout passed
    assert j.releasing == 3
    assert j.release(1) == 0  # the one still waiting is answered by a release of one
    assert waiting.done() and not forgotten.done()


async def test_wake_all_answers_every_poll_of_every_group():
    j = UpdateJournals()
    waiters = [j.waiter("g"), j.waiter("h"), j.waiter("g")]
    j.wake_all()
    assert all(w.done() for w in waiters)
    assert j.releasing == 0


def test_a_published_update_is_read_only_once_the_host_has_woken_the_journals():
    """The host wakes the journals after the batch's projection rows are written: nothing is
    handed to a reader before that, so no reader holds an offset the host has not finished."""
    j = UpdateJournals()
    j.publish_group("g", upd(1))
    j.publish_rank("g", 0, upd(2, "rank_state"))
    assert j.since("g", [0], 0) == []
    j.wake()
    assert [u.offset for u in j.since("g", [0], 0)] == [1, 2]


def test_each_update_is_kept_as_its_json_with_its_offset():
    j = UpdateJournals()
    j.publish_group("g", upd(1))
    j.wake()
    j.publish_rank("g", 0, upd(2, "rank_state"))
    j.wake()
    entries = j.entries_since("g", [0], 0)
    assert [offset for offset, _ in entries] == [1, 2]
    assert [bytes(raw) for _, raw in entries] == [
        msgspec.json.encode(upd(1)),
        msgspec.json.encode(upd(2, "rank_state")),
    ]
    assert j.since("g", [0], 0) == [upd(1), upd(2, "rank_state")]


def test_a_held_shutdown_reaches_its_checkpoint_rank_before_the_others():
    j = UpdateJournals()
    j.publish_group("g", upd(3))
    j.wake()
    j.hold("g", 1, 5)
    j.publish_group("g", upd(5, "shutdown_with_save"))
    j.wake()
    assert [u.offset for u in j.since("g", [2], 0)] == [3]  # not yet: rank 1 first
    assert j.horizon("g", [2], 5) == 4 and j.horizon("g", [0, 1], 5) == 5
    assert [u.offset for u in j.since("g", [0, 1], 3)] == [5]  # a host carrying rank 1
    j.mark_delivered("g", [2], 5)  # another rank's delivery ends no hold
    assert j.since("g", [2], 3) == []
    j.mark_delivered("g", [0, 1], 5)
    assert [u.type for u in j.since("g", [2], 3)] == ["shutdown_with_save"]
    assert j.horizon("g", [2], 5) == 5


def test_twin_a_hold_let_go_at_its_bound_shows_the_shutdown_to_every_rank():
    j = UpdateJournals()
    j.hold("g", 1, 5)
    j.publish_group("g", upd(5, "shutdown_with_save"))
    j.wake()
    assert j.since("g", [2], 0) == []
    assert j.let_go("g") and not j.let_go("g")
    assert [u.offset for u in j.since("g", [2], 0)] == [5]
