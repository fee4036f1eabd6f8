"""Groups over time, with a real coordinator and real clients: a wrong address or group name
fails in seconds with what was tried, another HTTP server is named as such, a group's run can
be ended and deleted (API and CLI) while its history stays, and the launcher refuses at once
to start a group whose run is over."""

from __future__ import annotations

import http.server
import logging
import re
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from foldplane.agent import Agent
from foldplane.agent.client import DEFAULT_START_TIMEOUT_S, CoordinatorClient
from foldplane.agent.launch import prepare_group
from tests.agent.conftest import ROOT, Coordinator
from tests.conftest import free_port

pytestmark = pytest.mark.timeout(120)


def test_the_default_start_timeout_fails_a_wrong_address_within_ten_seconds():
    assert DEFAULT_START_TIMEOUT_S <= 10.0


def test_a_wrong_address_fails_naming_it_and_logs_while_it_waits(caplog):
    url = f"http://127.0.0.1:{free_port()}"
    caplog.set_level(logging.WARNING, logger="foldplane.agent")
    with pytest.raises(RuntimeError) as err:
        Agent(url, group="train", rank=0).start(timeout_s=2.5)
    message = str(err.value)
    assert f"no foldplane coordinator at {url}" in message and "after 2.5 s" in message
    assert "FOLDPLANE_START_TIMEOUT_S" in message
    waits = [r.getMessage() for r in caplog.records if "waiting for group" in r.getMessage()]
    assert waits and url in waits[0] and "'train'" in waits[0]
    assert len(waits) <= 2  # once in a while, not once per retry


