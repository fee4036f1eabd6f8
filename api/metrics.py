"""``GET /metrics``: the host's counters and the process's own series, in the Prometheus text
exposition format (0.0.4), through ``prometheus_client``.

Each app has a registry of its own (never the library's global one), so several apps in one
process each report their own host. The host's series come from a collector that reads the
host's plain counters (``coordinator.host.metrics``) at scrape time; the library's collectors
add the standard ``process_*``, ``python_gc_*`` and ``python_info`` series.

Host series (all prefixed ``foldplane_``):

- ``appends_total{kind}`` records appended; ``append_batches_total`` group commits issued;
  ``heartbeats_total`` beats written into shared heartbeat records;
- ``view_changes_total{group}`` committed views;
- ``proposals_total{outcome}`` proposals resolved (applied, applied_with_dropped_ranks, rejected);
- ``fenced_inputs_total{code}`` inputs refused (stale_incarnation, stale_version, rank_busy, ...);
- ``updates_undelivered_total`` journal entries dropped before their rank read them;
  ``updates_resync_total`` long-poll answers that had to resync;
- ``fold_lag_records`` records durable in the log but not yet folded (gauge);
  ``fold_latency_seconds`` histogram, from an input's arrival to its effects carried out;
- ``log_head``, ``fold_offset``, ``term``, ``groups``, ``queue_depth``, ``snapshots_total``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import (
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from ..coordinator.host.loop import Host

#: The text format ``generate_latest`` writes (what Prometheus asks for by default).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _counter(name: str, help_: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(f"foldplane_{name}", help_, value=value)


def _gauge(name: str, help_: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"foldplane_{name}", help_, value=value)


def _counter_by(
    name: str, help_: str, label: str, values: Mapping[str, int]
) -> CounterMetricFamily:
    family = CounterMetricFamily(f"foldplane_{name}", help_, labels=[label])
    for key in sorted(values):
        family.add_metric([str(key)], values[key])
    return family


class HostCollector(Collector):
    """The host's counters, read when the registry is collected.

    The log's head is the one value that needs an ``await``: ``Exposition.render`` reads it
    and hands it in just before it collects (nothing else runs between the two on the loop).
    """

    def __init__(self, host: Host) -> None:
        self.host = host
        self.head = 0

    def collect(self) -> Iterator[Metric]:
        host, m, head = self.host, self.host.metrics, self.head
        yield _counter_by(
            "appends_total", "Records appended to the log, by kind.", "kind", m.appends
        )
        yield _counter("append_batches_total", "Group commits the host issued.", m.append_batches)
        yield _counter(
            "heartbeats_total", "Heartbeats written into shared heartbeat records.", m.heartbeats
        )
        yield _counter_by(
            "view_changes_total", "Committed views, by group.", "group", m.view_changes
        )
        yield _counter_by(
            "proposals_total", "Proposals resolved, by outcome.", "outcome", m.proposals
        )
        yield _counter_by(
            "fenced_inputs_total", "Inputs refused (fenced or invalid), by code.", "code", m.fenced
        )
        yield _counter(
            "updates_undelivered_total",
            "Agent updates dropped before their rank read them.",
            host.journals.undelivered,
        )
        yield _counter("updates_resync_total", "Long-poll answers that had to resync.", m.resyncs)
        yield _counter("snapshots_total", "Fold snapshots written.", m.snapshots)
        offset = host.reads.offset
        yield _gauge("fold_lag_records", "Durable records not yet folded.", max(0, head - offset))
        yield _gauge("log_head", "The last durable offset.", head)
        yield _gauge("fold_offset", "The offset the fold has applied.", offset)
        yield _gauge("term", "The leadership term this coordinator appends under.", host.log.term)
        yield _gauge("groups", "Groups known to the fold.", len(list(host.reads.groups())))
        yield _gauge("queue_depth", "Inputs waiting for the host loop.", host.queue_depth)
        hist = m.fold_latency
        buckets: list[tuple[str, float]] = []
        cumulative = 0
        for bound, count in zip(hist.buckets, hist.counts, strict=True):
            cumulative += count
            buckets.append((str(bound), cumulative))
        buckets.append(("+Inf", hist.total))
        yield HistogramMetricFamily(
            "foldplane_fold_latency_seconds",
            "From an input's arrival to its effects carried out.",
            buckets=buckets,
            sum_value=hist.sum,
        )


class Exposition:
    """One app's registry: its host's series and the process's (``process_*``, ``python_gc_*``,
    ``python_info``)."""

    def __init__(self, host: Host) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._host = HostCollector(host)
        self.registry.register(self._host)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)

    async def render(self) -> bytes:
        host = self._host.host
        self._host.head = await host.log.head() if not host.log.closed else host.applied_offset
        return generate_latest(self.registry)
