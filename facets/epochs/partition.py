"""Ranges of an epoch's permutation and how they are shared out: pure arithmetic for the epoch
plans (``facets/epochs/fold.py``).

A *position* is an index into the epoch's permutation of the dataset (0..dataset_size-1); the
sampler maps position ``p`` to dataset index ``perm[p]``. A rank holds a **sequence**: the
segments ``(start, length)`` of positions it was given, in the order it reads them. Its cursor
(``processed``) counts the positions it has reported processed from the front of its
sequence; the rest is its *remaining* work. Segments only ever move as whole slices from the
end of one sequence to the end of another, so a position is always in exactly one sequence.

Shares are decided by :func:`apportion`: integer weights, shares in whole *grains*
(positions a sampler hands out together, say a batch), the largest-remainder method with ties
to the lowest rank, so the same inputs always give the same split, in any Python.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

# ``Segment`` (``(start, length)``: positions ``start .. start + length - 1`` of the
# permutation), ``normalized`` and ``split_at`` are the cursor's: agents apply moves with them.
from .cursor import Segment, split_at
from .cursor import (
    normalized as normalized,  # re-exported: the fold imports it from here
)

#: Weights are rounded to integers of this many units before apportioning (exact arithmetic:
#: the split of a remainder never depends on floating-point rounding order).
WEIGHT_UNITS = 1_000_000


def length(segments: Iterable[Segment]) -> int:
    """How many positions ``segments`` hold."""
    return sum(n for _, n in segments)


def take(segments: list[Segment], count: int) -> list[Segment]:
    """Remove the first ``count`` positions from ``segments`` (in place) and return them."""
    head, tail = split_at(segments, count)
    segments[:] = tail
    return head


def integer_weights(weights: Mapping[int, float]) -> dict[int, int]:
    """Weights as integers (:data:`WEIGHT_UNITS` per unit), each at least 1 where the weight
    is positive and 0 where it is not."""
    out: dict[int, int] = {}
    for rank, w in weights.items():
        if w > 0:
            out[rank] = max(1, round(w * WEIGHT_UNITS))
        else:
            out[rank] = 0
    return out


def apportion(total: int, weights: Mapping[int, int], grain: int = 1) -> dict[int, int]:
    """Split ``total`` positions among the ranks of ``weights`` (integers, at least one
    positive) in proportion to their weights, in whole grains.

    ``total // grain`` grains are shared by the largest-remainder method: each rank first gets
    the whole part of its quota, the grains left over go to the largest fractional parts (ties:
    the lowest rank). The last ``total % grain`` positions (a partial grain) go to the rank
    with the largest share (ties: the lowest rank). Every rank of ``weights`` is in the result;
    the shares add up to ``total``.
    """
    if total < 0 or grain < 1:
        raise ValueError(f"apportion needs total >= 0 and grain >= 1, got {total}, {grain}")
    ranks = sorted(weights)
    wsum = sum(weights[r] for r in ranks)
    if wsum <= 0:
        raise ValueError("apportion needs at least one positive weight")
    grains, partial = divmod(total, grain)
    share = {r: grains * weights[r] // wsum for r in ranks}
    left = grains - sum(share.values())
    if left:
        by_remainder = sorted(ranks, key=lambda r: (-(grains * weights[r] % wsum), r))
        for r in by_remainder[:left]:
            share[r] += 1
    out = {r: share[r] * grain for r in ranks}
    if partial:
        biggest = min(ranks, key=lambda r: (-out[r], -weights[r], r))
        out[biggest] += partial
    return out


def deal(pool: list[Segment], shares: Mapping[int, int]) -> dict[int, list[Segment]]:
    """Slice ``shares[r]`` positions off the front of ``pool`` for each rank, in rank order
    (in place: what is dealt leaves the pool)."""
    out: dict[int, list[Segment]] = {}
    for rank in sorted(shares):
        if shares[rank] > 0:
            out[rank] = take(pool, shares[rank])
    return out


def covers_exactly(sequences: Iterable[Sequence[Segment]], size: int) -> str | None:
    """None if the segments of all ``sequences`` together hold every position of
    ``0..size-1`` exactly once, else what is wrong (the first gap or overlap)."""
    spans = sorted((s, n) for seq in sequences for s, n in seq if n > 0)
    at = 0
    for start, n in spans:
        if start > at:
            return f"positions {at}..{start - 1} are in no range"
        if start < at:
            return f"positions {start}..{min(at, start + n) - 1} are in two ranges"
        at = start + n
    if at != size:
        return f"positions {at}..{size - 1} are in no range" if at < size else "beyond the epoch"
    return None
