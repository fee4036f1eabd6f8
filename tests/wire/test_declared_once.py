"""Each record kind's shape is declared once, by its input Struct (``wire/inputs.py``, a facet's
``inputs.py``): the event an agent emits and the API decodes, and an operator's request body,
are made from it (``wire.protocol.agent_event``, ``request_body``), never written out again as
a second list of fields."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import Annotated

import msgspec
import pytest
from msgspec import Meta

from foldplane.coordinator.fold.config import GroupConfig
from foldplane.wire import facets, inputs, protocol
from foldplane.wire.protocol import AgentEventBase, agent_event

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = [
    p
    for p in ROOT.rglob("*.py")
    if not {"tests", "docs", ".venv", ".venv-2.13", "build"} & set(p.relative_to(ROOT).parts)
]
ENVELOPE = set(AgentEventBase.__struct_fields__)


def _events() -> list[type[AgentEventBase]]:
    declared = [e for m in facets.protocols() for e in getattr(m, "EVENTS", ())]
    return [*protocol.PROTOCOL_EVENTS, *declared]


#: The request bodies made from an input: (module, name).
BODIES = [
    ("foldplane.api.models", "CreateGroupRequest"),  # from the config group_created carries
    ("foldplane.api.models", "ProposalRequest"),
    ("foldplane.api.models", "DeathReport"),
    ("foldplane.api.models", "EndGroupRequest"),
    ("foldplane.facets.epochs.models", "EpochPlanRequest"),
    ("foldplane.facets.refits.models", "RefitRequest"),
    ("foldplane.facets.refits.models", "TransferRequest"),
    ("foldplane.facets.refits.models", "RefitRestartRequest"),
    ("foldplane.facets.rendezvous.models", "JoinRequest"),
    ("foldplane.facets.rendezvous.models", "NodeRequest"),
    ("foldplane.facets.rendezvous.models", "LeaveRequest"),
    ("foldplane.facets.lighthouse.models", "HeartbeatCall"),
    ("foldplane.facets.lighthouse.models", "LostRequest"),
]
#: The modules that declare request bodies, where no class may write out an input's fields.
BODY_MODULES = [ROOT / "api" / "models.py", *sorted(ROOT.glob("facets/*/models.py"))]


def _all_inputs() -> list[type[msgspec.Struct]]:
    names = ["foldplane.wire.inputs"] + [
        f"foldplane.facets.{p.parent.name}.inputs" for p in sorted(ROOT.glob("facets/*/inputs.py"))
    ]
    return [c for n in names for c in importlib.import_module(n).INPUTS.values()]


def _carried(source: type[msgspec.Struct], leave_out: set[str] = set()) -> list[str]:  # noqa: B006
    """The fields of an input the wire carries, in order."""
    return [f[0] for f in inputs.wire_fields(source, leave_out)]


def _inputs_of(event: type[AgentEventBase]) -> dict[str, type[msgspec.Struct]]:
    """The input Structs of the module that declares the event's input, by kind."""
    module = __import__(event.input.__module__, fromlist=["INPUTS"])  # type: ignore[attr-defined]
    return module.INPUTS


@pytest.mark.parametrize("event", _events(), ids=lambda e: e.__struct_config__.tag)
def test_an_agent_event_is_made_from_the_input_of_its_kind(event: type[AgentEventBase]) -> None:
    kind = event.__struct_config__.tag
    source = event.input  # type: ignore[attr-defined]
    assert _inputs_of(event)[kind] is source, f"{kind}: the event's input is not its kind's"
    own = [f for f in event.__struct_fields__ if f not in AgentEventBase.__struct_fields__]
    assert own == _carried(source, ENVELOPE), f"{kind}: the event's fields are not its input's"
    assert "incarnation" in source.__struct_fields__, f"{kind}: the record keeps the incarnation"


@pytest.mark.parametrize("where", BODIES, ids=lambda w: w[1])
def test_a_request_body_is_made_from_the_input_of_its_record(where: tuple[str, str]) -> None:
    body = getattr(importlib.import_module(where[0]), where[1])
    source = body.input
    assert source in _all_inputs() or source is GroupConfig
    envelope = set(body.__mro__[1].__struct_fields__)
    own = [f for f in body.__struct_fields__ if f not in envelope]
    carried = _carried(source, envelope | set(body.left_out))
    assert own == carried, f"{where[1]}: its fields are not its input's"


