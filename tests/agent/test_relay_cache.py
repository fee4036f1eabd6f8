"""The relay's pure parts: merging workers' event requests, splitting the answer, the cache.

No network: these are the rules the relay's threads apply (agent/relay.py).
"""

from __future__ import annotations

from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from foldplane.agent.relay import (
    EventsRequest,
    Served,
    UpdateCache,
    split_results,
    take_batch,
    with_token,
)
from foldplane.wire.updates import (
    AgentUpdate,
    RankSetDelta,
    RankStateUpdate,
    ShutdownUpdate,
    ViewCommittedUpdate,
    addressed_rank,
)


def request(n: int, rank: int = 0, nbytes: int = 100) -> EventsRequest:
    return EventsRequest([{"type": "heartbeat", "rank": rank, "i": i} for i in range(n)], nbytes)


EMPTY = RankSetDelta()


def view(offset: int, version: int) -> ViewCommittedUpdate:
    """A group's update (every rank reads it)."""
    return ViewCommittedUpdate(
        offset=offset,
        group="g",
        version=version,
        base=version - 1,
        states={},
        cause={},
        ts=0,
        active_ranks=EMPTY,
        healthy_set=EMPTY,
        acked_ranks=EMPTY,
        dropped_ranks=EMPTY,
    )


def state(offset: int, rank: int, value: str = "HEALTHY") -> RankStateUpdate:
    """One rank's own update."""
    return RankStateUpdate(
        offset=offset, group="g", rank=rank, state=value, incarnation="i", rank_epoch=1, reason=""
    )


# -- events ----------------------------------------------------------------------------------


def test_each_workers_token_goes_on_its_own_events_and_a_named_token_is_kept():
    events = [{"type": "heartbeat", "rank": 1}, {"type": "ack", "rank": 1, "token": "mine"}]
    assert with_token(events, "t1") == [
        {"type": "heartbeat", "rank": 1, "token": "t1"},
        {"type": "ack", "rank": 1, "token": "mine"},
    ]
    assert "token" not in events[0]  # the worker's own dicts are not changed
    assert with_token(events[:1], None) == [{"type": "heartbeat", "rank": 1}]


def test_a_batch_takes_whole_requests_in_order_up_to_the_event_limit():
    queue = deque([request(3, 0), request(4, 1), request(2, 2)])
    batch = take_batch(queue, max_events=7, max_bytes=10_000)
    assert [r.events[0]["rank"] for r in batch] == [0, 1]
    assert [r.events[0]["rank"] for r in queue] == [2]
    assert take_batch(queue, max_events=7, max_bytes=10_000)[0].events[0]["rank"] == 2
    assert not queue


def test_twin_a_batch_stops_at_the_byte_limit_but_always_takes_its_first_request():
    queue = deque([request(1, 0, nbytes=900), request(1, 1, nbytes=200)])
    assert len(take_batch(queue, max_events=100, max_bytes=1000)) == 1
    oversized = deque([request(10, 0), request(1, 1)])
    assert [len(r.events) for r in take_batch(oversized, max_events=5)] == [10]


def test_the_answer_is_split_back_to_each_request_in_order():
    batch = [request(2, 0), request(1, 1), request(3, 2)]
    results = [{"offset": i} for i in range(6)]
    replies = split_results(batch, {"term": 4, "results": results})
    assert replies == [
        (200, {"term": 4, "results": results[0:2]}),
        (200, {"term": 4, "results": results[2:3]}),
        (200, {"term": 4, "results": results[3:6]}),
    ]


def test_twin_an_answer_with_the_wrong_number_of_results_is_an_error_for_every_request():
    batch = [request(2, 0), request(1, 1)]
    replies = split_results(batch, {"term": 1, "results": [{"offset": 1}]})
    assert [status for status, _ in replies] == [502, 502]
    assert replies[0][1]["error"] == "bad_answer" and "1 results for 3" in replies[0][1]["detail"]


def test_requests_without_tokens_never_share_a_batch_with_requests_that_have_them():
    plain = [request(1, 0), request(1, 1)]
    tokened = [EventsRequest(with_token([{"rank": 2}], "t2"), 10, tokened=True) for _ in range(2)]
    queue = deque([plain[0], tokened[0], tokened[1], plain[1]])
    assert [len(take_batch(queue)) for _ in range(3)] == [1, 2, 1]
    assert not queue


# -- the update cache ------------------------------------------------------------------------


