"""Elastic DDP end to end: a real coordinator, real gloo worker processes started by the
launcher, each wrapping a float64 model in ``agent.ddp.DistributedDataParallel`` with Adam.

Every committed step is checked from outside: its gradients are recomputed here, in one
process, from the parameters it started from and each member's batch, and must equal the mean
over the view's members; after it, every member's parameters and optimizer state are
bit-identical (digests)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.agent.ddp_worker import loss_of, make_model

DDP_WORKER = Path(__file__).with_name("ddp_worker.py")

pytestmark = pytest.mark.timeout(280)


def expected_grads(before: list[float], seeds: list[int]) -> torch.Tensor:
    """The mean over ``seeds`` (one batch per member) of the gradient at ``before``."""
    model = make_model(0)
    torch.nn.utils.vector_to_parameters(
        torch.tensor(before, dtype=torch.float64), model.parameters()
    )
    total = torch.zeros(len(before), dtype=torch.float64)
    for seed in seeds:
        model.zero_grad()
        loss_of(model, seed).backward()
        total += torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    return total / len(seeds)


def check_step(events: dict[int, dict]) -> None:
    """One step as its members saw it: agreed, the mean gradient, identical state after."""
    committed = {e["committed"] for e in events.values()}
    assert len(committed) == 1, f"members disagree on committing: {events}"
    if not committed.pop():
        return
    (members,) = {tuple(e["members"]) for e in events.values()}
    assert set(events) == set(members), (sorted(events), members)
    assert len({tuple(e["before"]) for e in events.values()}) == 1, "members started apart"
    want = expected_grads(events[members[0]]["before"], [events[m]["seed"] for m in members])
    for m in members:
        got = torch.tensor(events[m]["grads"], dtype=torch.float64)
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    assert len({e["grads"].__repr__() for e in events.values()}) == 1, "gradients differ in bits"
    assert len({e["params"] for e in events.values()}) == 1, "parameters differ after the step"
    assert len({e["optim"] for e in events.values()}) == 1, "optimizer states differ"


def steps_of(w, ranks: list[int], n: int) -> list[dict[int, dict]]:
    w.send(ranks, "steps", n=n)
    per_rank = {r: [w.expect(r, "step", timeout=120) for _ in range(n)] for r in ranks}
    for r in ranks:
        w.expect(r, "steps_done", timeout=60)
    return [{r: per_rank[r][i] for r in ranks} for i in range(n)]


def test_ddp_over_three_processes_averages_over_the_members_and_stays_identical(workers):
    w = workers("ddp", 3, script=DDP_WORKER)
    for r in range(3):
        w.expect(r, "started")
    steps = steps_of(w, [0, 1, 2], 3)
    for step in steps:
        assert all(e["committed"] and e["members"] == [0, 1, 2] for e in step.values()), step
        check_step(step)
    # The models started from different seeds: the first step healed them to rank 0's.
    assert steps[0][0]["before"] == flat_params_of_seed(1000)
    assert steps[-1][0]["loss"] < steps[0][0]["loss"] * 1.5


def flat_params_of_seed(seed: int) -> list[float]:
    return torch.cat([p.detach().reshape(-1) for p in make_model(seed).parameters()]).tolist()
