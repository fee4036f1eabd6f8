"""``GET /metrics`` on a real SQLite file: every host series by name, type and labels, the
process and GC series ``prometheus_client`` adds, and one registry per app.

The host runs in-process; the scrape goes through the ASGI application itself.
"""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from foldplane.coordinator.host.loop import Appended, Host
from foldplane.coordinator.host.metrics import LATENCY_BUCKETS
from foldplane.eventlog import NewRecord
from tests.service.conftest import asgi_client

#: Every host series the exposition has carried, by type, with its label (docs/operations.md).
COUNTERS = {
    "foldplane_appends_total": "kind",
    "foldplane_append_batches_total": None,
    "foldplane_heartbeats_total": None,
    "foldplane_view_changes_total": "group",
    "foldplane_proposals_total": "outcome",
    "foldplane_fenced_inputs_total": "code",
    "foldplane_updates_undelivered_total": None,
    "foldplane_updates_resync_total": None,
    "foldplane_snapshots_total": None,
}
GAUGES = (
    "foldplane_fold_lag_records",
    "foldplane_log_head",
    "foldplane_fold_offset",
    "foldplane_term",
    "foldplane_groups",
    "foldplane_queue_depth",
)
HISTOGRAM = "foldplane_fold_latency_seconds"


def _declared(text: str) -> dict[str, str]:
    """``# TYPE name type`` lines: name -> type."""
    return {
        line.split()[2]: line.split()[3] for line in text.splitlines() if line.startswith("# TYPE ")
    }


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def _scrape(client: httpx.AsyncClient) -> str:
    r = await client.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    return r.text


async def test_every_host_series_keeps_its_name_type_and_labels(host: Host) -> None:
    created = await host.submit(
        NewRecord(kind="group_created", group="w", payload={"world_size": 2, "config": {}})
    )
    assert isinstance(created, Appended)
    async with asgi_client(host) as client:
        stale = {"type": "heartbeat", "group": "w", "rank": 0, "incarnation": "nobody"}
        answer = await client.post("/agents/events", json={"events": [stale]})
        assert answer.status_code == 200, answer.text
        [refused] = answer.json()["results"]
        code = refused["error"]
        text = await _scrape(client)

    declared = _declared(text)
    for name in COUNTERS:
        assert declared.get(name) == "counter", (name, declared.get(name))
        assert f"# HELP {name} " in text, name
    for name in GAUGES:
        assert declared.get(name) == "gauge", (name, declared.get(name))
        assert f"# HELP {name} " in text, name
    assert declared.get(HISTOGRAM) == "histogram"

    samples = _samples(text)
    head = host.applied_offset
    assert samples[("foldplane_appends_total", (("kind", "group_created"),))] == 1
    assert samples[("foldplane_fenced_inputs_total", (("code", code),))] == 1
    assert samples[("foldplane_append_batches_total", ())] == host.metrics.append_batches
    assert samples[("foldplane_log_head", ())] == head
    assert samples[("foldplane_fold_offset", ())] == head
    assert samples[("foldplane_fold_lag_records", ())] == 0
    assert samples[("foldplane_groups", ())] == 1
    assert samples[("foldplane_term", ())] == host.log.term
    for name, label in COUNTERS.items():
        labelled = [labels for (n, labels) in samples if n == name]
        if label is None:
            assert labelled == [()], (name, labelled)
        else:
            assert all([k for k, _ in labels] == [label] for labels in labelled), (name, labelled)
    bounds = [dict(labels)["le"] for (n, labels) in samples if n == f"{HISTOGRAM}_bucket"]
    assert bounds == [str(b) for b in LATENCY_BUCKETS] + ["+Inf"]
    observed = host.metrics.fold_latency.total
    assert observed >= 1
    assert samples[(f"{HISTOGRAM}_bucket", (("le", "+Inf"),))] == observed
    assert samples[(f"{HISTOGRAM}_count", ())] == observed
    assert samples[(f"{HISTOGRAM}_sum", ())] == pytest.approx(host.metrics.fold_latency.sum)


async def test_the_process_and_gc_series_come_with_it(host: Host) -> None:
    async with asgi_client(host) as client:
        text = await _scrape(client)
    declared = _declared(text)
    assert declared.get("process_resident_memory_bytes") == "gauge"
    assert declared.get("process_cpu_seconds_total") == "counter"
    assert declared.get("python_gc_collections_total") == "counter"
    assert declared.get("python_info") == "gauge"
    samples = _samples(text)
    assert samples[("process_resident_memory_bytes", ())] > 0
    assert {labels for (n, labels) in samples if n == "python_gc_collections_total"} == {
        (("generation", g),) for g in ("0", "1", "2")
    }


async def test_two_apps_in_one_process_each_report_their_own_host(tmp_path) -> None:
    """Each app has its own registry: no collision, and each scrape shows its own host."""
    a = await Host.open(str(tmp_path / "a.db"), heartbeat_flush_s=0)
    b = await Host.open(str(tmp_path / "b.db"), heartbeat_flush_s=0)
    try:
        await a.submit(
            NewRecord(kind="group_created", group="x", payload={"world_size": 1, "config": {}})
        )
        async with asgi_client(a) as ca, asgi_client(b) as cb:
            sa, sb = _samples(await _scrape(ca)), _samples(await _scrape(cb))
        assert sa[("foldplane_groups", ())] == 1 and sb[("foldplane_groups", ())] == 0
        assert ("foldplane_appends_total", (("kind", "group_created"),)) not in sb
        assert ("process_resident_memory_bytes", ()) in sa and (
            "process_resident_memory_bytes",
            (),
        ) in sb
    finally:
        await a.close()
        await b.close()