def test_each_rank_gets_the_group_updates_and_its_own_after_its_own_offset():
    cache = UpdateCache()
    cache.add([0, 1], 0, [view(5, 1), state(5, 0), state(5, 1), state(8, 1, "SYNCED")], 9)
    got0 = cache.serve(0, 0)
    assert got0 is not None and got0.updates == (view(5, 1), state(5, 0)) and got0.next_after == 9
    got1 = cache.serve(1, 5)
    assert got1 is not None and got1.updates == (state(8, 1, "SYNCED"),)
    assert got1.next_after == 9 and not got1.resync
    nothing = cache.serve(0, 9)
    assert nothing is not None and nothing.updates == () and nothing.next_after == 9


def test_twin_a_rank_the_answer_did_not_carry_or_an_offset_below_it_is_not_served():
    cache = UpdateCache()
    cache.add([0], 4, [view(5, 1), state(5, 0)], 9)
    assert cache.serve(1, 4) is None  # rank 1's own updates were not asked for
    assert cache.serve(0, 3) is None  # the cache knows nothing of offset 4
    assert cache.serve(0, 4) is not None


def test_answers_that_overlap_extend_what_is_held_and_repeats_are_kept_once():
    cache = UpdateCache()
    cache.add([0], 0, [view(5, 1), state(5, 0)], 9)
    # the next poll also carries rank 1, from rank 1's own offset 3: it repeats offset 5
    cache.add([0, 1], 3, [view(5, 1), state(5, 1), view(11, 2)], 12)
    got0 = cache.serve(0, 0)
    assert got0 is not None and got0.updates == (view(5, 1), state(5, 0), view(11, 2))
    got1 = cache.serve(1, 3)
    assert got1 is not None and got1.updates == (view(5, 1), state(5, 1), view(11, 2))
    assert cache.serve(1, 2) is None
    assert len(cache) == 4


def test_an_answer_that_does_not_join_what_is_held_starts_the_cache_again():
    cache = UpdateCache()
    cache.add([0], 0, [view(5, 1)], 9)
    cache.add([1], 20, [view(25, 2)], 30)  # nothing known of (9, 20]
    assert cache.serve(0, 9) is None
    got = cache.serve(1, 20)
    assert got is not None and got.updates == (view(25, 2),)


def test_a_resync_goes_to_each_rank_it_names_until_that_rank_polls_past_it():
    cache = UpdateCache()
    cache.add([0, 1], 0, [view(5, 1)], 9)
    resync = [view(40, 3), state(41, 0), state(42, 1)]
    cache.add([0, 1], 9, resync, 50, resync=True)
    got0 = cache.serve(0, 9)
    assert got0 is not None and got0.resync and got0.updates == (view(40, 3), state(41, 0))
    assert got0.next_after == 50
    again = cache.serve(0, 9)  # the worker lost the answer and asks again: the same resync
    assert again == got0
    after = cache.serve(0, 50)
    assert after is not None and not after.resync and after.updates == ()
    got1 = cache.serve(1, 0)
    assert got1 is not None and got1.resync and got1.updates == (view(40, 3), state(42, 1))
    assert not got1.restored
    # a log restored from an older copy is behind the reader: after > its head gets the resync
    cache.add([0], 50, [view(30, 2)], 35, resync=True, restored=True)
    restored = cache.serve(0, 50)
    assert restored is not None and restored.resync and restored.restored
    assert restored.next_after == 35 and restored.updates == (view(30, 2),)
    resumed = cache.serve(0, 35)  # the reader resumed at the restored log's head
    assert resumed is not None and not resumed.resync and resumed.updates == ()


def test_the_cache_stays_within_its_bytes_and_what_it_dropped_is_no_longer_served():
    cache = UpdateCache(max_bytes=2_000)
    offset = 0
    for _ in range(200):
        offset += 1
        cache.add([0], offset - 1, [state(offset, 0), view(offset, offset)], offset)
        assert cache.nbytes <= 2_000
    assert cache.dropped > 0
    assert cache.serve(0, 0) is None  # the oldest updates are gone: such a poll goes upstream
    lo = cache.oldest()
    assert lo is not None
    got = cache.serve(0, lo - 1)
    assert got is not None and got.updates[0].offset == lo and got.next_after == offset
    assert cache.serve(0, lo - 2) is None


def test_trim_below_drops_what_every_rank_has_read():
    cache = UpdateCache()
    cache.add([0, 1], 0, [view(5, 1), state(6, 0), state(7, 1), view(8, 2)], 9)
    cache.trim_below(6)
    assert len(cache) == 2
    assert cache.serve(1, 5) is None
    got = cache.serve(1, 6)
    assert got is not None and got.updates == (state(7, 1), view(8, 2))


