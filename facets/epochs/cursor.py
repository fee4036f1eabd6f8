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

from collections.abc import Iterable, Sequence

from .protocol import DataMovesUpdate

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
    rank: int, base: int, remaining: Sequence[Segment], update: DataMovesUpdate
) -> tuple[int, list[Segment]]:
    """``rank``'s part (``base``, ``remaining``) after the decision ``update`` (a
    ``data_moves``) describes: the new ``(base, remaining)``. Raises :class:`PartMismatch`
    when what the update says ``rank`` gave is not the end of ``remaining``."""
    gave: list[Segment] = []
    got: list[Segment] = []
    for from_rank, to_rank, start, length in update.moves:
        if from_rank == rank:
            gave.append((start, length))
        if to_rank == rank:
            got.append((start, length))
    held = sum(n for _, n in remaining)
    keep = list(remaining)
    if gave:
        total = sum(n for _, n in gave)
        if total > held:
            raise PartMismatch(
                f"rank {rank} gave {total} positions at assignment {update.assignment} but "
                f"holds {held}"
            )
        keep, tail = split_at(remaining, held - total)
        if normalized(tail) != normalized(gave):
            raise PartMismatch(
                f"rank {rank} gave {normalized(gave)[:3]} at assignment {update.assignment}, "
                f"which is not the end of its part ({normalized(tail)[:3]})"
            )
    if rank in update.reported:
        base += sum(n for _, n in keep)
        keep = []
    return base, normalized([*keep, *got])


def same_until(
    old_base: int,
    old_remaining: Sequence[Segment],
    new_base: int,
    new_remaining: Sequence[Segment],
    limit: int,
) -> int:
    """The first index of the rank's sequence, below ``limit``, at which two parts of it
    (``base`` and ``remaining`` each) hold different positions, or ``limit`` when they agree up
    to it. Below the larger base both count as processed, which the coordinator never moves:
    they agree there."""
    index = max(old_base, new_base)
    if index >= limit:
        return limit
    old = split_at(old_remaining, index - old_base)[1]
    new = split_at(new_remaining, index - new_base)[1]
    i = j = 0
    o_at = n_at = 0  # offsets into old[i] and new[j]
    while index < limit and i < len(old) and j < len(new):
        o_start, o_len = old[i]
        n_start, n_len = new[j]
        if o_start + o_at != n_start + n_at:
            return index
        step = min(o_len - o_at, n_len - n_at, limit - index)
        index += step
        o_at += step
        n_at += step
        if o_at == o_len:
            i, o_at = i + 1, 0
        if n_at == n_len:
            j, n_at = j + 1, 0
    return min(index, limit)


class ReadCursor:
    """Where a reader stands in its rank's sequence of one epoch, and what its count means.

    A reader *yields* positions of its sequence in order (``yielded``: the index of the next
    one) and its training loop *marks* them processed later, in the same order
    (``processed``: the index after the last one marked, what it reports). Between the two the
    part may change under it: a deactivation takes everything not reported, a resync or a new
    incarnation's part replaces it. Positions it yielded that are no longer at the same index
    of its sequence are *void* (:meth:`cut`): their marks, when they come, count nothing, and
    the reader yields from the first changed index again. So ``processed`` always counts
    positions of the part as it is now, a report of it is bound to the part's assignment, and
    a late mark of an old share is never credited to a new one (docs/data.md).

    Pure: no I/O, clock, threads or randomness.
    """

    __slots__ = ("yielded", "processed", "_void")

    def __init__(self, base: int = 0) -> None:
        self.yielded = base
        self.processed = base
        #: [index, count]: ``count`` marks that count nothing come when ``processed`` reaches
        #: ``index`` (before the position there), in index order
        self._void: list[list[int]] = []

    @property
    def void(self) -> int:
        """Marks still to come that count nothing."""
        return sum(n for _, n in self._void)

    @property
    def unmarked(self) -> int:
        """Positions yielded and not yet marked, void ones included."""
        return self.yielded - self.processed + self.void

    def take(self) -> int:
        """The index of the next position to yield (the caller checks it is in the part)."""
        self.yielded += 1
        return self.yielded - 1

    def mark(self, count: int) -> int:
        """The next ``count`` positions yielded are processed; how many of them count (a void
        one does not). Raises ``ValueError`` beyond what was yielded."""
        if not 0 <= count <= self.unmarked:
            raise ValueError(
                f"marking {count} processed would pass what was yielded ({self.unmarked} "
                "not marked yet)"
            )
        counted = 0
        while count:
            if self._void and self._void[0][0] == self.processed:
                step = min(count, self._void[0][1])
                self._void[0][1] -= step
                if not self._void[0][1]:
                    self._void.pop(0)
            else:
                upto = self._void[0][0] if self._void else self.yielded
                step = min(count, upto - self.processed)
                self.processed += step
                counted += step
            count -= step
        return counted

    def cut(self, index: int) -> None:
        """From ``index`` on, the sequence no longer holds what this reader yielded there:
        every mark still to come for a position at or after it counts nothing, a mark already
        made there is taken back (the coordinator never accepted it: it cuts only above what it
        accepted), and the reader yields from ``index`` again."""
        if index >= self.yielded:
            return
        later = sum(n for i, n in self._void if i >= index)
        later += max(0, self.yielded - max(self.processed, index))
        self._void = [v for v in self._void if v[0] < index]
        self.processed = min(self.processed, index)
        self.yielded = index
        if later:
            self._void.append([index, later])

    def advance(self, base: int) -> None:
        """The coordinator counts ``base`` positions processed (another incarnation's reports,
        a part sent whole): marks still to come for positions below it count nothing, and the
        reader yields from ``base`` on."""
        if base <= self.processed:
            return
        before = sum(n for i, n in self._void if i <= base)
        before += min(self.yielded, base) - self.processed
        self._void = [v for v in self._void if v[0] > base]
        self.processed = base
        self.yielded = max(self.yielded, base)
        if before:
            self._void.insert(0, [base, before])

    def follow(
        self,
        old_base: int,
        old_remaining: Sequence[Segment],
        new_base: int,
        new_remaining: Sequence[Segment],
    ) -> None:
        """The rank's part changed from the old to the new one: what was yielded beyond the
        first index where they differ is void, and nothing below the new base is to be read."""
        self.cut(same_until(old_base, old_remaining, new_base, new_remaining, self.yielded))
        self.advance(new_base)
