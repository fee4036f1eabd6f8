"""The toy facet's benchmark (its plugin's ``benchmarks``: ``python -m benchmarks toy`` when
``FOLDPLANE_FACETS`` names the facet): how many ``toy_bump`` records a fresh fold of the toy
facet steps a second, in process."""

from __future__ import annotations

import time

from foldplane.benchmarks.harness import Result, median
from foldplane.coordinator.fold.machine import Coordinator
from foldplane.coordinator.fold.registry import Facets
from foldplane.eventlog.record import Record

S = 1_000_000_000


def bumps_per_second(n: int) -> float:
    fold = Coordinator(Facets(["tests.facets.toy"]))
    fold.step(Record(1, S, 1, "group_created", "g", None, {"world_size": 1, "config": {}}, 0))
    records = [Record(2 + i, S, 1, "toy_bump", "g", None, {"by": 1}, 0) for i in range(n)]
    t0 = time.perf_counter()
    for rec in records:
        fold.step(rec)
    return n / (time.perf_counter() - t0)


def run(quick: bool) -> list[Result]:
    rates = [bumps_per_second(2_000 if quick else 20_000) for _ in range(3)]
    return [Result("toy", "toy bumps folded per second", "records/s", median(rates))]
