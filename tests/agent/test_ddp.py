"""Elastic DDP end to end: a real coordinator, real gloo worker processes started by the
launcher, each wrapping a float64 model in ``agent.ddp.DistributedDataParallel`` with Adam.

Every committed step is checked from outside: its gradients are recomputed here, in one
process, from the parameters it started from and each member's batch, and must equal the mean
over the view's members; after it, every member's parameters and optimizer state are
bit-identical (digests)."""

from __future__ import annotations

import re
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
    # The models started from different seeds: the first step healed them to rank 0's, which
    # ranks 1 and 2 pulled from its heal server.
    assert steps[0][0]["before"] == flat_params_of_seed(1000)
    assert [steps[0][r]["healed_from"] for r in range(3)] == [[], [0], [0]]
    assert steps[-1][0]["loss"] < steps[0][0]["loss"] * 1.5


def held_out_loss(flat: list[float]) -> float:
    """The mean loss of the parameters ``flat`` over 64 batches no worker trains on."""
    model = make_model(0)
    torch.nn.utils.vector_to_parameters(torch.tensor(flat, dtype=torch.float64), model.parameters())
    with torch.no_grad():
        return sum(loss_of(model, 9_000_000 + i).item() for i in range(64)) / 64


def flat_params_of_seed(seed: int) -> list[float]:
    return torch.cat([p.detach().reshape(-1) for p in make_model(seed).parameters()]).tolist()


def by_step(events: list[dict]) -> dict[tuple[int, int], dict[int, dict]]:
    """Events grouped by logical step: (view version, step number in that view)."""
    out: dict[tuple[int, int], dict[int, dict]] = {}
    for e in events:
        if e["version"] is not None:
            out.setdefault((e["version"], e["index"]), {})[e["rank"]] = e
    return out


def collect(w, rank: int, until: int, *, exact: bool = True) -> list[dict]:
    """``rank``'s step events until it reports ``steps_done`` (at ``until``, or past it)."""
    out = []
    while True:
        e = w.events[rank].get(timeout=180)
        if e["event"] == "step":
            out.append({**e, "rank": rank})
        elif e["event"] == "steps_done":
            assert e["steps"] == until if exact else e["steps"] >= until, e
            return out
        elif e["event"] in ("error", "exited"):
            raise AssertionError(f"rank {rank}: {e}")


def drain(w, rank: int) -> list[dict]:
    """The step events a killed rank printed before it died."""
    out = []
    while True:
        e = w.events[rank].get(timeout=30)
        if e["event"] == "exited":
            return out
        if e["event"] == "step":
            out.append({**e, "rank": rank})


def kill_rank_3_and_heal(
    w, until: int, until_healed: int, **replacement: object
) -> tuple[list, dict, dict]:
    """Everyone trains towards ``until`` committed steps; rank 3 is SIGKILLed after two of them.
    Its replacement asks to be activated, then trains (``replacement``: more arguments of its
    ``steps``); the survivors keep training meanwhile,
    past ``until_healed`` if they get there first, until a step with the replacement has
    committed (stopping earlier would leave it alone in its first view, waiting for them).
    Returns the victim's events, the survivors' until ``until``, and everyone's after."""
    w.send([0, 1, 2, 3], "steps", until=until)
    w.expect(3, "step", timeout=120)
    victim = [{**w.expect(3, "step", timeout=120), "rank": 3}]
    w.launcher.kill(3)
    assert w.exits.get(timeout=30).returncode == -9
    victim += drain(w, 3)
    survivors = {r: collect(w, r, until) for r in (0, 1, 2)}
    w.spawn(3)
    w.expect(3, "started", timeout=120)
    w.send([3], "activate_self")
    w.send([3], "steps", until=until_healed, **replacement)
    w.send([0, 1, 2], "steps", until=until_healed, with_rank=3)
    assert w.expect(3, "proposal", timeout=120)["status"] == "applied"
    healed = {r: collect(w, r, until_healed, exact=False) for r in range(4)}
    return victim, survivors, healed


