"""Real ``torchrun --rdzv-backend foldplane`` against a real coordinator: two torchrun nodes of
two workers each, ``examples/train_torchrun.py`` unchanged (``init_process_group("gloo")``,
torch's DDP, a checkpoint each step), through a worker's SIGKILL and through the death of the
coordinator leader (PostgreSQL, two coordinators in ``--rdzv-endpoint``). Afterwards the log
holds every round, join and restart, the story tells them, and ``replay`` re-derives them byte
for byte. Slow: each job starts eight Python processes that import torch."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from foldplane.benchmarks.kit.torchrun import TorchrunJob
from tests.conftest import PG_URL
from tests.service.conftest import ROOT, make_server

pytestmark = pytest.mark.slow

TOKEN = "torchrun-token"
CONF = {"last_call_timeout": "1", "join_timeout": "300"}
#: At least both nodes in every round (so the first one cannot form, on a loaded machine,
#: before the second node's torchrun has started), at most four.
NNODES = "2:4"
STEPS = 60


def _get(url: str, path: str) -> dict[str, Any]:
    r = httpx.get(url + path, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def _finish(run: TorchrunJob) -> None:
    """Both nodes end with 0 once the workers reached STEPS; the steps went on from the
    checkpoint, so training went on through the kill."""
    try:
        codes = run.wait(timeout=400)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"torchrun did not finish:\n{run.tails()}") from None
    assert codes == [0, 0], run.tails()

    def last() -> dict[int, int]:
        return {x["rank"]: x["step"] for x in run.lines.seen if x.get("world") == run.world}

    try:
        run.lines.wait_for(lambda: last() == dict.fromkeys(range(run.world), STEPS), 30, "the end")
    except TimeoutError as exc:  # torchrun's logs say which worker failed and why it restarted
        raise AssertionError(f"{exc}\nlast step by rank: {last()}\n{run.tails()}") from None


def _kill_and_train_again(run: TorchrunJob) -> None:
    run.trained(3, timeout=400)
    killed_at = run.kill_worker(3)
    run.trained_again(killed_at, timeout=300)
    run.lines.drain()
    old = {x["pid"] for x in run.lines.seen if x["t"] <= killed_at}
    new = [x for x in run.lines.seen if x["pid"] not in old]
    # the killed worker's node restarted its workers: torchrun counts it
    assert any(x["restart"] >= 1 for x in new), new[:8]
    # they resumed from rank 0's checkpoint: the steps go on, they do not start over
    reached = max(x["step"] for x in run.lines.seen if x["pid"] in old)
    first = min(x["step"] for x in new)
    assert 1 < first <= reached + 1, (first, reached)


def _replay(db: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "foldplane.coordinator", "replay", db, "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert json.loads(done.stdout)["ok"] is True


def test_torchrun_restarts_the_round_after_a_worker_is_killed_and_training_goes_on(
    tmp_path: Path,
) -> None:
    server = make_server(tmp_path, env={"FOLDPLANE_TOKEN": TOKEN, "FOLDPLANE_SECRET": ""})
    server.start()
    try:
        with TorchrunJob(
            backend="foldplane", endpoint=server.url, job="train-kill", conf=CONF, nnodes=NNODES,
            env={"FOLDPLANE_TOKEN": TOKEN}, script_args=("--steps", str(STEPS), "--step-pause", "0.2"),
        ) as run:  # fmt: skip
            run.start()
            _kill_and_train_again(run)
            _finish(run)
        status = _get(server.url, "/rendezvous/train-kill")
        assert status["round"] == 2 and status["closed"] is not None
        rounds = _get(server.url, "/rendezvous/train-kill/rounds")["rounds"]
        assert [r["round"] for r in rounds] == [1, 2]
        assert [r["world_size"] for r in rounds] == [4, 4]
        assert "every live node of round 1 is back" in rounds[1]["reason"]
        story = _get(server.url, "/rendezvous/train-kill/story")
        joined = [e for e in story["entries"] if e["event"] == "joined"]
        assert [e["cause"] for e in joined[:2]] == ["first", "first"] and len(joined) == 4
        # the victim's node restarts after its workers failed; the other one sees it waiting,
        # or its own workers fail first (the dead peer ends their all-reduce)
        failed = [e for e in joined[2:] if e["cause"] == "workers_failed"]
        assert failed and all(e["restart_count"] == 1 for e in failed)
        assert {e["cause"] for e in joined[2:]} <= {"workers_failed", "nodes_waiting"}
        assert [e["event"] for e in story["entries"]][-1] == "closed"
    finally:
        server.stop()
    _replay(str(server.db))


@pytest.mark.postgres
def test_the_next_round_forms_on_the_new_leader_after_the_leader_is_killed(
    nodes: Callable[..., Any], schema: str
) -> None:
    from tests.ha.cluster import replay

    first, second = nodes(), nodes()
    first.start()
    first.wait_role("leader", 60)
    second.start()
    second.wait_role("standby", 60)
    endpoint = f"{first.url},{second.url}"
    with TorchrunJob(
        backend="foldplane", endpoint=endpoint, job="train-ha", conf=CONF, nnodes=NNODES,
        script_args=("--steps", str(STEPS), "--step-pause", "0.2"),
    ) as run:  # fmt: skip
        run.start()
        run.trained(3, timeout=400)
        assert first.get("/rendezvous/train-ha")["round"] == 1
        first.kill()  # the leader dies while the job trains
        second.wait_role("leader", 30)
        _kill_and_train_again(run)
        _finish(run)
    rounds = second.get("/rendezvous/train-ha/rounds")["rounds"]
    assert [r["round"] for r in rounds] == [1, 2]  # no round lost
    terms = {e["offset"]: e["term"] for e in second.events()}
    assert terms[rounds[1]["offset"]] > terms[rounds[0]["offset"]]  # round 2: the new leader's
    assert second.get("/rendezvous/train-ha")["closed"] is not None
    lost = [e for e in second.get("/rendezvous/train-ha/story")["entries"] if e["event"] == "lost"]
    assert lost == []  # the failover restarted the nodes' clocks: nobody was lost for it
    done = replay(schema)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


@pytest.fixture
def nodes(tmp_path: Path, schema: str) -> Any:
    from tests.ha.cluster import Node

    made: list[Any] = []

    def make(*args: str) -> Any:
        node = Node(schema, tmp_path / f"coordinator-{len(made)}.log", args=list(args))
        made.append(node)
        return node

    yield make
    for node in made:
        node.stop()


@pytest.fixture
def schema() -> Any:
    import asyncio

    from tests.ha.cluster import drop_schema, new_schema

    assert PG_URL
    name = new_schema()
    yield name
    asyncio.run(drop_schema(name))
