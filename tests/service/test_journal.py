"""The update journals: complete above their floor, resync below it, losses counted."""

from __future__ import annotations

import asyncio

import msgspec

from coordinator.journal import RELEASE_PER_TURN, UpdateJournals


def upd(offset: int, type_: str = "view_committed") -> dict:
    return {"offset": offset, "type": type_}


def test_a_rank_reads_its_own_and_its_groups_updates_in_offset_order():
    j = UpdateJournals()
    j.publish_group("g", upd(3, "view_prepare"))
    j.publish_rank("g", 1, upd(4, "rank_state"))
    j.publish_rank("g", 2, upd(5, "rank_state"))
    j.publish_group("g", upd(6))
    j.publish_rank("g", 1, upd(6, "rank_state"))
    assert [(u["offset"], u["type"]) for u in j.since("g", 1, 0)] == [
        (3, "view_prepare"),
        (4, "rank_state"),
        (6, "view_committed"),
        (6, "rank_state"),
    ]
    assert [u["offset"] for u in j.since("g", 1, 4)] == [6, 6]
    assert j.since("g", 1, 6) == []
    assert [u["offset"] for u in j.since("g", 2, 0)] == [3, 5, 6]
    assert j.since("other", 0, 0) == []


def test_below_the_floor_the_reader_must_resync_and_drops_count_as_undelivered():
    j = UpdateJournals(group_limit=2, rank_limit=1)
    j.set_world_size("g", 2)
    j.publish_group("g", upd(1))
    j.mark_delivered("g", 0, 1)  # rank 0 read offset 1, rank 1 did not
    j.publish_group("g", upd(2))
    j.publish_group("g", upd(3))  # drops offset 1: unread by rank 1 only
    assert j.undelivered == 1
    assert j.since("g", 0, 0) is None  # offset 1 is gone: resync
    assert [u["offset"] for u in j.since("g", 0, 1)] == [2, 3]
    j.publish_rank("g", 0, upd(4, "rank_state"))
    j.publish_rank("g", 0, upd(5, "rank_state"))  # drops 4, unread by rank 0
    assert j.undelivered == 2
    assert j.since("g", 0, 3) is None
    assert [u["offset"] for u in j.since("g", 0, 4)] == [5]


def test_after_a_restart_the_floor_is_the_snapshot_offset():
    j = UpdateJournals(floor=100)
    assert j.since("g", 0, 99) is None
    assert j.since("g", 0, 100) == []
    j.publish_group("g", upd(101))
    assert [u["offset"] for u in j.since("g", 0, 100)] == [101]


async def test_a_publish_wakes_only_the_waiters_of_its_group():
    j = UpdateJournals()
    mine, theirs = j.waiter("g"), j.waiter("h")
    j.publish_group("g", upd(1))
    await asyncio.sleep(0)
    assert not mine.done()  # nothing wakes before the host's wake() (after projections)
    j.wake()
    await _turns(2)
    assert mine.done() and not theirs.done()
    assert j.waiter("g") is not mine  # the next waiter waits for the next publish


async def test_a_publish_releases_its_long_polls_a_few_per_turn_of_the_loop_in_arrival_order():
    j = UpdateJournals()
    waiters = [j.waiter("g") for _ in range(3 * RELEASE_PER_TURN + 1)]
    gone = waiters[1]
    gone.cancel()  # a poll that timed out is skipped, not counted
    j.forget("g", waiters[2])  # nor is one that stopped waiting
    live = [w for w in waiters if w is not gone and w is not waiters[2]]
    j.publish_group("g", upd(1))
    j.wake()
    released: list[int] = []
    for _ in range(len(live)):
        await asyncio.sleep(0)
        released.append(sum(w.done() for w in live))
        if released[-1] == len(live):
            break
    # one turn at a time, RELEASE_PER_TURN each, the earliest waiters first
    assert released[0] == RELEASE_PER_TURN
    assert all(b - a <= RELEASE_PER_TURN for a, b in zip(released, released[1:], strict=False))
    assert released[-1] == len(live)
    assert [w.done() for w in live[:RELEASE_PER_TURN]] == [True] * RELEASE_PER_TURN


async def test_wake_all_releases_every_poll_at_once():
    j = UpdateJournals()
    waiters = [j.waiter(g) for g in ("g", "h") for _ in range(5)]
    j.publish_group("g", upd(1))
    j.wake()  # some released in turns ...
    j.wake_all()  # ... and the rest now: the server is stopping
    assert all(w.done() for w in waiters)


def test_each_update_is_encoded_once_as_its_json():
    j = UpdateJournals()
    j.publish_group("g", upd(1))
    j.publish_rank("g", 0, {"offset": 2, "type": "rank_state", "state": "ACTIVE"})
    entries = j.entries_since("g", 0, 0)
    assert [msgspec.json.decode(raw) for _, raw in entries] == [u for u, _ in entries]
    assert [u for u, _ in entries] == j.since("g", 0, 0)


async def _turns(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)