@pytest.mark.slow
def test_ddp_survives_a_sigkill_and_a_replacement_heals_to_identical_state(workers, coordinator):
    w = workers("ddpkill", 4, script=DDP_WORKER)
    for r in range(4):
        w.expect(r, "started")
    pids = {r: w.launcher.worker(r).process.pid for r in range(3)}
    first_steps = steps_of(w, [0, 1, 2, 3], 3)
    for step in first_steps:
        check_step({r: {**e, "rank": r} for r, e in step.items()})

    victim, survivors, healed = kill_rank_3_and_heal(w, 12, 24)

    events = victim + [e for r in survivors for e in survivors[r]]
    events += [e for r in healed for e in healed[r]]
    groups = by_step(events)
    seen_members = set()
    for (version, _index), group in sorted(groups.items()):
        members = {tuple(e["members"]) for e in group.values()}
        assert len(members) == 1, group
        seen_members |= members
        absent = set(members.pop()) - set(group)
        committed = any(e["committed"] for e in group.values())
        if not committed:  # a member that moved on to a newer view never ran it: no event
            check_step(group)
            continue
        assert absent <= {3} and (not absent or version == 1), (version, sorted(group), absent)
        for m in absent:  # the victim's event was lost with it: its batch is known
            any_event = next(iter(group.values()))
            group[m] = {**any_event, "rank": m, "seed": 100_000 * m + any_event["iteration"]}
        check_step(group)
    assert {(0, 1, 2, 3), (0, 1, 2)} <= seen_members, seen_members
    # Survivors were never restarted, and a skipped step blames only the dead rank.
    assert {r: w.launcher.worker(r).process.pid for r in range(3)} == pids
    assert all(e["failed"] in ([], [3]) for r in survivors for e in survivors[r])
    # (Whether a step was skipped depends on where the kill lands: a view change that arrives
    # between two steps moves the survivors on without a failed step.)
    # The replacement's first committed step started from the survivors' state, bit for bit.
    first = next(e for e in healed[3] if e["committed"])
    same_step = next(
        e for e in healed[0] if (e["version"], e["index"]) == (first["version"], first["index"])
    )
    assert first["before"] == same_step["before"] and first["members"] == [0, 1, 2, 3]
    # It pulled that state from the survivors' threads (all that held the step it pinned) while
    # they kept training, and needed nothing more: its first step is the one after that heal.
    assert first["healed_from"] and set(first["healed_from"]) <= {0, 1, 2}, first
    assert first["healed_steps"] == first["steps"] - 1, first
    final = {r: healed[r][-1] for r in range(4)}
    assert len({(e["steps"], e["version"], e["index"]) for e in final.values()}) == 1, final
    assert len({e["params"] for e in final.values()}) == 1
    assert len({e["optim"] for e in final.values()}) == 1
    # Training went somewhere: the loss over fixed held-out batches fell since the first step.
    start, end = first_steps[0][0]["before"], healed[0][-1]["before"]
    assert held_out_loss(end) < held_out_loss(start), (held_out_loss(start), held_out_loss(end))
    versions = [(v["version"], v["active_ranks"]) for v in coordinator.history("ddpkill")]
    assert versions[-1][1] == [0, 1, 2, 3] and [0, 1, 2] in [a for _, a in versions], versions


@pytest.mark.slow
def test_a_survivors_recovery_says_what_happened_without_store_or_gloo_noise(workers):
    """A kill and a recovery, heard from a survivor's stderr: the line that says the group goes
    on without the dead rank, and none of the noise that used to bury it: torch's store client
    warning of each 20 ms slice of the wait for a step's decision (the replacement votes late
    in its first steps, as a cold process does, so the survivors wait), nor gloo's text about
    the connection to the rank known dead."""
    w = workers("quiet", 4, script=DDP_WORKER, capture_stderr=True)
    for r in range(4):
        w.expect(r, "started")
    steps_of(w, [0, 1, 2, 3], 2)
    kill_rank_3_and_heal(w, 6, 10, vote_late_s=0.3, vote_late_steps=3)
    for r in (0, 1, 2):
        err = w.stderr_of(r)
        for noise in ("waitForInput", "timed out after", "Connection reset", "closed by peer"):
            assert noise not in err, err
        assert "GLHF" not in err, err
        assert re.search(
            rf"rank {r}: view \d+: ranks \[0, 1, 2\] go on from step \d+ without rank 3", err
        ), err
