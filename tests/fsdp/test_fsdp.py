"""Elastic HSDP end to end: a real coordinator, 2 replicas × 2 shards of real gloo worker
processes, each training a small transformer with ``fully_shard`` on a 2-D mesh whose
replicate dimension is a foldplane group and whose shard dimension is a plain gloo group.

After every committed step the replicas hold bit-identical shards (the digests of the same
shard index's parameters and Adam state are equal on every replica)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(300)


def steps_of(job, keys, n: int) -> list[dict]:
    job.send(keys, "steps", n=n)
    per_key = {k: [job.expect(k, "step", timeout=120) for _ in range(n)] for k in keys}
    for k in keys:
        job.expect(k, "steps_done", timeout=60)
    return [{k: per_key[k][i] for k in keys} for i in range(n)]


def assert_replicas_identical(events: dict, shards: int) -> None:
    for s in range(shards):
        same_shard = {k: e for k, e in events.items() if k[1] == s}
        assert len({e["params"] for e in same_shard.values()}) == 1, same_shard
        assert len({e["optim"] for e in same_shard.values()}) == 1, same_shard


def test_hsdp_two_replicas_of_two_shards_commit_identical_steps(hsdp):
    job = hsdp("hsdp", 2, 2)
    keys = job.keys()
    for k in keys:
        job.expect(k, "started", timeout=120)
    steps = steps_of(job, keys, 4)
    for step in steps:
        assert all(e["committed"] and e["members"] == [0, 1] for e in step.values()), step
        assert_replicas_identical(step, 2)
        # The two shards of a replica hold different halves of the model.
        assert step[(0, 0)]["params"] != step[(0, 1)]["params"]
    assert steps[-1][(0, 0)]["loss"] < steps[0][(0, 0)]["loss"] * 1.5
