"""``python -m coordinator replay`` against a log written by a real server.

Replay folds the file from scratch; what it prints must equal ``GET /views/history``, and any
difference between the stored projections and the fold is a divergence with a non-zero exit.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest

from foldplane.agent.simhost import SimulatedCluster
from foldplane.eventlog import ProjectionRow, open_log
from tests.service.conftest import FAST, Server, make_server, replay


@pytest.fixture(scope="module")
def history_server(tmp_path_factory) -> Iterator[tuple[Server, str, list[dict]]]:
    """A server whose group ``train`` went through formation, a deactivation and an activation.

    Shared by the module; the tests run in file order (read, restart, then tamper).
    """
    srv = make_server(tmp_path_factory.mktemp("history")).start()
    try:
        yield srv, "train", asyncio.run(_make_history(srv))
    finally:
        srv.stop()


async def _make_history(srv: Server) -> list[dict]:
    async with httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
        # a long heartbeat timeout: the history must not move once the agents stop
        calm = {**FAST, "heartbeat_timeout_s": 600.0}
        r = await client.post("/groups", json={"group": "train", "world_size": 3, **calm})
        assert r.status_code == 201
        other = await client.post("/groups", json={"group": "other", "world_size": 1, **FAST})
        assert other.status_code == 201
        sim = SimulatedCluster(("127.0.0.1", srv.port), "train", 3, heartbeat_interval_s=0.25)
        await sim.start()
        try:
            await sim.wait_until(lambda: sim.all_on(1), 20)
            for version, op in ((2, "deactivate"), (3, "activate")):
                r = await client.post(
                    "/proposals",
                    params={"wait": 15},
                    json={"group": "train", "op": op, "ranks": [2]},
                )
                assert r.json()["status"] == "applied", r.text
                await sim.wait_until(lambda v=version: sim.all_on(v), 20)
        finally:
            await sim.stop()
        return (await client.get("/views/history", params={"group": "train"})).json()["views"]


async def test_replay_prints_exactly_the_served_history(history_server):
    srv, group, views = history_server
    assert [v["version"] for v in views] == [1, 2, 3]
    done = replay(srv.db, "--json", "--group", group)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] and report["divergences"] == []
    assert report["views"] == views

    table = replay(srv.db)
    assert table.returncode == 0
    lines = table.stdout.splitlines()
    assert lines[0].split()[:3] == ["group", "version", "active_ranks"]
    assert sum(1 for line in lines if line.startswith("train ")) == 3
    assert "OK: replay matches" in table.stdout

    until = replay(srv.db, "--json", "--until", str(views[1]["offset"]), "--group", group)
    assert until.returncode == 0, until.stdout
    assert json.loads(until.stdout)["views"] == views[:2]

    nothing = json.loads(replay(srv.db, "--json", "--group", "other").stdout)
    assert nothing["views"] == [] and nothing["ok"]

    bar = replay(srv.db, "--progress", "always")
    assert "replay [" in bar.stderr and "records" in bar.stderr


async def test_a_restarted_server_serves_the_same_history_and_replay_agrees(history_server):
    srv, group, views = history_server
    assert srv.stop() == 0  # a graceful stop: the host writes its final snapshot
    srv.start()
    async with httpx.AsyncClient(base_url=srv.url) as client:
        again = (await client.get("/views/history", params={"group": group})).json()["views"]
        health = (await client.get("/healthz")).json()
    assert again == views
    assert health["fold_offset"] == health["head"]
    assert replay(srv.db).returncode == 0


async def test_replay_reports_a_tampered_projection_and_exits_non_zero(history_server):
    srv, group, views = history_server
    assert srv.stop() == 0
    log = await open_log(str(srv.db))
    try:
        projected = await log.get_consumer_offset("coordinator")
        forged = {**views[1], "active_ranks": [0, 1, 2]}
        await log.write_projections(
            [ProjectionRow("view", group, 2, forged)], consumer="coordinator", offset=projected
        )
    finally:
        await log.close()
    done = replay(srv.db)
    assert done.returncode == 1
    assert f"view {group}/2 differs: active_ranks: stored [0, 1, 2], replayed [0, 1]" in done.stdout
    report = json.loads(replay(srv.db, "--json").stdout)
    assert not report["ok"] and len(report["divergences"]) == 1


def test_replay_of_a_missing_or_foreign_file_fails_clearly(tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database" * 100)
    done = replay(junk)
    assert done.returncode == 2
    assert "cannot read" in done.stderr


def test_replay_of_a_log_with_a_refit_re_derives_its_row(tmp_path):
    """A refit's own row has seq 0 (one a refit), like a group's: replay reads it too."""
    srv = make_server(tmp_path).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as client:
            for group, size in (("train", 2), ("gen", 4)):
                r = client.post("/groups", json={"group": group, "world_size": size, **FAST})
                assert r.status_code == 201, r.text
            refit = {
                "refit": "rl",
                "publisher": "train",
                "subscriber": "gen",
                "publisher_slots": 2,
                "subscriber_slots": 4,
            }
            assert client.post("/refits", json=refit).status_code == 201
    finally:
        assert srv.stop() == 0
    done = replay(srv.db)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK: replay matches" in done.stdout
