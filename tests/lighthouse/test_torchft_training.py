"""torchft's own ``Manager`` on torch's native gloo group (``enable_reconfigure``, torch >= 2.14),
two replica groups training a small model (``tests/lighthouse/replica.py``), with a foldplane
coordinator as their lighthouse:

- one replica group is SIGKILLed: the other goes on alone at once (its launcher reported the
  death, so nobody waits out a heartbeat timeout), the replacement heals from it, and from then
  on both hold the same parameters at every step;
- the coordinator leader is SIGKILLed mid-run (two coordinators on PostgreSQL, the replica groups
  pointed at the standby's lighthouse port): quorums go on from the new leader and no replica
  group restarts, heals or loses its place (torchft's own lighthouse holds its quorums in one
  process's memory and cannot do this).

Afterwards the log replays to the same quorums and every quorum id decided is in it.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("torchft", reason="the torchft training tests need torchft-nightly (cp311)")

import torch.distributed as dist  # noqa: E402

from tests.ha.cluster import Node, fetch, schema_url  # noqa: E402
from tests.lighthouse.coordinator import FoldplaneLighthouse  # noqa: E402
from tests.lighthouse.job import Replicas, report_lost  # noqa: E402
from tests.service.conftest import ROOT, replay  # noqa: E402

pytestmark = pytest.mark.slow

if not hasattr(dist.ProcessGroup, "reconfigure"):  # pragma: no cover - torch < 2.14
    pytest.skip("torch's native reconfigure needs torch >= 2.14", allow_module_level=True)


@pytest.fixture
def job_store() -> Iterator[str]:
    """The job's store: the native groups rendezvous on it, and it outlives the replica groups."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    yield f"127.0.0.1:{store.port}"
    del store


def together(job: Replicas, replica: int, steps: int, pid: int | None = None) -> Callable:
    def done(line: dict[str, Any]) -> bool:
        return (
            line["replica"] == replica
            and (pid is None or line["pid"] == pid)
            and line["committed"]
            and line["participants"] == 2
            and line["step"] >= steps
        )

    return done


def same_parameters(job: Replicas, pids: dict[int, int], steps: range) -> None:
    """At every step of ``steps`` both replica groups committed, with identical parameters."""
    digests: dict[int, dict[int, str]] = {}
    for replica, pid in pids.items():
        digests[replica] = {
            ln["step"]: ln["digest"] for ln in job.of(replica, pid) if ln["committed"]
        }
    for step in steps:
        assert digests[0].get(step) is not None and digests[0].get(step) == digests[1].get(step), (
            step,
            digests,
        )


def quorum_rows(url: str) -> list[dict[str, Any]]:
    return httpx.get(url + "/lighthouse/quorums", params={"limit": 1000}).json()["quorums"]


def test_a_replica_group_dies_the_other_goes_on_and_the_replacement_heals(
    tmp_path: Path, job_store: str
) -> None:
    lighthouse = FoldplaneLighthouse(min_replicas=1, directory=tmp_path)
    job = Replicas(lighthouse.address(), job_store, tmp_path, step_s=0.05)
    try:
        first = {r: job.start(r).pid for r in (0, 1)}
        for r in (0, 1):
            job.until(together(job, r, 3), 300, f"train{r} to train with both")
        killed = job.kill(1)
        lost_at = report_lost(lighthouse.server.url, "train1", "exit -9 (SIGKILL)")
        alone = job.until(
            lambda ln: ln["replica"] == 0 and ln["committed"] and ln["participants"] == 1
            and ln["t"] > killed,
            120,
            "train0 to go on alone",
        )  # fmt: skip
        replacement = job.start(1).pid
        healed = job.until(
            lambda ln: ln["pid"] == replacement and ln["healing"], 300, "the replacement to heal"
        )
        assert healed["step"] > alone["step"]  # it took train0's state, not step 0
        last = job.until(
            together(job, 1, healed["step"] + 5, pid=replacement), 300, "both to train on"
        )
        same_parameters(job, {0: first[0], 1: replacement}, range(healed["step"], last["step"]))
        assert job.started[0] == [first[0]] and job.procs[0].poll() is None  # never restarted
    finally:
        job.close()
        lighthouse.shutdown()
    rows = {row["quorum_id"]: row for row in quorum_rows_from(lighthouse)}
    [first_id] = {p["replica_id"] for r in rows.values() for p in r["participants"]
                  if p["replica_id"].startswith("train0:")}  # fmt: skip
    assert sorted(rows) == list(range(1, max(rows) + 1))  # every quorum id decided is kept
    before = [r for r in rows.values() if r["offset"] < lost_at]
    [dead] = [p["replica_id"] for p in before[-1]["participants"] if p["replica_id"] != first_id]
    alone_row = next(r for r in rows.values() if r["offset"] >= lost_at)
    assert [p["replica_id"] for p in alone_row["participants"]] == [first_id]
    [gone] = [v for v in alone_row["verdicts"] if v["replica_id"] == dead]
    assert not gone["included"] and f"reported it dead at offset {lost_at}" in gone["why"]
    result = replay(lighthouse.db)
    assert result.returncode == 0, result.stdout + result.stderr
    lighthouse.cleanup()


