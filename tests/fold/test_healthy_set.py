"""The Healthy Set against brute force on random graphs of up to 12 ranks: maximum size and the
tie-break (most currently-HEALTHY members, then the lexicographically smallest rank list)."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from foldplane.coordinator.fold.healthy_set import healthy_set


def brute_force(
    candidates: list[int], down: set[frozenset[int]], healthy: set[int]
) -> tuple[int, ...]:
    best: tuple[int, int, tuple[int, ...]] | None = None
    for k in range(len(candidates), -1, -1):
        for combo in itertools.combinations(sorted(candidates), k):
            if any(frozenset(p) in down for p in itertools.combinations(combo, 2)):
                continue
            key = (-k, -sum(r in healthy for r in combo), combo)
            if best is None or key < best:
                best = key
        if best is not None:
            return best[2]
    raise AssertionError("the empty set is always a clique")


@st.composite
def graphs(draw):
    n = draw(st.integers(min_value=0, max_value=12))
    ranks = list(range(n))
    candidates = draw(st.lists(st.sampled_from(ranks), unique=True)) if n else []
    density = draw(st.sampled_from([0.05, 0.2, 0.5, 0.8]))
    pairs = list(itertools.combinations(ranks, 2))
    flips = draw(
        st.lists(st.floats(min_value=0, max_value=1), min_size=len(pairs), max_size=len(pairs))
    )
    down = [p for p, f in zip(pairs, flips, strict=True) if f < density]
    healthy = set(draw(st.lists(st.sampled_from(ranks), unique=True))) if n else set()
    return candidates, down, healthy


@settings(max_examples=400, deadline=None)
@given(graphs())
def test_matches_brute_force(graph):
    candidates, down, healthy = graph
    expected = brute_force(candidates, {frozenset(e) for e in down}, healthy)
    assert healthy_set(candidates, down, healthy) == expected


def test_partition_keeps_the_larger_side():
    cross = [(a, b) for a in (0, 1, 2) for b in (3, 4)]
    assert healthy_set(range(5), cross, set(range(5))) == (0, 1, 2)


def test_two_two_split_ties_go_to_healthy_then_smallest():
    cross = [(a, b) for a in (0, 1) for b in (2, 3)]
    assert healthy_set(range(4), cross, {0, 1, 2, 3}) == (0, 1)
    assert healthy_set(range(4), cross, {2, 3}) == (2, 3)
    assert healthy_set(range(4), cross, {1, 2, 3}) == (2, 3)
    assert healthy_set(range(4), cross, set()) == (0, 1)


def test_edges_to_non_candidates_do_not_matter():
    assert healthy_set([0, 1, 2], [(0, 5), (2, 2)], set()) == (0, 1, 2)


def test_large_sparse_down_graph_is_exact():
    # a star of down edges around rank 0 plus a triangle: drop 0 and two of the triangle
    n = 2048
    down = [(0, r) for r in range(1, 40)] + [(100, 101), (101, 102), (100, 102)]
    hs = healthy_set(range(n), down, set(range(n)))
    assert len(hs) == n - 3 and 0 not in hs and 100 in hs and {101, 102}.isdisjoint(hs)


def test_a_partition_side_deeper_than_the_recursion_limit():
    """A 1,100-rank side would be 1,100 nested include-branches: the search must not recurse."""
    n, left = 1200, 1100
    cross = [(a, b) for a in range(left) for b in range(left, n)]
    stray = [(3, 5), (5, 7)]  # a flaky NIC inside the big side: drop 5, keep 3 and 7
    hs = healthy_set(range(n), cross + stray, set(range(n)))
    assert hs == tuple(r for r in range(left) if r != 5)
