"""The message reference of docs/protocol.md, written from the glossary's own types.

``render(page)`` replaces each generated block of the page (between ``<!-- generated: NAME -->``
and ``<!-- end generated -->``) with what the types say now: the events an agent sends (their
``type`` and fields, from the Structs of ``wire.protocol``), the updates it receives (from the
Structs of ``wire.updates``: their ``type``, who receives each, its fields and its docstring),
each followed by those the facets of foldplane declare in their folders (``wire.facets``),
and every code with its status and meaning (``wire.codes``). ``tests/test_docs.py`` fails when the page and the types differ;
``python -m wire.reference docs/protocol.md`` writes the page again.

This module is pure: ``render`` takes and returns text.
"""

from __future__ import annotations

import re
import sys
import types
import typing
from typing import Any

from msgspec import inspect

from . import codes, facets, inputs, protocol, ranks, updates

#: The names the reference gives the protocol's field types, by the name a field is declared
#: with in ``wire.protocol`` (a type written out in place is described by its bounds).
_ALIASES = {
    "EventGroupName": "group name",
    "Rank": "rank",
    "Incarnation": "incarnation (1-128 characters)",
    "Version": "view version",
    "ShortText": "text (at most 256 characters)",
    "RankSetField": "rank set",
    "RefitName": "refit name",
    "Digest": "plan digest (sha256, hex)",
    "RefitEpoch": "refit epoch",
    "TransferKey": "transfer key",
    "FlatBootstrap": "bootstrap (a flat object)",
}

_BEGIN = re.compile(r"<!-- generated: (?P<name>[a-z]+) -->\n.*?<!-- end generated -->", re.S)


