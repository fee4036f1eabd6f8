"""A worker started without the launcher (as torchrun, Slurm or Kubernetes start one) exits 0
after its job, and its data plane leaves no gloo backend behind.

A scheduler counts an exit by signal as a failure; the launcher forgives a SIGABRT after a
clean ``exit``, nobody else does. The abort came from an all-reduce left waiting on a view the
group had moved on from: it ended (``Connection closed by peer``) only when a peer's process
tree exited, and if that was while this process's interpreter shut down, gloo's worker thread
died reaching for the GIL inside its error handler: ``terminate called after throwing an
instance of 'gloo::IoException'``, exit -6. ``tests/agent/exit_worker.py`` recreates that end
of a job (a forked child holds each process's sockets, as a ``DataLoader`` worker does), 20
times over.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent.conftest import ROOT

EXIT_WORKER = Path(__file__).with_name("exit_worker.py")
RUNS = 20


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_worker_without_the_launcher_exits_0_in_20_runs_of_20(coordinator):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FOLDPLANE_")}
    env |= {"FOLDPLANE_COORDINATOR": coordinator.url, "PYTHONPATH": str(ROOT)}
    codes, bad = [], []
    for run in range(RUNS):
        group = f"exit{run}"
        coordinator.create_group(group, 3)
        workers = [
            subprocess.Popen(
                [sys.executable, str(EXIT_WORKER)],
                cwd=ROOT,
                env={**env, "FOLDPLANE_GROUP": group, "FOLDPLANE_RANK": str(rank)},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for rank in range(3)
        ]
        outs = [w.communicate(timeout=120)[0] for w in workers]
        codes.append([w.returncode for w in workers])
        bad += [(run, rank, out[-2000:]) for rank, out in enumerate(outs) if codes[-1][rank]]
        assert all(f"rank {rank}: closed" in out for rank, out in enumerate(outs)), outs
    assert codes == [[0, 0, 0]] * RUNS, (codes, bad[:2])
