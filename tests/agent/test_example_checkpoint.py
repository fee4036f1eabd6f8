"""``examples/train_ddp.py --checkpoint``: who saves survives a death. Three workers started
without the launcher (as torchrun or a scheduler would start them); rank 0, the group's
checkpoint rank, SIGKILLs itself mid-epoch; its death ends its heartbeats, the next view names
rank 1 the checkpoint rank, and rank 1 (only) saves the model at the end. The survivors exit 0.

When that death spends the failure budget, the group's ``shutdown_with_save`` names rank 1,
reaches it first, and rank 1 saves the model at the shutdown: the state of the last step every
member committed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from tests.agent.conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _train(coordinator, group: str, checkpoint, dataset_size: int) -> list[subprocess.Popen]:
    """Ranks 0-2 of ``examples/train_ddp.py``, one epoch; rank 0 dies at step 4."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FOLDPLANE_")}
    env |= {"FOLDPLANE_COORDINATOR": coordinator.url, "FOLDPLANE_GROUP": group}
    return [
        subprocess.Popen(
            [
                sys.executable,
                "examples/train_ddp.py",
                "--epochs",
                "1",
                "--max-epochs",
                "1",
                "--dataset-size",
                str(dataset_size),
                "--workers",
                "0",
                "--kill-rank",
                "0",
                "--kill-at",
                "4",
                "--checkpoint",
                str(checkpoint),
            ],
            cwd=ROOT,
            env={**env, "FOLDPLANE_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(3)
    ]


def _outputs(workers: list[subprocess.Popen]) -> list[str]:
    """Each worker's output once it exited; one still running at the deadline is killed (the
    test fails on the timeout and leaves no process behind)."""
    try:
        return [w.communicate(timeout=240)[0] for w in workers]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()


def test_the_checkpoint_is_saved_by_the_lowest_live_rank_after_rank_0_dies(coordinator, tmp_path):
    coordinator.create_group("ckpt", 3)
    checkpoint = tmp_path / "model.pt"
    workers = _train(coordinator, "ckpt", checkpoint, 512)
    outs = _outputs(workers)
    assert [w.returncode for w in workers] == [-9, 0, 0], outs
    assert coordinator.history("ckpt")[0]["checkpoint_rank"] == 0
    last = coordinator.view("ckpt")
    assert (last["active_ranks"], last["checkpoint_rank"]) == ([1, 2], 1)
    assert "rank 1: saved the checkpoint" in outs[1], outs[1]
    assert "saved the checkpoint" not in outs[0] + outs[2], outs
    state = torch.load(checkpoint)
    assert state["steps"] > 4 and "body.0.weight" in state["model"]


def test_at_a_shutdown_the_failover_checkpoint_rank_saves_the_last_committed_step(
    coordinator, tmp_path
):
    """Rank 0's death spends the budget (``max_failure`` 1). Without auto-deactivation no view
    follows the one that failed, so the survivors' step on it can only end with the shutdown:
    they stop there (the data plane waits for no other view), and rank 1, which the directive
    names, saves the 4 steps every member committed; the epoch (64 steps) is not finished."""
    coordinator.create_group("ckpt-shut", 3, max_failure=1, auto_deactivate_on_failure=False)
    checkpoint = tmp_path / "model.pt"
    workers = _train(coordinator, "ckpt-shut", checkpoint, 6144)
    outs = _outputs(workers)
    assert [w.returncode for w in workers] == [-9, 0, 0], outs
    for rank in (1, 2):
        directive = f"rank {rank}: shutdown_with_save (max_failure_exceeded); checkpoint rank 1"
        assert directive in outs[rank], outs[rank]
    assert coordinator.status("ckpt-shut")["shutdown"] == "max_failure_exceeded"
    assert "rank 1: saved the checkpoint" in outs[1], outs[1]
    assert "saved the checkpoint" not in outs[0] + outs[2], outs
    state = torch.load(checkpoint)
    assert state["steps"] == 4 and "body.0.weight" in state["model"]
