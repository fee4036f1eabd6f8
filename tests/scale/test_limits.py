"""The protocol's bounds at the largest group it is stated for, 65,536 ranks: no report a
correct agent sends exceeds the log's payload limit, no update exceeds MAX_UPDATE_BYTES, and
what a rank receives when one rank changes does not grow with the group.

Checked at the limit itself, with the worst-case rank sets (alternating ranks, whose bitmap is
as long as the group's), through the real validation the host runs on every input."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foldplane.eventlog import NewRecord
from foldplane.eventlog.record import MAX_PAYLOAD_BYTES, validate
from foldplane.wire import ranks as rank_sets
from foldplane.wire.protocol import (
    MAX_UPDATE_BYTES,
    MAX_WORLD_SIZE,
    AgentEventsRequest,
    View,
    apply_prepare,
    apply_view_update,
    links_event,
    prepare_update,
    view_update,
)

N = MAX_WORLD_SIZE
EVERY_OTHER = range(0, N, 2)
THE_REST = range(1, N, 2)


def _size(value: object) -> int:
    return len(msgspec.json.encode(value))


def _view(version: int, active, *, states=None, acked=(), dropped=()) -> View:
    return View(
        group="big",
        version=version,
        active_ranks=tuple(sorted(active)),
        rank_states=states if states is not None else {r: "HEALTHY" for r in range(N)},
        healthy_set=tuple(sorted(active)),
        cause={"kind": "proposal", "proposals": [7], "detail": "a change of half the group"},
        acked_ranks=tuple(sorted(acked)),
        dropped_ranks=tuple(sorted(dropped)),
        offset=10 * version,
        ts=version,
    )


def test_the_largest_links_report_fits_the_payload_limit():
    # Every peer down and every peer in a failure hint, in the pattern with the longest
    # encoding: the report a correct agent can send at its worst.
    worst_down = [r for r in range(1, N) if r % 2]
    fields = links_event(worst_down, range(2, N, 2), False, 12)
    record = NewRecord(
        kind="links", group="big", rank=0, payload={"incarnation": "x" * 128, **fields}
    )
    size = len(validate(record))  # raises if over MAX_PAYLOAD_BYTES
    assert size < MAX_PAYLOAD_BYTES
    assert size < 24_000  # two bitmaps of 65,536 bits, not a list of 65,535 ranks
    # and the HTTP surface accepts it as a protocol-2 event
    event = {"type": "links", "group": "big", "rank": 0, "incarnation": "x" * 128, **fields}
    msgspec.json.decode(msgspec.json.encode({"events": [event]}), type=AgentEventsRequest)


def test_the_largest_shared_heartbeat_record_fits_the_payload_limit():
    for ranks in (range(N), EVERY_OTHER, THE_REST):
        record = NewRecord(
            kind="heartbeat", group="big", rank=None, payload={"ranks": rank_sets.encode(ranks)}
        )
        assert len(validate(record)) <= 11_000


@pytest.mark.parametrize("pattern", ["alternating", "halves"])
def test_the_largest_view_update_fits_max_update_bytes(pattern):
    if pattern == "alternating":
        old_active, new_active = EVERY_OTHER, THE_REST
    else:
        old_active, new_active = range(N // 2), range(N // 2, N)
    states_old = {r: "HEALTHY" if r % 2 else "SYNCED" for r in range(N)}
    states_new = {r: ("OFFLINE", "SYNCED", "HEALTHY")[r % 3] for r in range(N)}
    base = _view(4, old_active, states=states_old, acked=old_active, dropped=new_active)
    view = _view(5, new_active, states=states_new, acked=new_active, dropped=old_active)
    update = view_update(base, view)
    assert _size(update) <= MAX_UPDATE_BYTES
    assert apply_view_update(base, update, N) == view  # and it is exact
    prepare = prepare_update(
        group="big",
        version=5,
        base=base,
        active_ranks=new_active,
        participants=EVERY_OTHER,
        ack_deadline_ts=2**62,
        offset=99,
    )
    assert _size(prepare) <= MAX_UPDATE_BYTES
    prepared = apply_prepare(base, prepare, N)
    assert prepared.active_ranks == tuple(new_active)
    assert prepared.participants == tuple(EVERY_OTHER)


def test_one_rank_lost_costs_each_rank_the_same_at_64_and_at_65536_ranks():
    sizes = []
    for n in (64, N):
        everyone = range(n)
        base = View(
            group="big",
            version=1,
            active_ranks=tuple(everyone),
            rank_states={r: "HEALTHY" for r in everyone},
            healthy_set=tuple(everyone),
            cause={"kind": "formation", "proposals": [], "detail": "formed"},
            acked_ranks=tuple(everyone),
            dropped_ranks=(),
            offset=100,
            ts=1,
        )
        survivors = tuple(r for r in everyone if r != 5)
        view = msgspec.structs.replace(
            base,
            version=2,
            active_ranks=survivors,
            rank_states={**base.rank_states, 5: "OFFLINE"},
            healthy_set=survivors,
            acked_ranks=survivors,
            cause={"kind": "auto_deactivation", "proposals": [], "detail": "rank 5 left"},
            offset=200,
        )
        prepare = prepare_update(
            group="big",
            version=2,
            base=base,
            active_ranks=survivors,
            participants=survivors,
            ack_deadline_ts=2**62,
            offset=150,
        )
        update = view_update(base, view)
        assert apply_view_update(base, update, n) == view
        sizes.append(_size(prepare) + _size(update))
    assert sizes[0] == sizes[1]  # constant in the group's size
    assert sizes[1] < 600


@settings(max_examples=60, deadline=None)
@given(st.sets(st.integers(0, N - 1), max_size=300), st.booleans())
def test_any_rank_set_round_trips_and_is_never_longer_than_a_bitmap(ranks, complement):
    chosen = set(range(N)) - ranks if complement else ranks
    encoded = rank_sets.encode(chosen)
    assert rank_sets.decode(msgspec.json.decode(msgspec.json.encode(encoded)), N) == tuple(
        sorted(chosen)
    )
    assert _size(encoded) <= 10_930
