"""Elastic HSDP (FSDP2 over a DeviceMesh) on CUDA through a SIGKILL, under the real launcher.

Two replicas of two shards (``tests/fsdp/fsdp_worker.py`` with its model sharded on the GPU:
the shard groups and the replicas' all-reduce on NCCL). Both processes of replica 1 SIGKILL
themselves mid-step; the survivors skip that step and go on alone; a replacement replica heals
shard by shard and ends bit-identical to the survivors.
"""

from __future__ import annotations

import pytest

from tests.agent.conftest import coordinator  # noqa: F401  (fixture)
from tests.fsdp.conftest import hsdp  # noqa: F401  (fixture)
from tests.fsdp.test_fsdp import (
    assert_replicas_identical,
    check_agreed,
    lose_replica_1_and_heal,
    steps_of,
)

pytestmark = pytest.mark.timeout(240)


def test_hsdp_on_cuda_loses_a_replica_and_heals_its_replacement_bit_identical(
    hsdp,  # noqa: F811
    coordinator,  # noqa: F811
    monkeypatch,
) -> None:
    monkeypatch.setenv("GPU_TEST_DEVICE", "cuda:0")
    job = hsdp("hsdpcuda", 2, 2)
    keys = job.keys()
    for k in keys:
        job.expect(k, "started", timeout=120)
    survivors = job.keys([0])
    pids = {k: job.pid(k) for k in survivors}
    for step in steps_of(job, keys, 3):
        assert all(e["committed"] for e in step.values()), step
        assert_replicas_identical(step, 2)

    victims, phase2, phase3 = lose_replica_1_and_heal(job, survivors, 10, 20)
    for events in phase2.values():
        assert all(e["failed"] in ([], [1]) for e in events if not e["committed"]), events

    events = [{**e, "pid": 0} for e in victims]
    for k, evs in [*phase2.items(), *phase3.items()]:
        events += [{**e, "pid": job.pid(k) if k in survivors else 1} for e in evs]
    check_agreed(events, 2)
    assert {k: job.pid(k) for k in survivors} == pids, "a survivor was restarted"
    final = {k: phase3[k][-1] for k in keys}
    assert len({e["steps"] for e in final.values()}) == 1, final
    assert_replicas_identical(final, 2)