def test_another_http_server_is_named_at_once_without_its_page(tmp_path: Path):
    (tmp_path / "index.html").write_text("<!DOCTYPE HTML><html>not foldplane</html>")
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(  # noqa: E731
        *a, directory=str(tmp_path)
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(RuntimeError) as err:
            Agent(url, group="train", rank=0).start(timeout_s=30)
    finally:
        server.shutdown()
        server.server_close()
    message = str(err.value)
    assert f"no foldplane coordinator at {url}" in message, message
    assert "answered HTTP 404 with text/html" in message and "DOCTYPE" not in message


def test_a_wrong_group_name_lists_the_groups_there(coordinator: Coordinator):
    coordinator.create_group("train", 2)
    coordinator.create_group("eval", 1)
    listed = httpx.get(coordinator.url + "/groups").json()["groups"]
    assert [(g["group"], g["world_size"], g["ended"]) for g in listed] == [
        ("eval", 1, None),
        ("train", 2, None),
    ]
    with pytest.raises(RuntimeError) as err:
        Agent(coordinator.url, group="trian", rank=0).start(timeout_s=1.0)
    assert f"no group 'trian' at {coordinator.url} (groups: eval, train)" in str(err.value)


def test_init_process_group_does_not_hand_torchs_timeout_to_the_start(
    coordinator: Coordinator, monkeypatch
):
    from foldplane.agent.dataplane import c10d

    monkeypatch.setenv("FOLDPLANE_COORDINATOR", coordinator.url)
    monkeypatch.setenv("FOLDPLANE_GROUP", "missing")
    monkeypatch.setenv("FOLDPLANE_RANK", "0")
    monkeypatch.setenv("FOLDPLANE_START_TIMEOUT_S", "1")
    monkeypatch.setattr(c10d, "_env_agent", None)
    with pytest.raises(RuntimeError, match=r"no group 'missing' .* after 1 s"):
        c10d.environment_agent(timedelta(minutes=30))


def test_ending_a_running_group_stops_its_ranks_and_keeps_its_history(coordinator: Coordinator):
    coordinator.create_group("run", 2)
    said: list[tuple[str, str]] = []
    pair = [
        Agent(coordinator.url, group="run", rank=r, heartbeat_interval_s=0.2,
              on_shutdown_with_save=lambda reason, detail: said.append((reason, detail)))
        .start()
        for r in (0, 1)
    ]  # fmt: skip
    try:
        for a in pair:
            a.wait_for_view(timeout=60)
        coordinator.client.request(
            "POST",
            "/agents/deaths",
            json={"group": "run", "rank": 1, "incarnation": pair[1].incarnation},
        )
        pair[0].wait_for_view(2, timeout=60)
        ended = coordinator.client.request("POST", "/groups/run/end", json={"reason": "rerun"})
        assert ended["ended"] == {"reason": "rerun", "offset": ended["ended"]["offset"],
                                  "deleted": False, "finished": False}  # fmt: skip
        assert ended["rank_counts"]["OFFLINE"] == 2 and ended["shutdown"] == "ended"
        again = httpx.post(coordinator.url + "/groups/run/end", json={})
        assert again.status_code == 200  # ending again: the same answer, nothing appended
        for a in pair:
            with pytest.raises(Exception):  # noqa: B017 - the agent stops, whatever it raises
                a.wait_for_view(lambda v: False, timeout=30)
        assert ("ended", "rerun") in said
    finally:
        for a in pair:
            a.close()
    with pytest.raises(RuntimeError, match=r"group 'run' at .* was ended at offset \d+ \(rerun\)"):
        Agent(coordinator.url, group="run", rank=0).start()  # at once, not at its first wait
    refused = httpx.post(coordinator.url + "/groups", json={"group": "run", "world_size": 2})
    assert refused.status_code == 409 and refused.json()["error"] == "group_ended"
    assert "another group name" in refused.json()["detail"]
    plain = httpx.post(coordinator.url + "/groups/run/end", content=b"{}")
    assert plain.status_code == 415  # a page cannot end a group without a CORS preflight
    assert [v["version"] for v in coordinator.history("run")] == [1, 2]
    # the operator reads each decision in one line of the coordinator's log (written as the
    # server decides, which may come after its answer)
    assert coordinator.output.wait_for("group run ended", 30), coordinator.log_path.read_text()
    lines = [line for line in coordinator.log_path.read_text().splitlines() if "group run" in line]
    wanted = [
        r"group run view 1 committed at \S+Z: active \[0, 1\] \(formation",
        r"group run rank 1 lost: death reported",
        r"group run view 2 committed at \S+Z: active \[0\] \(auto_deactivation",
        r"group run ended: rerun",
    ]
    at = [next((i for i, line in enumerate(lines) if re.search(w, line)), None) for w in wanted]
    assert None not in at and at == sorted(at), lines
    assert not any("rank 0 lost" in line for line in lines), lines  # an ended run's ranks left


def test_httpx_lines_of_our_requests_are_dropped_and_others_kept(
    coordinator: Coordinator, tmp_path: Path, caplog
):
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(  # noqa: E731
        *a, directory=str(tmp_path)
    )
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    caplog.set_level(logging.INFO, logger="httpx")
    try:
        CoordinatorClient(coordinator.url).healthz()
        httpx.get(f"http://127.0.0.1:{other.server_address[1]}/")
    finally:
        other.shutdown()
        other.server_close()
    said = [r.getMessage() for r in caplog.records if r.name == "httpx"]
    assert not any(coordinator.url in m for m in said), said
    assert any(str(other.server_address[1]) in m for m in said), said


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "foldplane.coordinator", "group", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_the_cli_lists_ends_and_deletes_groups(coordinator: Coordinator):
    coordinator.create_group("a", 1)
    coordinator.create_group("b", 2)
    url = ["--coordinator", coordinator.url]
    listed = cli("list", *url)
    assert listed.returncode == 0 and "a: forming; 1 ranks: 1 never joined" in listed.stdout
    ended = cli("end", "a", "--reason", "done", *url)
    assert ended.returncode == 0, ended
    assert ended.stdout.strip() == "group 'a' ended (done); 1 ranks: 1 never joined", ended
    deleted = cli("delete", "b", *url)
    assert deleted.returncode == 0, deleted
    deleted_text = "group 'b' deleted (deleted by the operator); 2 ranks: 2 never joined"
    assert deleted.stdout.strip() == deleted_text, deleted
    listed = cli("list", *url)
    assert "a: ended (done); 1 ranks" in listed.stdout and "b:" not in listed.stdout, listed
    # deleted, its history stays readable
    assert httpx.get(coordinator.url + "/groups/b").json()["ended"]["deleted"] is True
    missing = cli("end", "nope", *url)
    assert missing.returncode == 1 and "unknown_group" in missing.stderr, missing
    down = cli("list", "--coordinator", f"http://127.0.0.1:{free_port()}")
    assert down.returncode == 2 and "no foldplane coordinator at" in down.stderr, down


def test_the_launcher_refuses_a_group_whose_run_is_over_and_says_what_to_do(
    coordinator: Coordinator,
):
    client = CoordinatorClient(coordinator.url)
    client.create_group("train", 2)  # the launcher's own configuration: the defaults
    try:
        assert prepare_group(client, "train", 2, timeout_s=5) is None  # forming: join it
        client.request("POST", "/groups/train/end", json={})
        refused = prepare_group(client, "train", 2, timeout_s=5)
        assert refused is not None and "'train' ended (" in refused and "another --group" in refused
        missing = prepare_group(client, "nope", None, timeout_s=0.5)
        assert missing is not None and "no group 'nope'" in missing and "(groups: train)" in missing
        assert prepare_group(client, "fresh", 2, timeout_s=5) is None
        assert client.group("fresh")["config"]["world_size"] == 2
    finally:
        client.close()
    run = subprocess.run(
        [sys.executable, "-m", "foldplane.agent.launch", "--coordinator", coordinator.url, "--group",
         "train", "--world-size", "2", "--nproc", "2", "examples/train_ddp.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 2 and "'train' ended (" in run.stderr, run
