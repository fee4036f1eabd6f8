"""``GET /metrics``: the host's counters in the Prometheus text exposition format (0.0.4).

Hand-written rather than through prometheus_client: a dozen series do not need a dependency,
and the host's counters are plain numbers that only the host loop writes.

Series (all prefixed ``foldplane_``):

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

from collections.abc import Iterable, Mapping

from coordinator.host.loop import Host

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _family(name: str, kind: str, help_: str) -> list[str]:
    return [f"# HELP foldplane_{name} {help_}", f"# TYPE foldplane_{name} {kind}"]


def _labelled(name: str, label: str, values: Mapping[str, int | float]) -> Iterable[str]:
    for key in sorted(values):
        yield f'foldplane_{name}{{{label}="{_escape(str(key))}"}} {values[key]}'


def _scalar(name: str, kind: str, help_: str, value: int | float) -> list[str]:
    return [*_family(name, kind, help_), f"foldplane_{name} {value}"]


def _by_label(
    name: str, kind: str, help_: str, label: str, values: Mapping[str, int | float]
) -> list[str]:
    return [*_family(name, kind, help_), *_labelled(name, label, values)]


async def render(host: Host) -> str:
    m = host.metrics
    head = await host.log.head() if not host.log.closed else host.applied_offset
    lines = [
        *_by_label(
            "appends_total", "counter", "Records appended to the log, by kind.", "kind", m.appends
        ),
        *_scalar(
            "append_batches_total", "counter", "Group commits the host issued.", m.append_batches
        ),
        *_scalar(
            "heartbeats_total",
            "counter",
            "Heartbeats written into shared heartbeat records.",
            m.heartbeats,
        ),
        *_by_label(
            "view_changes_total", "counter", "Committed views, by group.", "group", m.view_changes
        ),
        *_by_label(
            "proposals_total", "counter", "Proposals resolved, by outcome.", "outcome", m.proposals
        ),
        *_by_label(
            "fenced_inputs_total",
            "counter",
            "Inputs refused (fenced or invalid), by code.",
            "code",
            m.fenced,
        ),
        *_scalar(
            "updates_undelivered_total",
            "counter",
            "Agent updates dropped before their rank read them.",
            host.journals.undelivered,
        ),
        *_scalar(
            "updates_resync_total", "counter", "Long-poll answers that had to resync.", m.resyncs
        ),
        *_scalar("snapshots_total", "counter", "Fold snapshots written.", m.snapshots),
        *_scalar(
            "fold_lag_records",
            "gauge",
            "Durable records not yet folded.",
            max(0, head - host.machine.offset),
        ),
        *_scalar("log_head", "gauge", "The last durable offset.", head),
        *_scalar("fold_offset", "gauge", "The offset the fold has applied.", host.machine.offset),
        *_scalar(
            "term", "gauge", "The leadership term this coordinator appends under.", host.log.term
        ),
        *_scalar("groups", "gauge", "Groups known to the fold.", len(list(host.machine.groups()))),
        *_scalar("queue_depth", "gauge", "Inputs waiting for the host loop.", host.queue_depth),
    ]
    hist = m.fold_latency
    lines += _family(
        "fold_latency_seconds", "histogram", "From an input's arrival to its effects carried out."
    )
    cumulative = 0
    for bound, count in zip(hist.buckets, hist.counts, strict=True):
        cumulative += count
        lines.append(f'foldplane_fold_latency_seconds_bucket{{le="{bound}"}} {cumulative}')
    lines.append(f'foldplane_fold_latency_seconds_bucket{{le="+Inf"}} {hist.total}')
    lines.append(f"foldplane_fold_latency_seconds_sum {hist.sum:.6f}")
    lines.append(f"foldplane_fold_latency_seconds_count {hist.total}")
    return "\n".join(lines) + "\n"
