"""Rank sets on the wire: the one encoding every set of ranks in the protocol uses.

A set of ranks is sent in whichever of two forms is shorter, so no set of a group of up to
65,536 ranks takes more than about 11 kB, and the sets that are common in practice (one rank,
a few ranks, every rank, every rank but a few) take a few bytes:

- a **list**, sorted and without overlaps, whose items are single ranks (``5``) or inclusive
  runs (``[8, 1023]``): ``[0, [2, 5], 9]`` is ``{0, 2, 3, 4, 5, 9}``;
- a **bitmap**, the string ``"b64:"`` followed by the base64 of the bitmap's bytes: bit ``r % 8``
  (least significant first) of byte ``r // 8`` is rank ``r``; trailing zero bytes are left out.

:func:`encode` picks the form; :func:`decode` accepts both and checks them against the group's
world size, with an error that says what is wrong.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from typing import Annotated, Any

from msgspec import Meta

PREFIX = "b64:"

#: byte value -> the positions of its set bits, least significant first
_BITS = tuple(tuple(b for b in range(8) if value >> b & 1) for value in range(256))

RankSet = list[Any] | str
#: A rank set as a field of a message (``wire.protocol``'s events, ``wire.updates``): a sorted
#: list of ranks and ``[first, last]`` runs, or a ``"b64:"`` bitmap. The longest, a bitmap of
#: 65,536 ranks, is 10,928 characters.
RankSetField = Annotated[
    list[int | Annotated[list[int], Meta(min_length=2, max_length=2)]]
    | Annotated[str, Meta(pattern=r"^b64:[A-Za-z0-9+/=]*$", max_length=10_932)],
    Meta(description="a rank set: sorted ranks and [first, last] runs, or a b64: bitmap"),
]


class RankSetError(ValueError):
    """A rank set that is malformed or names a rank outside the group."""


def encode(ranks: Iterable[int]) -> RankSet:
    """The shorter wire form of a set of ranks (non-negative ints)."""
    ordered = sorted(set(ranks))
    runs = _runs(ordered)
    if len(runs) <= 4 or not ordered:
        return runs
    bitmap = _bitmap(ordered)
    # a single rank costs at least 2 characters in the list form (digit and comma)
    if len(bitmap) < 2 * len(runs) or len(bitmap) < _list_len(runs):
        return bitmap
    return runs


def decode(value: Any, world_size: int, *, name: str = "ranks") -> tuple[int, ...]:
    """The ranks of a wire rank set, in increasing order.

    Raises :class:`RankSetError` naming ``name`` when the value is not a rank set, is not in
    increasing order, or names a rank outside ``0..world_size - 1``.
    """
    if isinstance(value, str):
        return _decode_bitmap(value, world_size, name)
    if not isinstance(value, list):
        raise RankSetError(f"{name} must be a list of ranks or a {PREFIX} bitmap, got {value!r}")
    out: list[int] = []
    last = -1
    for item in value:
        if type(item) is int:
            first = end = item
        elif (
            type(item) is list and len(item) == 2 and type(item[0]) is int and type(item[1]) is int
        ):
            first, end = item
            if end < first:
                raise RankSetError(f"{name}: run {item!r} ends before it starts")
        else:
            raise RankSetError(f"{name}: {item!r} is neither a rank nor a [first, last] run")
        if first < 0 or end >= world_size:
            raise RankSetError(f"{name} names {item!r}, not ranks in 0..{world_size - 1}")
        if first <= last:
            raise RankSetError(f"{name} must be in increasing order without repeats; {item!r}")
        if first == end:
            out.append(first)
        else:
            out.extend(range(first, end + 1))
        last = end
    return tuple(out)


def decode_set(value: Any, world_size: int, *, name: str = "ranks") -> frozenset[int]:
    return frozenset(decode(value, world_size, name=name))


def _runs(ordered: list[int]) -> list[Any]:
    out: list[Any] = []
    i, n = 0, len(ordered)
    while i < n:
        j = i
        while j + 1 < n and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(ordered[i] if i == j else [ordered[i], ordered[j]])
        i = j + 1
    return out


def _list_len(runs: list[Any]) -> int:
    """Length of the JSON of a runs list (as msgspec writes it: no spaces)."""
    total = 1 + max(len(runs) - 1, 0) + 1
    for item in runs:
        if type(item) is int:
            total += len(str(item))
        else:
            total += 3 + len(str(item[0])) + len(str(item[1]))
    return total


def _bitmap(ordered: list[int]) -> str:
    data = bytearray(ordered[-1] // 8 + 1)
    for r in ordered:
        data[r >> 3] |= 1 << (r & 7)
    return PREFIX + base64.b64encode(bytes(data)).decode("ascii")


def _decode_bitmap(value: str, world_size: int, name: str) -> tuple[int, ...]:
    if not value.startswith(PREFIX):
        raise RankSetError(f"{name}: a bitmap starts with {PREFIX!r}, got {value[:16]!r}")
    body = value[len(PREFIX) :]
    if len(body) > 4 * ((world_size + 7) // 8 + 2) // 3 + 4:
        raise RankSetError(f"{name}: bitmap of {len(body)} characters is longer than the group")
    try:
        data = base64.b64decode(body.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise RankSetError(f"{name}: bitmap is not valid base64 ({exc})") from None
    out: list[int] = []
    append = out.append
    for index, byte in enumerate(data):
        if byte:
            base = index << 3
            for bit in _BITS[byte]:
                append(base + bit)
    if out and out[-1] >= world_size:
        raise RankSetError(f"{name}: bitmap names rank {out[-1]}, not in 0..{world_size - 1}")
    return tuple(out)


#: The most ranks one long poll may name (``GET /agents/updates?ranks=``).
MAX_QUERY_RANKS = 1024
#: The most characters of a ``ranks=`` query.
MAX_QUERY_CHARS = 8 * MAX_QUERY_RANKS
_QUERY_CHARS = frozenset("0123456789,-")


def format_query(ranks: Iterable[int]) -> str:
    """The ``ranks=`` query form of a set of ranks: ``0-7,12``."""
    parts = []
    for item in _runs(sorted(set(ranks))):
        parts.append(str(item) if type(item) is int else f"{item[0]}-{item[1]}")
    return ",".join(parts)


def parse_query(text: str, world_size: int = 65_536) -> tuple[int, ...]:
    """The ranks of a ``ranks=`` query (:func:`format_query`), in increasing order; at most
    :data:`MAX_QUERY_RANKS`. Raises :class:`RankSetError` saying what is wrong."""
    if not text or not _QUERY_CHARS.issuperset(text) or len(text) > MAX_QUERY_CHARS:
        raise RankSetError(
            f"ranks must look like 0-7,12 (ASCII digits, ',' and '-'), got {text[:40]!r}"
        )
    out: list[int] = []
    for part in text.split(","):
        first, dash, last = part.partition("-")
        if not first or (dash and not last) or len(first) > 5 or len(last) > 5:
            raise RankSetError(f"ranks: {part!r} is neither a rank nor a first-last run")
        a = int(first)
        b = int(last) if dash else a
        if b < a or (out and a <= out[-1]):
            raise RankSetError(f"ranks must be in increasing order without repeats; {part!r}")
        if b >= world_size:
            raise RankSetError(f"ranks names {b}, not a rank in 0..{world_size - 1}")
        if len(out) + (b - a + 1) > MAX_QUERY_RANKS:
            raise RankSetError(f"ranks names more than {MAX_QUERY_RANKS} ranks")
        out.extend(range(a, b + 1))
    return tuple(out)