def quorum_rows_from(lighthouse: FoldplaneLighthouse) -> list[dict[str, Any]]:
    """The quorum rows of a stopped coordinator's log, read back by a fresh one."""
    lighthouse.server.start()
    try:
        return quorum_rows(lighthouse.server.url)
    finally:
        lighthouse.server.stop()


@pytest.mark.postgres
def test_quorums_go_on_through_the_death_of_the_coordinator_leader(
    nodes: Callable[..., Node], schema: str, tmp_path: Path, job_store: str
) -> None:
    from tests.conftest import free_port

    ports = {name: free_port() for name in ("c1", "c2")}

    def coordinator(name: str) -> Node:
        return nodes(
            "--lighthouse-port", str(ports[name]), "--lighthouse-min-replicas", "1",
            "--advertise", "http://127.0.0.1:PORT",
        )  # fmt: skip

    c1 = coordinator("c1")
    c1.args[-1] = c1.url
    c1.start().wait_role("leader")
    c2 = coordinator("c2")
    c2.args[-1] = c2.url
    c2.start().wait_role("standby")
    # the replica groups know the standby's lighthouse: it carries their calls to the leader
    job = Replicas(f"http://127.0.0.1:{ports['c2']}", job_store, tmp_path, step_s=0.05)
    try:
        pids = {r: job.start(r).pid for r in (0, 1)}
        for r in (0, 1):
            job.until(together(job, r, 5), 300, f"train{r} to train with both")
        before = max(ln["quorum_id"] for ln in job.lines)
        step_at_kill = max(ln["step"] for ln in job.lines)
        killed_at = time.time()
        c1.kill()
        c2.wait_role("leader", timeout=30)
        for r in (0, 1):
            job.until(together(job, r, step_at_kill + 10), 300, f"train{r} to go on")
        # no replica group restarted, healed or left a quorum (one may have healed when it
        # first joined the other, before the kill)
        assert job.started == {0: [pids[0]], 1: [pids[1]]}
        assert all(p.poll() is None for p in job.procs.values())
        assert not any(ln["healing"] for ln in job.lines if ln["t"] > killed_at)
        assert all(ln["participants"] == 2 for ln in job.lines if ln["t"] > killed_at)
        after = [ln["quorum_id"] for ln in job.lines if ln["step"] > step_at_kill + 5]
        assert min(after) >= before  # the quorum id never goes back
        rows = quorum_rows(c2.url)
    finally:
        job.close()
    assert sorted(r["quorum_id"] for r in rows) == list(range(1, len(rows) + 1))
    terms = asyncio.run(fetch(schema, "SELECT DISTINCT term FROM log ORDER BY term"))
    assert len(terms) >= 2  # records of both leaders
    c2.stop()
    result = subprocess.run(
        [sys.executable, "-m", "foldplane.coordinator", "replay", schema_url(schema)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
