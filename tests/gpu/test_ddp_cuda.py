"""Elastic DDP on CUDA through a SIGKILL, under the real launcher and coordinator.

Four workers (``tests/agent/ddp_worker.py`` with its model on the GPU, gradients averaged over
NCCL) train; rank 3 is SIGKILLed mid-training; the survivors carry on without a restart, every
committed step leaves all members with bit-identical parameters and optimizer state; the
launcher's replacement heals from the survivors and then trains in lockstep with them.
"""

from __future__ import annotations

import pytest

from tests.agent.conftest import coordinator, workers  # noqa: F401  (fixtures)
from tests.agent.test_ddp import DDP_WORKER, by_step, kill_rank_3_and_heal

pytestmark = pytest.mark.timeout(240)


def _identical(group: dict[int, dict]) -> None:
    committed = {e["committed"] for e in group.values()}
    assert len(committed) == 1, group
    if committed.pop():
        assert len({tuple(e["before"]) for e in group.values()}) == 1, "members started apart"
        assert len({e["params"] for e in group.values()}) == 1, "parameters differ"
        assert len({e["optim"] for e in group.values()}) == 1, "optimizer states differ"


def test_ddp_on_cuda_survives_a_sigkill_and_heals_a_replacement(workers, monkeypatch):  # noqa: F811
    monkeypatch.setenv("GPU_TEST_DEVICE", "cuda:0")
    w = workers("ddpcuda", 4, script=DDP_WORKER, collective_timeout_s=20.0)
    for r in range(4):
        w.expect(r, "started", timeout=120)
    pids = {r: w.launcher.worker(r).process.pid for r in range(3)}
    victim, survivors, healed = kill_rank_3_and_heal(w, 10, 20)

    events = victim + [e for r in survivors for e in survivors[r]]
    events += [e for r in healed for e in healed[r]]
    for (_version, _index), group in sorted(by_step(events).items()):
        present = {r: e for r, e in group.items() if r in e["members"]}
        _identical(present)
    assert {r: w.launcher.worker(r).process.pid for r in range(3)} == pids  # never restarted
    assert all(e["failed"] in ([], [3]) for r in survivors for e in survivors[r])
    first = next(e for e in healed[3] if e["committed"])
    assert first["members"] == [0, 1, 2, 3] and set(first["healed_from"]) <= {0, 1, 2}, first
    final = {r: healed[r][-1] for r in range(4)}
    assert len({(e["steps"], e["version"], e["index"]) for e in final.values()}) == 1, final
    assert len({e["params"] for e in final.values()}) == 1
    assert len({e["optim"] for e in final.values()}) == 1
