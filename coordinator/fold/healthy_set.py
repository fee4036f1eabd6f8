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

Its interface: :func:`healthy_moves` reads a group and returns its decision, a
:class:`HealthyMoves`; the machine applies it (``apply.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set

import msgspec

from ...eventlog.record import Record
from .effects import HEALTHY, SYNCED, RankState
from .reasons import ranks_text
from .state import GroupState, rank_state


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
    search = _Search(vertices, down, healthy)
    chosen = search.connected((1 << len(vertices)) - 1)
    return {vertices[i] for i in range(len(vertices)) if (chosen >> i) & 1}


class _Search:
    """Bitset search over one component; vertex ``i`` is ``vertices[i]`` (ascending ranks), so
    comparing bit positions compares ranks.

    Two decompositions keep the search small before any branching: vertices with no down edge
    inside the current set join every maximum clique, and the down graph splits into connected
    components that are decided independently (``best``); a component whose *usable* graph is
    disconnected (a partition) has its maximum clique inside one usable component, so each is
    decided on its own and the best one wins (``connected``). Only what is left is branched on.
    """

    def __init__(self, vertices: list[int], down: Mapping[int, Set[int]], healthy: Set[int]):
        index = {rank: i for i, rank in enumerate(vertices)}
        n = len(vertices)
        everyone = (1 << n) - 1
        #: conflict[i]: the vertices that cannot share a clique with i (its down neighbours)
        self.conflict = [0] * n
        for i, rank in enumerate(vertices):
            bits = 0
            for peer in down[rank]:
                if peer in index:
                    bits |= 1 << index[peer]
            self.conflict[i] = bits
        self.adjacent = [everyone & ~self.conflict[i] & ~(1 << i) for i in range(n)]
        self.healthy = sum(1 << i for i, rank in enumerate(vertices) if rank in healthy)

    def better(self, a: int, b: int) -> bool:
        """Does clique ``a`` beat clique ``b``: larger, then more HEALTHY, then the smallest
        rank of their symmetric difference is in ``a`` (the lexicographically smaller list)."""
        ka = (a.bit_count(), (a & self.healthy).bit_count())
        kb = (b.bit_count(), (b & self.healthy).bit_count())
        if ka != kb:
            return ka > kb
        diff = a ^ b
        return bool(diff & -diff & a)

    def best(self, p: int) -> int:
        """The best clique among the vertices of ``p``."""
        conflict = self.conflict
        chosen = 0
        rest = 0
        q = p
        while q:
            low = q & -q
            q ^= low
            if conflict[low.bit_length() - 1] & p:
                rest |= low
            else:
                chosen |= low
        while rest:
            component = _spread(rest & -rest, rest, conflict)
            rest &= ~component
            chosen |= self.connected(component)
        return chosen

    def connected(self, p: int) -> int:
        """The best clique of a set that is connected in the down graph."""
        parts = []
        rest = p
        while rest:
            part = _spread(rest & -rest, rest, self.adjacent)
            rest &= ~part
            parts.append(part)
        if len(parts) == 1:
            return self.branch_and_bound(p)
        winner = 0
        for part in parts:
            candidate = self.best(part)
            if not winner or self.better(candidate, winner):
                winner = candidate
        return winner

    def colour_bound(self, p: int) -> int:
        """Colours of a greedy colouring of the usable graph on ``p``: an upper bound on its
        clique size (each colour class is a clique of the down graph)."""
        conflict = self.conflict
        colours = 0
        while p:
            colours += 1
            q = p
            while q:
                low = q & -q
                p &= ~low
                q &= ~low & conflict[low.bit_length() - 1]
        return colours

    def branch_and_bound(self, p: int) -> int:
        """Include-first on the lowest vertex, with an explicit stack (no recursion limit), so
        complete cliques arrive in the tie-break's lexicographic order; a branch survives only
        if its bounds could *strictly* beat the best (size, HEALTHY count) found so far."""
        adjacent, healthy = self.adjacent, self.healthy
        best_size = best_healthy = -1
        best = 0
        stack = [(0, 0, 0, p)]
        while stack:
            size, n_healthy, chosen, p = stack.pop()
            if not p:
                if size > best_size or (size == best_size and n_healthy > best_healthy):
                    best_size, best_healthy, best = size, n_healthy, chosen
                continue
            room = self.colour_bound(p)
            if size + room < best_size:
                continue
            if size + room == best_size and (
                n_healthy + min(room, (p & healthy).bit_count()) <= best_healthy
            ):
                continue
            low = p & -p
            i = low.bit_length() - 1
            stack.append((size, n_healthy, chosen, p & ~low))
            stack.append(
                (size + 1, n_healthy + ((healthy >> i) & 1), chosen | low, p & adjacent[i])
            )
        return best


def _spread(seed: int, within: int, neighbours: list[int]) -> int:
    """The connected component of ``seed`` inside ``within`` (bitsets)."""
    component = seed
    frontier = seed
    while frontier:
        low = frontier & -frontier
        frontier ^= low
        new = neighbours[low.bit_length() - 1] & within & ~component
        component |= new
        frontier |= new
    return component


def down_graph(g: GroupState) -> dict[int, set[int]]:
    """The down graph among ``g``'s candidates: the reporters' current down evidence, symmetric."""
    cand = g.candidates
    down: dict[int, set[int]] = {}
    for rank in g.reporters:
        if rank not in cand:
            continue
        for peer in g.ranks[rank].down:
            if peer in cand:
                down.setdefault(rank, set()).add(peer)
                down.setdefault(peer, set()).add(rank)
    return down


class HealthyMoves(msgspec.Struct, frozen=True, gc=False):
    """A decision: the Healthy Set after new evidence. ``joined`` become HEALTHY, ``left``
    SYNCED; ``healthy`` is the whole new set when it was computed in full (None: only
    ``joined`` and ``left`` changed it); ``all_candidates`` whether it now holds every
    candidate; ``effects`` a ``rank_state`` for each rank that moved. The machine applies it
    (``apply.move_healthy``)."""

    joined: Set[int]
    left: Set[int]
    healthy: set[int] | None
    all_candidates: bool
    effects: tuple[RankState, ...]


def healthy_moves(g: GroupState, record: Record) -> HealthyMoves:
    """HEALTHY = inside the Healthy Set; a self-ready candidate outside it is SYNCED.

    Reads ``g``'s candidates, link evidence, current HEALTHY ranks and the ranks whose
    candidacy changed since the last decision (``touched``); returns who joins and who leaves
    the set, with a ``rank_state`` for each (naming the set's size and why a rank left), and
    changes nothing. The machine asks only when evidence changed and no reconciliation window
    is open."""
    down = down_graph(g)
    healthy, cand = g.healthy, g.candidates
    new: set[int] | None = None
    if not down and g.healthy_is_all:
        # Still no down edge: every candidate is in, and only touched ranks can have moved
        # (a group of thousands forming costs O(1) per ready report, not O(world_size)).
        left = {r for r in g.touched if r in healthy and r not in cand}
        joined = {r for r in g.touched if r in cand and r not in healthy}
        size = len(healthy) - len(left) + len(joined)
    else:
        new = cand - excluded_ranks(down, healthy) if down else set(cand)
        left = healthy - new
        joined = new - healthy
        size = len(new)
    effects = []
    for rank in sorted(left | joined):
        if rank in joined:
            state, reason = HEALTHY, f"in the Healthy Set ({size} ranks)"
        else:
            peers = down.get(rank, ())
            why = f"links down to {ranks_text(peers)}" if peers else "not self-ready"
            state, reason = SYNCED, f"left the Healthy Set ({size} ranks): {why}"
        effects.append(rank_state(g, rank, reason, record, state=state))
    return HealthyMoves(joined, left, new, not down, tuple(effects))
