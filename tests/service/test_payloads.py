"""The agent events' payloads go to the fold without a decode round trip
(``Host.submit_many(normalized=True)``): that is only sound if what the route builds equals
what a reader of the log decodes from the stored bytes, for every kind of event."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from foldplane.api.models import AgentEvent
from foldplane.eventlog.record import decode_payload, encode_payload
from foldplane.wire import ranks as wire_ranks
from foldplane.wire.protocol import event_payload as payload_of

ranks = st.integers(0, 65_535)
versions = st.integers(0, 2**40)
#: rank sets in both wire forms: runs (a few ranks or runs) and b64 bitmaps (many scattered)
rank_sets = st.one_of(
    st.lists(ranks, max_size=10),
    st.lists(st.integers(0, 300), min_size=40, max_size=120),
    st.builds(lambda a, n: range(a, a + n), st.integers(0, 60_000), st.integers(1, 5000)),
).map(wire_ranks.encode)
common = {
    "group": st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,20}\Z"),
    "rank": ranks,
    "incarnation": st.text(min_size=1, max_size=40),
    "token": st.none() | st.text(max_size=20),
}
events = st.one_of(
    st.fixed_dictionaries(
        {"type": st.just("join"), **common},
        optional={"host": st.none() | st.text(max_size=30), "pid": st.integers(0, 2**31)},
    ),
    st.fixed_dictionaries(
        {"type": st.just("heartbeat"), **common}, optional={"version": st.integers(0, 2**40)}
    ),
    st.fixed_dictionaries(
        {"type": st.just("links"), **common, "self_ready": st.booleans()},
        optional={"down": rank_sets, "hint": rank_sets, "version": versions, "reached": versions},
    ),
    st.fixed_dictionaries({"type": st.just("ack"), **common, "version": st.integers(0, 2**40)}),
    st.fixed_dictionaries({"type": st.just("exit"), **common}),
)


@settings(max_examples=300, deadline=None)
@given(events)
def test_a_payload_equals_what_the_log_gives_back(raw):
    event = msgspec.convert(raw, AgentEvent)
    payload = payload_of(event)
    stored = decode_payload(encode_payload(payload))
    assert payload == stored
    assert {type(v) for v in payload.values()} <= {str, int, bool, dict, list, type(None)}
    assert "type" not in payload and "group" not in payload and "rank" not in payload
    assert "token" not in payload
    assert "peers" not in payload and "failed_ranks_hint" not in payload


def test_the_rank_sets_drawn_take_both_wire_forms():
    """The strategy above is only a test of both forms if it draws both."""
    assert isinstance(wire_ranks.encode(range(0, 300, 3)), str)
    assert wire_ranks.encode(range(4, 5000)) == [[4, 4999]]
