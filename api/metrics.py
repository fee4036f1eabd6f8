"""``GET /metrics``: the host's counters in the Prometheus text exposition format (0.0.4).

Hand-written rather than through prometheus_client: a dozen series do not need a dependency,
and the host's counters are plain numbers that only the host loop writes.

Series (all prefixed ``foldplane_``):

- ``appends_total{kind}`` records appended; ``append_batches_total`` group commits issued;
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

from coordinator.host import Host

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _family(name: str, kind: str, help_: str) -> list[str]:
    return [f"# HELP foldplane_{name} {help_}", f"# TYPE foldplane_{name} {kind}"]


def _labelled(name: str, label: str, values: Mapping[str, int | float]) -> Iterable[str]:
    for key in sorted(values):
        yield f'foldplane_{name}{{{label}="{_escape(str(key))}"}} {values[key]}'


async def render(host: Host) -> str:
    m = host.metrics
    head = await host.log.head() if not host.log.closed else host.applied_offset
    lines: list[str] = []
    lines += _family("appends_total", "counter", "Records appended to the log, by kind.")
    lines += _labelled("appends_total", "kind", m.appends)
    lines += _family("append_batches_total", "counter", "Group commits the host issued.")
    lines.append(f"foldplane_append_batches_total {m.append_batches}")
    lines += _family("view_changes_total", "counter", "Committed views, by group.")
    lines += _labelled("view_changes_total", "group", m.view_changes)
    lines += _family("proposals_total", "counter", "Proposals resolved, by outcome.")
    lines += _labelled("proposals_total", "outcome", m.proposals)
    lines += _family(
        "fenced_inputs_total", "counter", "Inputs refused (fenced or invalid), by code."
    )
    lines += _labelled("fenced_inputs_total", "code", m.fenced)
    lines += _family(
        "updates_undelivered_total", "counter", "Agent updates dropped before their rank read them."
    )
    lines.append(f"foldplane_updates_undelivered_total {host.journals.undelivered}")
    lines += _family("updates_resync_total", "counter", "Long-poll answers that had to resync.")
    lines.append(f"foldplane_updates_resync_total {m.resyncs}")
    lines += _family("snapshots_total", "counter", "Fold snapshots written.")
    lines.append(f"foldplane_snapshots_total {m.snapshots}")
    lines += _family("fold_lag_records", "gauge", "Durable records not yet folded.")
    lines.append(f"foldplane_fold_lag_records {max(0, head - host.machine.offset)}")
    lines += _family("log_head", "gauge", "The last durable offset.")
    lines.append(f"foldplane_log_head {head}")
    lines += _family("fold_offset", "gauge", "The offset the fold has applied.")
    lines.append(f"foldplane_fold_offset {host.machine.offset}")
    lines += _family("term", "gauge", "The leadership term this coordinator appends under.")
    lines.append(f"foldplane_term {host.log.term}")
    lines += _family("groups", "gauge", "Groups known to the fold.")
    lines.append(f"foldplane_groups {len(list(host.machine.groups()))}")
    lines += _family("queue_depth", "gauge", "Inputs waiting for the host loop.")
    lines.append(f"foldplane_queue_depth {host.queue_depth}")
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
