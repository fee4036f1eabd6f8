"""The Healthy Set: an exact maximum clique of the usable-edge graph, with a deterministic tie-break.

The graph's vertices are the *candidates* (ranks that are SYNCED or HEALTHY and self-ready); an
edge is usable unless a current report says it is down. So the usable graph is the complement of
the small *down graph*, and

    maximum clique of the usable graph = candidates minus a minimum vertex cover of the down graph.

Candidates that touch no down edge belong to every maximum clique (they are adjacent to everyone),
so only the ranks that touch a down edge need a search, and each connected component of the down
graph is decided on its own: sizes and HEALTHY counts add up across components, and the
lexicographic order of the union is decided by the first component that differs (the smallest
rank of a symmetric difference lies in exactly one component).

Tie-break, in order (why: stability first, then a rule anyone can recompute by hand):
  1. the largest clique (a partition keeps its largest fully connected side);
  2. among those, the most members that are HEALTHY now, so a working group is not reshuffled
     when an equally large alternative appears;
  3. then the lexicographically smallest sorted rank list ({0,1} beats {2,3} in a 2-2 split).

Within a component the search is a branch and bound over bitsets (Python ints): it branches on the
lowest-numbered vertex, including it first, so complete cliques are met in exactly the tie-break's
lexicographic order and the first one found at the best (size, HEALTHY count) is the answer. A
greedy colouring bounds the clique size of the remaining candidates (each colour class is a clique
of the down graph, so at most one of its vertices can join); branches that cannot *strictly* beat
the best (size, HEALTHY count) found so far are pruned, which keeps the search exact.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set


def healthy_set(
    candidates: Iterable[int],
    down_edges: Iterable[tuple[int, int]],
    healthy: Set[int] = frozenset(),
) -> tuple[int, ...]:
    """The Healthy Set as a sorted tuple of ranks.

    ``down_edges`` may name ranks that are not candidates (those edges do not matter) and may
    repeat edges in either direction; ``healthy`` is the set of ranks HEALTHY right now.
    """
    cand = set(candidates)
    down: dict[int, set[int]] = {}
    for a, b in down_edges:
        if a != b and a in cand and b in cand:
            down.setdefault(a, set()).add(b)
            down.setdefault(b, set()).add(a)
    return tuple(sorted(cand - excluded_ranks(down, healthy)))


def excluded_ranks(down: Mapping[int, Set[int]], healthy: Set[int]) -> set[int]:
    """The ranks left out of the Healthy Set: a minimum vertex cover of the down graph, chosen
    by the tie-break.

    ``down`` is the down graph restricted to candidates, as a symmetric adjacency map (a rank
    with no down edge may be absent). The Healthy Set is the candidates minus this set.
    """
    excluded: set[int] = set()
    seen: set[int] = set()
    for start in sorted(down):
        if start in seen or not down[start]:
            continue
        component = _component(down, start)
        seen |= component
        kept = _best_clique_in_component(sorted(component), down, healthy)
        excluded |= component - kept
    return excluded


def _component(down: Mapping[int, Set[int]], start: int) -> set[int]:
    component = {start}
    stack = [start]
    while stack:
        for peer in down[stack.pop()]:
            if peer not in component:
                component.add(peer)
                stack.append(peer)
    return component


def _best_clique_in_component(
    vertices: list[int], down: Mapping[int, Set[int]], healthy: Set[int]
) -> set[int]:
    """The tie-break's best clique of the usable graph on one component of the down graph."""
    index = {rank: i for i, rank in enumerate(vertices)}
    n = len(vertices)
    everyone = (1 << n) - 1
    # conflict[i]: the vertices that cannot share a clique with i (its down neighbours).
    conflict = [0] * n
    for i, rank in enumerate(vertices):
        bits = 0
        for peer in down[rank]:
            bits |= 1 << index[peer]
        conflict[i] = bits
    adjacent = [everyone & ~conflict[i] & ~(1 << i) for i in range(n)]
    healthy_bits = 0
    for i, rank in enumerate(vertices):
        if rank in healthy:
            healthy_bits |= 1 << i

    best_size = -1
    best_healthy = -1
    best_bits = 0

    def colour_bound(p: int) -> int:
        """Colours in a greedy colouring of the usable graph on ``p``: an upper bound on a clique."""
        colours = 0
        while p:
            colours += 1
            q = p
            while q:
                low = q & -q
                p &= ~low
                q &= ~low & conflict[low.bit_length() - 1]
        return colours

    def search(size: int, n_healthy: int, chosen: int, p: int) -> None:
        """Include-first on the lowest vertex (recursion), exclude it (the loop), until ``p`` is
        empty: the clique ``chosen`` is then complete and compared with the best."""
        nonlocal best_size, best_healthy, best_bits
        while p:
            room = colour_bound(p)
            if size + room < best_size:
                return
            healthy_ub = n_healthy + min(room, (p & healthy_bits).bit_count())
            if size + room == best_size and healthy_ub <= best_healthy:
                return
            low = p & -p
            i = low.bit_length() - 1
            search(size + 1, n_healthy + ((healthy_bits >> i) & 1), chosen | low, p & adjacent[i])
            p &= ~low
        if size > best_size or (size == best_size and n_healthy > best_healthy):
            best_size, best_healthy, best_bits = size, n_healthy, chosen

    search(0, 0, 0, everyone)
    return {vertices[i] for i in range(n) if (best_bits >> i) & 1}
