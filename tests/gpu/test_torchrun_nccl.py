"""``torchrun --rdzv-backend foldplane`` with ``init_process_group("nccl")`` on a GPU machine:
``examples/train_torchrun.py`` unchanged (it picks nccl where a GPU is seen), one worker per
GPU, the last one SIGKILLed; torchrun restarts the round and NCCL training goes on from the
checkpoint. Skipped where torch sees no GPU (tests/gpu/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import torch

from foldplane.benchmarks.kit.torchrun import TorchrunJob
from tests.service.conftest import make_server


def test_torchrun_on_foldplane_restarts_an_nccl_job_after_a_worker_is_killed(
    tmp_path: Path,
) -> None:
    gpus = min(torch.cuda.device_count(), 4)
    server = make_server(tmp_path).start()
    try:
        with TorchrunJob(
            backend="foldplane", endpoint=server.url, job="nccl-kill", nodes=1, nproc=gpus,
            nnodes="1", conf={"last_call_timeout": "1"},
            script_args=("--steps", "40", "--step-pause", "0.1", "--backend", "nccl"),
        ) as run:  # fmt: skip
            run.start()
            run.trained(3, timeout=300)
            killed_at = run.kill_worker(gpus - 1)
            run.trained_again(killed_at, timeout=300)
            assert run.wait(timeout=300) == [0]
            run.lines.drain()
            assert any(x["restart"] == 1 for x in run.lines.seen)
            assert max(x["step"] for x in run.lines.seen) == 40
    finally:
        server.stop()
