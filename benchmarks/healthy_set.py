"""Healthy Set: the exact maximum clique against a greedy peel like Mooncake's.

Metrics:
- time to compute the exact Healthy Set for 1,024 ranks with 64 down links (target <= 20 ms)
  and 8,192 ranks with 16 down links (target <= 200 ms), with the greedy peel timed on the same
  graphs as the baseline;
- how often the greedy peel is *not* maximum on random partitions (sides of random sizes with
  most cross links down, plus a few stray down links), and by how many ranks it falls short.

The greedy peel is the heuristic the exact search replaces: while the remaining ranks are not
fully connected, drop the one with the fewest usable links (ties: the highest rank).
"""

from __future__ import annotations

import random
import time

from ..coordinator.fold.healthy_set import healthy_set
from .harness import Result, lower_is_better_ratio, median, percentile


def greedy_peel(n: int, down_edges: list[tuple[int, int]]) -> tuple[int, ...]:
    """Mooncake-style: repeatedly drop the member with the fewest usable links."""
    down: dict[int, set[int]] = {r: set() for r in range(n)}
    for a, b in down_edges:
        down[a].add(b)
        down[b].add(a)
    members = set(range(n))
    # The remaining ranks are a clique once no down edge is left among them, and a rank with
    # no down edge has the most usable links, so only ranks touching a down edge are scanned.
    touched = {r for r, peers in down.items() if peers}
    while touched:
        _, r = max((len(down[r]), r) for r in touched)
        members.discard(r)
        touched.discard(r)
        for peer in down.pop(r):
            down[peer].discard(r)
            if not down[peer]:
                touched.discard(peer)
    return tuple(sorted(members))


def random_down_links(rnd: random.Random, n: int, m: int) -> list[tuple[int, int]]:
    edges: set[tuple[int, int]] = set()
    while len(edges) < m:
        a, b = rnd.sample(range(n), 2)
        edges.add((min(a, b), max(a, b)))
    return sorted(edges)


def random_partition(rnd: random.Random) -> tuple[int, list[tuple[int, int]]]:
    """2-4 sides of random sizes; each cross link down with probability 0.6-1.0; a few stray
    down links inside sides (flaky NICs)."""
    n = rnd.randint(6, 48)
    sides = rnd.randint(2, 4)
    side = [rnd.randrange(sides) for _ in range(n)]
    p_cross = rnd.uniform(0.6, 1.0)
    edges = [
        (a, b)
        for a in range(n)
        for b in range(a + 1, n)
        if (side[a] != side[b] and rnd.random() < p_cross) or rnd.random() < 0.02
    ]
    return n, edges


def _time_ms(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return (time.perf_counter() - t0) * 1000


def _against_greedy(
    metric: str, exact: list[float], greedy: list[float], *, target: str | None = None, extra: dict
) -> Result:
    """The exact search's times (ms) beside the greedy peel's, measured on the same graphs."""
    ours, theirs = median(exact), median(greedy)
    return Result(
        bench="healthy_set",
        metric=metric,
        unit="ms",
        median=ours,
        p99=percentile(exact, 99),
        baseline="greedy peel (Mooncake-style)",
        baseline_median=theirs,
        ratio=lower_is_better_ratio(ours, theirs),
        target=target,
        extra=extra,
    )


def _timing(rnd: random.Random, n: int, m: int, trials: int, target_ms: float) -> list[Result]:
    exact, greedy = [], []
    for _ in range(trials):
        edges = random_down_links(rnd, n, m)
        everyone = set(range(n))
        exact.append(_time_ms(healthy_set, range(n), edges, everyone))
        greedy.append(_time_ms(greedy_peel, n, edges))
    return [
        _against_greedy(
            f"exact, {n} ranks, {m} down links",
            exact,
            greedy,
            target=f"<= {target_ms:g} ms",
            extra={"trials": trials},
        )
    ]


def _quality(rnd: random.Random, trials: int) -> list[Result]:
    short = 0
    missing: list[int] = []
    for _ in range(trials):
        n, edges = random_partition(rnd)
        exact = healthy_set(range(n), edges, set(range(n)))
        greedy = greedy_peel(n, edges)
        if len(greedy) < len(exact):
            short += 1
            missing.append(len(exact) - len(greedy))
        assert len(greedy) <= len(exact), "the exact Healthy Set is never smaller than greedy"
    return [
        Result(
            bench="healthy_set",
            metric="greedy peel not maximum on random partitions",
            unit="% of cases",
            median=100.0 * short / trials,
            extra={
                "trials": trials,
                "cases_short": short,
                "median_ranks_short": median(missing) if missing else 0,
                "max_ranks_short": max(missing, default=0),
            },
        )
    ]


def _split(n: int, left: int, trials: int) -> list[Result]:
    """A hard partition: every link between two sides down (a dense down graph, the general
    branch and bound rather than the sparse fast path)."""
    edges = [(a, b) for a in range(left) for b in range(left, n)]
    exact, greedy = [], []
    for _ in range(trials):
        exact.append(_time_ms(healthy_set, range(n), edges, set(range(n))))
        greedy.append(_time_ms(greedy_peel, n, edges))
    assert healthy_set(range(n), edges, set(range(n))) == tuple(range(left))
    return [
        _against_greedy(
            f"exact, {n} ranks split {left}/{n - left}, all cross links down",
            exact,
            greedy,
            extra={"trials": trials, "down_links": len(edges)},
        )
    ]


def run(quick: bool) -> list[Result]:
    rnd = random.Random(20_251_129)
    trials = 10 if quick else 40
    return [
        *_timing(rnd, 1024, 64, trials, 20),
        *_timing(rnd, 8192, 16, trials, 200),
        *_split(256, 150, 3 if quick else 10),
        *_quality(rnd, 200 if quick else 1000),
    ]
