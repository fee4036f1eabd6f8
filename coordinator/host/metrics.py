"""Counters the execution host keeps for ``/metrics``: plain numbers, no exporter in the host.

The host only increments; ``api.metrics`` reads them at scrape time (a ``prometheus_client``
collector) and renders them in the Prometheus text format.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass, field

#: Upper bounds (seconds) of the latency histograms: from 0.5 ms to 5 s.
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass
class Histogram:
    buckets: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS))
    total: int = 0
    sum: float = 0.0

    def observe(self, value: float) -> None:
        self.total += 1
        self.sum += value
        i = bisect_left(self.buckets, value)
        if i < len(self.counts):
            self.counts[i] += 1


@dataclass
class HostMetrics:
    #: Records appended, by kind.
    appends: Counter[str] = field(default_factory=Counter)
    #: Append batches (group commits the host issued).
    append_batches: int = 0
    #: Heartbeats written into shared records (one ``heartbeat`` record names many beats).
    heartbeats: int = 0
    #: Committed views, by group.
    view_changes: Counter[str] = field(default_factory=Counter)
    #: Proposals resolved, by outcome (applied, applied_with_dropped_ranks, rejected).
    proposals: Counter[str] = field(default_factory=Counter)
    #: Inputs refused before or at the fold, by code (stale_incarnation, stale_version, ...).
    fenced: Counter[str] = field(default_factory=Counter)
    #: Long-poll answers that had to resync because the journal no longer held the updates.
    resyncs: int = 0
    #: Snapshots written.
    snapshots: int = 0
    #: Time from an input's arrival at the host to its effects being carried out.
    fold_latency: Histogram = field(default_factory=Histogram)
