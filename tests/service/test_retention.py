"""Retention on a real server: ``serve --retain`` compacts while agents heartbeat, and every
surface still answers for the whole life of the group.

A real ``python -m coordinator serve`` on a SQLite file, agents speaking the wire protocol;
``--retain 20`` keeps the last 20 records of the heartbeat class and compacts every second.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import httpx

from foldplane.agent.simhost import SimulatedCluster
from foldplane.eventlog import ProjectionRow, open_log
from tests.service.conftest import FAST, ROOT, make_server, replay


async def _removed(client: httpx.AsyncClient) -> list[dict]:
    return (await client.get("/events", params={"after": 0, "limit": 1000})).json()["removed"]


async def test_serve_retain_compacts_while_the_group_lives_and_nothing_is_lost(tmp_path):
    args = ["--retain", "20", "--retain-every", "1", "--snapshot-every", "50"]
    args += ["--heartbeat-flush-s", "0.01"]  # many heartbeat records in a short run
    srv = make_server(tmp_path, args=args).start()
    try:
        async with httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
            calm = {**FAST, "heartbeat_timeout_s": 600.0}
            r = await client.post("/groups", json={"group": "train", "world_size": 3, **calm})
            assert r.status_code == 201
            sim = SimulatedCluster(
                ("127.0.0.1", srv.port), "train", 3, ranks_per_host=3, heartbeat_interval_s=0.05
            )
            await sim.start()
            try:
                await sim.wait_until(lambda: sim.all_on(1), timeout=20)
                r = await client.post(
                    "/proposals",
                    params={"wait": 15},
                    json={"group": "train", "op": "deactivate", "ranks": [2]},
                )
                assert r.json()["status"] == "applied", r.text
                # The server (another process) removes on its own retention schedule and
                # announces nothing: the history is read every 100 ms, 300 times at most.
                for _ in range(300):
                    if await _removed(client):
                        break
                    await asyncio.sleep(0.1)
                removed = await _removed(client)
                assert removed, "the coordinator removed nothing: " + srv.output()[-2000:]
            finally:
                await sim.stop()
            history = (await client.get("/views/history", params={"group": "train"})).json()
            assert [v["version"] for v in history["views"]] == [1, 2]
            proposal = (await client.get(f"/proposals/{r.json()['id']}")).json()
            assert proposal["status"] == "applied"
            # the audit page names what is missing among the offsets it covers
            page = (await client.get("/events", params={"after": 0, "limit": 1000})).json()
            offsets = [e["offset"] for e in page["events"]]
            missing = set(range(1, offsets[-1] + 1)) - set(offsets)
            in_ranges = {
                o
                for r in page["removed"]
                for o in range(r["first"], r["last"] + 1)
                if o not in offsets
            }
            assert missing <= in_ranges and missing
            kinds = {e["kind"] for e in page["events"]}
            assert {"group_created", "join", "proposal", "ack"} <= kinds
            first = page["removed"][0]
            narrow = (
                await client.get("/events", params={"after": first["last"], "limit": 1})
            ).json()
            assert all(r["last"] > first["last"] for r in narrow["removed"])
    finally:
        assert srv.stop() == 0

    done = replay(srv.db, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] and report["start"]["snapshot"] is not None
    assert report["start"]["removed"] > 0
    assert [v for v in report["views"] if v["group"] == "train"] == history["views"]
    assert "starting from the kept snapshot at offset" in done.stderr
    assert "verified" in done.stderr

    refused = replay(srv.db, "--from-start")
    assert refused.returncode == 2
    assert "cannot be folded from offset 1" in refused.stderr
    assert f"{first['first']}-{first['last']}" in refused.stderr


def compact(db, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "foldplane.coordinator", "compact", str(db), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_compact_refuses_to_remove_anything_from_a_log_whose_fold_diverges(tmp_path):
    srv = make_server(tmp_path, args=["--heartbeat-flush-s", "0"]).start()
    try:
        async with httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
            calm = {**FAST, "heartbeat_timeout_s": 600.0}
            await client.post("/groups", json={"group": "train", "world_size": 2, **calm})
            sim = SimulatedCluster(
                ("127.0.0.1", srv.port), "train", 2, ranks_per_host=2, heartbeat_interval_s=0.02
            )
            await sim.start()
            try:
                await sim.wait_until(lambda: sim.all_on(1), timeout=20)
                # The agents beat on their own (real) schedule: the log is read every 20 ms,
                # until 40 heartbeat records, 400 times at most.
                for _ in range(400):
                    page = await client.get("/events", params={"kind": "heartbeat", "limit": 100})
                    if len(page.json()["events"]) >= 40:
                        break
                    await asyncio.sleep(0.02)
            finally:
                await sim.stop()
            views = (await client.get("/views/history", params={"group": "train"})).json()
    finally:
        assert srv.stop() == 0
    log = await open_log(str(srv.db))
    try:
        head = await log.head()
        projected = await log.get_consumer_offset("coordinator")
        true_view = views["views"][0]
        forged = {**true_view, "active_ranks": [0]}
        await log.write_projections(
            [ProjectionRow("view", "train", 1, forged)], consumer="coordinator", offset=projected
        )
    finally:
        await log.close()

    bad = compact(srv.db)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "view train/1 differs: active_ranks: stored [0], replayed [0, 1]" in bad.stdout
    assert "nothing was removed" in bad.stdout
    log = await open_log(str(srv.db))
    try:
        assert len(await log.read(0, 10_000)) == head and await log.removed_ranges() == []
        await log.write_projections(
            [ProjectionRow("view", "train", 1, true_view)], consumer="coordinator", offset=projected
        )
    finally:
        await log.close()

    assert compact(srv.db, "--retain", "soon").returncode == 2
    good = compact(srv.db, "--json")
    assert good.returncode == 0, good.stdout + good.stderr
    report = json.loads(good.stdout)
    assert report["ok"] and report["removed"] >= 40 and report["steps"]
    assert report["bytes_after"] <= report["bytes_before"]
    assert replay(srv.db).returncode == 0


def test_serve_refuses_a_retention_policy_it_does_not_understand(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "foldplane.coordinator", "serve", "--db", str(tmp_path / "log.db")]
        + ["--retain", "a week"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--retain: retention policy 'a week' is neither a record count" in done.stderr
    assert not (tmp_path / "log.db").exists()  # refused before anything was opened
