"""The agent events as an open set (wire/protocol.py): the protocol's own, and those a facet
declares, read by an ``EventReader`` that names them: one batch decode and one loose path."""

from __future__ import annotations

from typing import Annotated

import msgspec
import pytest
from msgspec import Meta

from foldplane.wire.protocol import (
    EVENT_KINDS,
    EVENT_TYPES,
    PROTOCOL_READER,
    AgentEventBase,
    EventReader,
    JoinEvent,
    decode_events,
    event_type_of,
)


class Poke(AgentEventBase, tag="wire_test_poke", kw_only=True, forbid_unknown_fields=True):
    times: Annotated[int, Meta(ge=1, le=9)]


def _batch(*events: dict) -> bytes:
    return msgspec.json.encode({"events": list(events)})


ENVELOPE = {"group": "g", "rank": 1, "incarnation": "i-1"}


def test_an_undeclared_type_is_not_read_and_names_the_known_ones() -> None:
    assert "wire_test_unknown" not in EVENT_TYPES
    with pytest.raises(msgspec.ValidationError):
        decode_events(_batch({"type": "wire_test_unknown", **ENVELOPE}))
    with pytest.raises(msgspec.ValidationError, match="wire_test_unknown.*'join'"):
        event_type_of({"type": "wire_test_unknown", **ENVELOPE})
    with pytest.raises(msgspec.ValidationError, match="None"):
        event_type_of({**ENVELOPE})


def test_a_declared_type_is_read_beside_the_protocol_s_own() -> None:
    reader = PROTOCOL_READER.with_types(Poke, Poke)  # twice: the same Struct, one type
    assert reader.types["wire_test_poke"] is Poke and reader.kinds[Poke] == "wire_test_poke"
    events = reader.decode_events(
        _batch({"type": "join", **ENVELOPE}, {"type": "wire_test_poke", "times": 3, **ENVELOPE})
    )
    assert [type(e) for e in events] == [JoinEvent, Poke] and events[1].times == 3
    # its own bounds hold: the batch fails, the loose path names the field
    with pytest.raises(msgspec.ValidationError):
        reader.decode_events(_batch({"type": "wire_test_poke", "times": 10, **ENVELOPE}))
    raw = {"type": "wire_test_poke", "times": 10, **ENVELOPE}
    with pytest.raises(msgspec.ValidationError, match=r"\$.times"):
        msgspec.convert(raw, reader.event_type_of(raw))
    # the protocol's own reader, and the module's tables, are as they were
    assert "wire_test_poke" not in EVENT_TYPES and Poke not in EVENT_KINDS
    with pytest.raises(msgspec.ValidationError):
        decode_events(_batch({"type": "wire_test_poke", "times": 3, **ENVELOPE}))


def test_a_type_is_declared_once_and_only_for_an_agent_event() -> None:
    class Other(AgentEventBase, tag="join", kw_only=True):
        pass

    with pytest.raises(ValueError, match="'join' of Other is declared already"):
        PROTOCOL_READER.with_types(Other)
    with pytest.raises(ValueError, match="not an agent event"):
        EventReader([dict])  # type: ignore[list-item]
    assert EVENT_TYPES["join"] is JoinEvent