def test_no_request_body_writes_out_an_input_s_fields() -> None:
    """A request class of a bodies' module that declares every field an input carries (two or more,
    but the envelope's and a rendezvous job, which its route's path names) repeats the input:
    make it with ``request_body(TheInput, ...)``."""
    carried = {c: set(_carried(c, ENVELOPE | {"job"})) for c in _all_inputs()}
    written = []
    for path in BODY_MODULES:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ClassDef) or not node.name.endswith("Request"):
                continue  # an answer may well show what an input recorded
            fields = {
                t.target.id
                for t in node.body
                if isinstance(t, ast.AnnAssign) and isinstance(t.target, ast.Name)
            }
            written += [
                f"{path.relative_to(ROOT)} {node.name} ~ {c.__name__}"
                for c, names in carried.items()
                if len(names) >= 2 and names <= fields
            ]
    assert written == []


def test_no_agent_event_is_written_out_as_a_class() -> None:
    """A ``class ...(AgentEventBase)`` in the product would declare a kind's fields a second
    time: an event is ``agent_event(TheInput)``. (The envelope itself is the one class.)"""
    written = []
    for path in PRODUCT:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and any(
                getattr(b, "id", getattr(b, "attr", None)) == "AgentEventBase" for b in node.bases
            ):
                written.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert written == []


def test_a_field_the_log_may_lack_is_left_out_of_the_record_null_or_absent() -> None:
    """``host`` is UNSET in the input (absent: the fold keeps what it knew) and optional on
    the wire, where null and absent both leave it out of the payload, as the log has it."""
    for body in ({"host": None}, {}):
        event = msgspec.convert(
            {"type": "join", "group": "g", "rank": 0, "incarnation": "i", **body},
            protocol.JoinEvent,
        )
        assert protocol.event_payload(event) == {"incarnation": "i"}
        assert inputs.decode("join", protocol.event_payload(event)).host is msgspec.UNSET
    # the wire's bound is the wire's; the log's payload keeps its own type and problem check
    with pytest.raises(msgspec.ValidationError, match=r"\$.host"):
        msgspec.convert(
            {"type": "join", "group": "g", "rank": 0, "incarnation": "i", "host": "h" * 257},
            protocol.JoinEvent,
        )
    assert inputs.problem("join", {"incarnation": "i", "host": "h" * 257}, 4) is None


def test_a_field_no_agent_sends_is_not_on_the_wire() -> None:
    assert "ranks" in inputs.HeartbeatInput.__struct_fields__
    assert "ranks" not in protocol.HeartbeatEvent.__struct_fields__
    assert "peers" not in protocol.LinksEvent.__struct_fields__


class PokeInput(msgspec.Struct, frozen=True, kw_only=True):
    """An input whose ``epoch`` the log may lack (an operator's) but an agent must send."""

    kind = "wire_test_poke"
    incarnation: str | None = None
    epoch: Annotated[int | None, inputs.OnWire(Annotated[int, Meta(ge=1)], required=True)] = None
    note: str = ""


def test_an_input_s_field_the_wire_requires_and_a_default_kept() -> None:
    event = agent_event(PokeInput)
    assert event.__name__ == "PokeEvent" and event.__struct_config__.tag == "wire_test_poke"
    assert event.input is PokeInput  # type: ignore[attr-defined]
    envelope = {"group": "g", "rank": 0, "incarnation": "i", "type": "wire_test_poke"}
    with pytest.raises(msgspec.ValidationError, match="missing required field `epoch`"):
        msgspec.convert(envelope, event)
    with pytest.raises(msgspec.ValidationError, match=r">= 1 - at `\$.epoch`"):
        msgspec.convert({**envelope, "epoch": 0}, event)
    poke = msgspec.convert({**envelope, "epoch": 2}, event)
    assert protocol.event_payload(poke) == {"incarnation": "i", "epoch": 2}  # "" is left out