def _optional(hint: Any) -> tuple[Any, bool]:
    """``(the type without None, whether None was allowed)``."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) < len(typing.get_args(hint)):
            return (args[0] if len(args) == 1 else hint), True
    return hint, False


def _declared(cls: type, field: str) -> str:
    """The annotation ``field`` is declared with, as written (without ``| None``); for an event
    made from its input (``protocol.agent_event``), the name its type has where it is declared."""
    for klass in cls.__mro__:
        written = getattr(klass, "__annotations__", {}).get(field)
        if isinstance(written, str):
            return written.removesuffix(" | None")
        if written is not None:
            hint, _ = _optional(written)
            return _named_types().get(id(hint), str(hint))
    raise KeyError(field)  # pragma: no cover


def _named_types() -> dict[int, str]:
    """The types of :data:`_ALIASES` by identity, where the protocol's modules declare them.
    Equal ``Annotated`` types are one object (``typing`` caches them), so a named type whose
    bounds a field's own type may share carries a description that tells them apart
    (``Version``, ``RefitEpoch``; a refit's ``slot`` from a ``Rank``)."""
    declared = [e for m in facets.protocols() for e in getattr(m, "EVENTS", ())]
    made_from = [sys.modules[e.input.__module__] for e in declared if hasattr(e, "input")]
    modules = (protocol, inputs, ranks, *facets.protocols(), *made_from)
    return {id(getattr(m, name)): name for m in modules for name in _ALIASES if hasattr(m, name)}


def _describe(hint: Any, written: str) -> str:
    if written in _ALIASES:
        return _ALIASES[written]
    info = _bare(inspect.type_info(hint))  # a description is the schema's, not the page's
    if isinstance(info, inspect.IntType):
        low, high = info.ge, info.le
        if low is None:
            return "integer"
        return f"integer >= {low}" if high is None else f"integer {low}..{high}"
    if isinstance(info, inspect.FloatType):
        return "number" if info.ge is None else f"number >= {info.ge:g}"
    if isinstance(info, inspect.BoolType):
        return "boolean"
    if isinstance(info, inspect.StrType):
        if info.pattern and re.fullmatch(r"\^\(([a-z_|]+)\)\$", info.pattern):
            return " or ".join(f"`{v}`" for v in info.pattern[2:-2].split("|"))
        return "text" if info.max_length is None else f"text (at most {info.max_length})"
    return type(info).__name__  # pragma: no cover - a new field type names itself


def events_reference() -> str:
    """One row per event type of the protocol: its ``type``, required fields, then optional
    ones (a deployment's facet documents its own)."""
    rows = ["| `type` | fields | optional fields |", "|---|---|---|"]
    declared = (e for m in facets.protocols() for e in getattr(m, "EVENTS", ()))
    for cls in (*protocol.PROTOCOL_EVENTS, *declared):
        kind = cls.__struct_config__.tag
        hints = typing.get_type_hints(cls, include_extras=True)
        required, optional = [], []
        for field in inspect.type_info(cls).fields:  # type: ignore[attr-defined]
            hint, _ = _optional(hints[field.name])
            text = f"`{field.name}`: {_describe(hint, _declared(cls, field.name))}"
            (required if field.required else optional).append(text)
        rows.append(f"| `{kind}` | {'; '.join(required)} | {'; '.join(optional) or '-'} |")
    return "\n".join(rows) + "\n"


def _shape(info: Any) -> str:
    """What a field of an update holds, from its type (the updates are read, not validated,
    so their fields are described by shape, not by bounds)."""
    if isinstance(info, inspect.Metadata):
        return _shape(info.type)
    if isinstance(info, inspect.UnionType):
        kinds = [_bare(t) for t in info.types if not isinstance(t, inspect.NoneType)]
        if any(
            isinstance(t, inspect.StrType) and (t.pattern or "").startswith("^b64") for t in kinds
        ):
            return "rank set"  # ``wire.ranks.RankSetField``: a list of ranks and runs, or a bitmap
        return " or ".join(_shape(t) for t in kinds)
    if isinstance(info, inspect.StructType):  # RankSetDelta: "rank set delta (`add`, `remove`)"
        words = re.sub(r"(?<!^)(?=[A-Z])", " ", info.cls.__name__).lower()
        return f"{words} ({', '.join(f'`{f.name}`' for f in info.fields)})"
    if isinstance(info, inspect.VarTupleType | inspect.ListType):
        return f"list of {_shape(info.item_type)}"
    if isinstance(info, inspect.TupleType):
        return f"[{', '.join(_shape(t) for t in info.item_types)}]"
    if isinstance(info, inspect.DictType):
        return f"object of {_shape(info.value_type)}"
    if isinstance(info, inspect.AnyType):
        return "any"
    simple = {
        inspect.IntType: "integer",
        inspect.StrType: "text",
        inspect.BoolType: "boolean",
        inspect.FloatType: "number",
    }
    return simple.get(type(info), type(info).__name__)


def _bare(info: Any) -> Any:
    """A type's info without its constraints."""
    return _bare(info.type) if isinstance(info, inspect.Metadata) else info


def _meaning(cls: type) -> str:
    """A class's docstring on one line, in Markdown."""
    return " ".join((cls.__doc__ or "").split()).replace("``", "`").replace("|", "\\|")


def updates_reference() -> str:
    """One row per update (``wire.updates``): its ``type``, who receives it, its fields (every
    update also has ``offset``), the optional ones (absent when null) and what it says."""
    rows = [
        "| `type` | to | fields | optional fields | meaning |",
        "|---|---|---|---|---|",
    ]
    declared = (u for m in facets.protocols() for u in getattr(m, "UPDATES", ()))
    for cls in (*updates.AgentUpdate.__args__, *declared):
        kind = cls.__struct_config__.tag
        required, optional = [], []
        for field in inspect.type_info(cls).fields:  # type: ignore[attr-defined]
            if field.name == "offset":
                continue
            hint, nullable = _optional_info(field.type)
            text = f"`{field.name}`: {_shape(hint)}" + (" or null" if nullable else "")
            (required if field.required else optional).append(text)
        rows.append(
            f"| `{kind}` | {cls.audience} | {'; '.join(required)} | "
            f"{'; '.join(optional) or '-'} | {_meaning(cls)} |"
        )
    return "\n".join(rows) + "\n"


def _optional_info(info: Any) -> tuple[Any, bool]:
    """``(the type info without None, whether None was allowed)``."""
    if isinstance(info, inspect.UnionType):
        kinds = [t for t in info.types if not isinstance(t, inspect.NoneType)]
        if len(kinds) < len(info.types):
            return (kinds[0] if len(kinds) == 1 else inspect.UnionType(types=tuple(kinds))), True
    return info, False


_FAMILIES = {
    "refusal": "refused by the fold or the host (one event's result, or a request's answer)",
    "request": "the request itself",
    "host": "this coordinator cannot serve now (a client tries another address)",
    "agent": "what an agent answers its own caller (never sent over HTTP)",
    "proposal": "a proposal's status (the status is that of the answer carrying it)",
}


def codes_reference() -> str:
    """Every code of ``wire.codes``, by family: its status and what it means."""
    rows = ["| code | status | meaning |", "|---|---|---|"]
    for family, what in _FAMILIES.items():
        rows.append(f"| **{family}** | | {what} |")
        for code in codes.CODES.values():
            if code.family == family:
                rows.append(f"| `{code.name}` | {code.status} | {code.meaning} |")
    return "\n".join(rows) + "\n"


_BLOCKS = {
    "events": events_reference,
    "updates": updates_reference,
    "codes": codes_reference,
}


def render(page: str) -> str:
    """``page`` with each generated block written again from the types."""

    def block(match: re.Match[str]) -> str:
        name = match["name"]
        return f"<!-- generated: {name} -->\n{_BLOCKS[name]()}<!-- end generated -->"

    return _BEGIN.sub(block, page)


#: The command that writes the page again.
REGENERATE = "python -m wire.reference docs/protocol.md"

if __name__ == "__main__":  # pragma: no cover - the command above
    from pathlib import Path

    page = Path(sys.argv[1])
    page.write_text(render(page.read_text()))
