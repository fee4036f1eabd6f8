"""The message reference of docs/protocol.md, written from the glossary's own types.

``render(page)`` replaces each generated block of the page (between ``<!-- generated: NAME -->``
and ``<!-- end generated -->``) with what the types say now: the events an agent sends (their
``type`` and fields, from the Structs of ``wire.protocol``) and every code with its status and
meaning (``wire.codes``). ``tests/test_docs.py`` fails when the page and the types differ;
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

from foldplane.wire import codes, protocol

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
    """The annotation ``field`` is declared with, as written (without ``| None``)."""
    for klass in cls.__mro__:
        written = getattr(klass, "__annotations__", {}).get(field)
        if written is not None:
            return str(written).removesuffix(" | None")
    raise KeyError(field)  # pragma: no cover


def _describe(hint: Any, written: str) -> str:
    if written in _ALIASES:
        return _ALIASES[written]
    info = inspect.type_info(hint)
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
    """One row per event type: its ``type``, required fields, then optional ones."""
    rows = ["| `type` | fields | optional fields |", "|---|---|---|"]
    for cls, kind in protocol.EVENT_KINDS.items():
        hints = typing.get_type_hints(cls, include_extras=True)
        required, optional = [], []
        for field in inspect.type_info(cls).fields:  # type: ignore[attr-defined]
            hint, _ = _optional(hints[field.name])
            text = f"`{field.name}`: {_describe(hint, _declared(cls, field.name))}"
            (required if field.required else optional).append(text)
        rows.append(f"| `{kind}` | {'; '.join(required)} | {'; '.join(optional) or '-'} |")
    return "\n".join(rows) + "\n"


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


_BLOCKS = {"events": events_reference, "codes": codes_reference}


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
