"""The agent events' payloads go to the fold without a decode round trip
(``Host.submit_many(normalized=True)``): that is only sound if what the route builds equals
what a reader of the log decodes from the stored bytes, for every kind of event."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from api.models import AgentEvent
from api.routes.agents import payload_of
from eventlog.record import decode_payload, encode_payload

ranks = st.integers(0, 65_535)
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
        {
            "type": st.just("links"),
            **common,
            "peers": st.dictionaries(ranks.map(str), st.sampled_from(["up", "down"]), max_size=20),
            "self_ready": st.booleans(),
        },
        optional={
            "failed_ranks_hint": st.none() | st.lists(ranks, max_size=10),
            "version": st.integers(0, 2**40),
        },
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
