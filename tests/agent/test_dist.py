"""``torch.distributed`` on the registered ``"foldplane"`` backend: real coordinator, real
gloo worker processes started by the launcher, each calling ``dist.init_process_group
("foldplane")`` with nothing but the launcher's ``FOLDPLANE_*`` environment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

DIST_WORKER = Path(__file__).with_name("dist_worker.py")
ROOT = Path(__file__).resolve().parents[2]
ALL = [0, 1, 2]

pytestmark = pytest.mark.timeout(240)


def started(w) -> None:
    for r in ALL:
        got = w.expect(r, "started")
        assert got["world_size"] == 3 and got["group_type"] == "ElasticProcessGroup", got


@pytest.mark.slow
def test_init_process_group_foldplane_and_every_dist_collective(workers):
    w = workers("dist", 3, script=DIST_WORKER)
    started(w)
    res = w.ask(ALL, "collectives", "collectives")
    for r, got in res.items():
        assert got["rank"] == r and got["world_size"] == 3 and got["backend"] == "foldplane"
        assert got["all_reduce"] == [6.0] * 3, got
        assert got["all_reduce_max"] == [3.0] * 2
        assert got["broadcast"] == [20.0, 20.0]
        assert got["all_gather"] == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]
        assert got["all_gather_into_tensor"] == [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]
        # input of rank q is arange(6) + q; rank r gets slot r summed over q = 0, 1, 2
        assert got["reduce_scatter_tensor"] == [6.0 * r + 3, 6.0 * r + 6]
        assert got["reduce_scatter"] == [float(3 * r + 3)]
        assert got["async_type"] == "Work" and got["async_ok"] is True
        assert got["group_name_set"] is True
        # A one-dimensional DeviceMesh over the group, and functional collectives on it.
        assert got["mesh"] == [3, r] and got["funcol_all_reduce"] == [6.0, 6.0], got
    assert res[1]["recv"] == [42.0, 42.0]
    # dist.split_group: torch refuses it before the group is reached unless the default group
    # is bound to a device; a plain gloo default group gets the very same answer.
    gloo = _gloo_split_group_outcome()
    assert gloo.startswith("RuntimeError: No device associated with the default pg"), gloo
    assert {got["split_group"] for got in res.values()} == {gloo}


def _gloo_split_group_outcome() -> str:
    """``dist.split_group`` on a one-process gloo default group, in a process of its own."""
    code = (
        "import torch.distributed as dist\n"
        "from tests.agent.dist_worker import split_group_outcome\n"
        "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
        "print(split_group_outcome())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_a_failed_sync_collective_raises_naming_the_rank_and_an_async_one_returns_a_hint(workers):
    w = workers("distfail", 3, script=DIST_WORKER)
    started(w)
    assert all(
        r["all_reduce"] == [6.0] * 3 for r in w.ask(ALL, "collectives", "collectives").values()
    )
    w.send([0, 1], "sync_all_reduce")
    for r in (0, 1):
        w.expect(r, "issued")
    w.launcher.kill(2)
    assert w.exits.get(timeout=30).returncode == -9
    for r in (0, 1):
        got = w.expect(r, "sync_all_reduce")
        assert got["raised"] == "PeerFailure" and got["is_runtime_error"], got
        assert got["failed"] == [2] and "rank(s) [2] failed" in got["message"], got
    # Until the next view, later operations fail fast, the async form reports through the hint.
    # Then the next view (without rank 2) runs the same snippet successfully.
    w.ask([0, 1], "wait_view", "view", active=[0, 1])
    after = w.ask([0, 1], "async_all_reduce", "async_all_reduce")
    for got in after.values():
        assert got["ok"] is True and got["hint"] == [0, 0, 0], got
    assert all(p.poll() is None for p in (w.launcher.worker(r).process for r in (0, 1)))