def test_forget_drops_a_ranks_own_updates():
    cache = UpdateCache()
    cache.add([0, 1], 0, [view(5, 1), state(5, 0), state(5, 1)], 9)
    before = cache.nbytes
    cache.forget(1)
    assert cache.serve(1, 0) is None
    assert len(cache) == 2 and cache.nbytes < before


# -- a property: whatever the cache serves is exactly what the coordinator would say --------

LOG = [
    view(o, o) if o % 3 == 0 else state(o, o % 4) for o in range(1, 41)
]  # a group of 4 ranks: every third offset is the group's, the rest one rank's


def truth(rank: int, after: int, upto: int) -> tuple[AgentUpdate, ...]:
    return tuple(u for u in LOG if after < u.offset <= upto and addressed_rank(u) in (None, rank))


facts = st.tuples(
    st.frozensets(st.integers(0, 3), min_size=1),
    st.integers(0, 40),
    st.integers(0, 40),
)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("answer"), facts),
        st.tuples(st.just("trim"), st.integers(0, 40)),
        st.tuples(st.just("forget"), st.integers(0, 3)),
        st.tuples(st.just("resync"), facts),
    ),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(steps=steps, max_bytes=st.sampled_from([300, 900, 4_500, 1_000_000]))
def test_what_the_cache_serves_is_exactly_the_coordinators_answer(steps, max_bytes):
    cache = UpdateCache(max_bytes=max_bytes)
    for kind, arg in steps:
        if kind == "answer":
            ranks, after, upto = arg
            after, upto = min(after, upto), max(after, upto)
            answer = [u for u in LOG if after < u.offset <= upto]
            mine = [u for u in answer if addressed_rank(u) in (None, *ranks)]
            cache.add(sorted(ranks), after, mine, upto)
        elif kind == "resync":  # the current state at ``upto`` instead of the updates
            ranks, _, upto = arg
            current = [u for u in LOG if u.offset <= upto][-4:]
            cache.add(sorted(ranks), 0, current, upto, resync=True)
        elif kind == "trim":
            cache.trim_below(arg)
        else:
            cache.forget(arg)
        assert cache.nbytes <= max_bytes
        for rank in range(4):
            for after in range(41):
                served = cache.serve(rank, after)
                if served is not None and not served.resync:
                    assert served.next_after >= after
                    assert served.updates == truth(rank, after, served.next_after), (rank, after)


# -- the saver first ---------------------------------------------------------------------------


def shutdown(offset: int, checkpoint_rank: int | None) -> ShutdownUpdate:
    return ShutdownUpdate(
        offset=offset,
        group="g",
        reason="max_failure_exceeded",
        detail="",
        checkpoint_rank=checkpoint_rank,
    )


def test_a_shutdown_reaches_the_checkpoint_ranks_worker_before_the_others_of_its_host() -> None:
    cache = UpdateCache(shutdown_lead_s=2.0)
    cache.add([0, 1, 2], 0, [view(1, 1), shutdown(2, 1)], 2, now=100.0)
    # rank 2's poll gets what comes before the shutdown, and waits for the rest
    held = cache.serve(2, 0, now=100.5)
    assert held is not None and [u.offset for u in held.updates] == [1]
    assert held.next_after == 1
    assert cache.serve(2, 1, now=100.5) == Served((), 1)
    assert cache.held_until(now=100.5) == 102.0
    # the checkpoint rank is handed it; from then on the others get it too
    saver = cache.serve(1, 0, now=100.6)
    assert saver is not None and [u.offset for u in saver.updates] == [1, 2]
    assert cache.held_until(now=100.6) is None
    after = cache.serve(2, 1, now=100.7)
    assert after is not None and [u.offset for u in after.updates] == [2]


def test_a_checkpoint_rank_that_never_polls_holds_the_others_back_only_the_lead() -> None:
    cache = UpdateCache(shutdown_lead_s=2.0)
    cache.add([0, 1, 2], 0, [shutdown(1, 1)], 1, now=100.0)
    assert cache.serve(0, 0, now=101.9).updates == ()
    served = cache.serve(0, 0, now=102.0)
    assert served is not None and [u.offset for u in served.updates] == [1]


def test_twin_no_hold_for_a_checkpoint_rank_the_lane_does_not_carry_or_carries_alone() -> None:
    elsewhere = UpdateCache()
    elsewhere.add([0, 2], 0, [shutdown(1, 1)], 1, now=100.0)  # rank 1 lives on another host
    assert [u.offset for u in elsewhere.serve(2, 0, now=100.0).updates] == [1]
    alone = UpdateCache()
    alone.add([1], 0, [shutdown(1, 1)], 1, now=100.0)
    assert alone.held_until(now=100.0) is None
    assert [u.offset for u in alone.serve(1, 0, now=100.0).updates] == [1]
