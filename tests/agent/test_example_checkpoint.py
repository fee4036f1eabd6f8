"""``examples/train_ddp.py --checkpoint``: who saves survives a death. Three workers started
without the launcher (as torchrun or a scheduler would start them); rank 0, the group's
checkpoint rank, SIGKILLs itself mid-epoch; its death ends its heartbeats, the next view names
rank 1 the checkpoint rank, and rank 1 (only) saves the model at the end. The survivors exit 0."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from tests.agent.conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_the_checkpoint_is_saved_by_the_lowest_live_rank_after_rank_0_dies(coordinator, tmp_path):
    coordinator.create_group("ckpt", 3)
    checkpoint = tmp_path / "model.pt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FOLDPLANE_")}
    env |= {"FOLDPLANE_COORDINATOR": coordinator.url, "FOLDPLANE_GROUP": "ckpt"}
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "examples/train_ddp.py",
                "--epochs",
                "1",
                "--max-epochs",
                "1",
                "--dataset-size",
                "512",
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
    outs = [w.communicate(timeout=240)[0] for w in workers]
    assert [w.returncode for w in workers] == [-9, 0, 0], outs
    assert coordinator.history("ckpt")[0]["checkpoint_rank"] == 0
    last = coordinator.view("ckpt")
    assert (last["active_ranks"], last["checkpoint_rank"]) == ([1, 2], 1)
    assert "rank 1: saved the checkpoint" in outs[1], outs[1]
    assert "saved the checkpoint" not in outs[0] + outs[2], outs
    state = torch.load(checkpoint)
    assert state["steps"] > 4 and "body.0.weight" in state["model"]
