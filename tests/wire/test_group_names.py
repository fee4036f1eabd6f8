"""An agent event's group name is matched against the pattern once per name
(``wire.protocol.group_problem``), not by the decoder for every event: it must accept and refuse
exactly what decoding a ``GroupName`` does, word its refusal the same way, and stay so once a
name is remembered."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from foldplane.api.routes.agents import _decode_events
from foldplane.wire import protocol
from foldplane.wire.protocol import PROTOCOL_READER, GroupName, HeartbeatEvent, group_problem


class _Named(msgspec.Struct):
    group: GroupName


_strict = msgspec.json.Decoder(_Named)

NAMES = [
    "g",
    "scale",
    "job-7.a_b",
    "a" * 64,
    "a" * 65,
    "",
    ".hidden",
    "-x",
    "../etc",
    "has space",
    "\u0663\u0664",  # Arabic-Indic digits: str.isdigit, not [0-9]
    "caf\u00e9",
    "trailing\n",  # the pattern's $ admits one final newline, in msgspec as in re
    "two\n\n",
]


def _decoder_says(name: str) -> str | None:
    try:
        _strict.decode(msgspec.json.encode({"group": name}))
    except msgspec.ValidationError as exc:
        return str(exc)
    return None


@given(st.one_of(st.sampled_from(NAMES), st.text(max_size=70)))
def test_the_check_agrees_with_the_decoder(name):
    expected = _decoder_says(name)
    assert group_problem(name) == expected
    assert group_problem(name) == expected  # again, now that a good name is remembered


def test_a_batch_refuses_exactly_the_events_with_a_bad_group():
    events = [{"type": "heartbeat", "group": name, "rank": 0, "incarnation": "x"} for name in NAMES]
    for body in (
        msgspec.json.encode({"events": events}),  # every event well typed: the one typed decode
        msgspec.json.encode({"events": [*events, {"type": "heartbeat"}]}),  # event by event
    ):
        decoded = _decode_events(PROTOCOL_READER, body)
        for name, got in zip(NAMES, decoded, strict=False):
            expected = _decoder_says(name)
            if expected is None:
                assert isinstance(got, HeartbeatEvent) and got.group == name
            else:
                assert got == expected


def test_the_remembered_names_are_bounded():
    for k in range(protocol._GOOD_GROUPS_MAX + 10):
        assert group_problem(f"n{k}") is None
    assert len(protocol._GOOD_GROUPS) <= protocol._GOOD_GROUPS_MAX
    assert group_problem("bad name") is not None
