"""A rank's part of an epoch on the wire, and how a ``data_moves`` update applies to it
(docs/data.md, docs/protocol.md "Facet updates").

A part is a cursor (``base``: positions of the rank's sequence the coordinator accepted as
processed) and what the rank holds from there on (``remaining``: ``(start, length)`` segments
of the epoch's permutation, in reading order). The coordinator sends a rank its whole part at
the epoch's plan and in a resync (``data_assignment``); every later decision reaches every rank
once, as the group's ``data_moves`` update, which says only what moved:

- ``moves``: ``[from_rank, to_rank, start, length]`` in the order they apply. What a rank gave
  is the end of its remaining work (in order), what it got is appended to it (in order);
- ``reported``: the ranks whose sequence, once what they gave is gone and before what they
  got is appended, is all reported processed (a rank that left the view, one that took work
  with none left): their ``base`` moves to its end. A reader that never heard its rank's
  progress (a new process reading the history) learns its cursor so.

So a reader that applied every decision in order holds exactly the coordinator's part; one
that missed some is told its whole part again (a resync). :func:`apply_moves` refuses moves
that do not fit the part it is given (:class:`PartMismatch`) instead of guessing.

This module is pure: no I/O, clock, threads or randomness.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Segment = tuple[int, int]


class PartMismatch(ValueError):
    """A ``data_moves`` update does not fit the part it was applied to."""


def normalized(segments: Iterable[Segment]) -> list[Segment]:
    """``segments`` without empty ones, adjacent ones merged (the order is kept)."""
    out: list[Segment] = []
    for start, n in segments:
        if n <= 0:
            continue
        if out and out[-1][0] + out[-1][1] == start:
            out[-1] = (out[-1][0], out[-1][1] + n)
        else:
            out.append((start, n))
    return out


def split_at(segments: Sequence[Segment], count: int) -> tuple[list[Segment], list[Segment]]:
    """The first ``count`` positions of ``segments`` and the rest, both as segments."""
    head: list[Segment] = []
    tail: list[Segment] = []
    left = count
    for start, n in segments:
        if left >= n:
            head.append((start, n))
            left -= n
        elif left > 0:
            head.append((start, left))
            tail.append((start + left, n - left))
            left = 0
        else:
            tail.append((start, n))
    return head, tail


def apply_moves(
    rank: int, base: int, remaining: Sequence[Segment], update: Mapping[str, Any]
) -> tuple[int, list[Segment]]:
    """``rank``'s part (``base``, ``remaining``) after the decision ``update`` (a
    ``data_moves``) describes: the new ``(base, remaining)``. Raises :class:`PartMismatch`
    when what the update says ``rank`` gave is not the end of ``remaining``."""
    gave: list[Segment] = []
    got: list[Segment] = []
    for from_rank, to_rank, start, length in update["moves"]:
        if int(from_rank) == rank:
            gave.append((int(start), int(length)))
        if int(to_rank) == rank:
            got.append((int(start), int(length)))
    held = sum(n for _, n in remaining)
    keep = list(remaining)
    if gave:
        total = sum(n for _, n in gave)
        if total > held:
            raise PartMismatch(
                f"rank {rank} gave {total} positions at assignment {update['assignment']} but "
                f"holds {held}"
            )
        keep, tail = split_at(remaining, held - total)
        if normalized(tail) != normalized(gave):
            raise PartMismatch(
                f"rank {rank} gave {normalized(gave)[:3]} at assignment {update['assignment']}, "
                f"which is not the end of its part ({normalized(tail)[:3]})"
            )
    if rank in update.get("reported", ()):
        base += sum(n for _, n in keep)
        keep = []
    return base, normalized([*keep, *got])
