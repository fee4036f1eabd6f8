"""Elastic HSDP end to end: a real coordinator, 2 replicas × 2 shards of real gloo worker
processes, each training a small transformer with ``fully_shard`` on a 2-D mesh whose
replicate dimension is a foldplane group and whose shard dimension is a plain gloo group.

After every committed step the replicas hold bit-identical shards (the digests of the same
shard index's parameters and Adam state are equal on every replica)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.agent.conftest import workers as workers  # noqa: PLC0414 (the fixture)

WORKER_1D = Path(__file__).with_name("fsdp1d_worker.py")

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


def collect(job, key, until: int) -> list[dict]:
    """``key``'s step events until it reports ``steps_done`` (at ``until`` or past it)."""
    out = []
    while True:
        e = job.events[key].get(timeout=180)
        if e["event"] == "step":
            out.append({**e, "key": key})
        elif e["event"] == "steps_done":
            assert e["steps"] >= until, (key, e)
            return out
        elif e["event"] in ("error", "exited"):
            raise AssertionError(f"{key}: {e}")


def drain(job, key) -> list[dict]:
    """The step events a killed process printed before it died."""
    out = []
    while True:
        e = job.events[key].get(timeout=60)
        if e["event"] == "exited":
            return out
        if e["event"] == "step":
            out.append({**e, "key": key})


def check_agreed(events: list[dict], shards: int) -> None:
    """Per shard index and logical step (view, index): one decision; committed steps leave the
    replicas' shards bit-identical. Per replica and iteration: its shards decided alike."""
    by_step: dict[tuple, dict] = {}
    by_iteration: dict[tuple, set] = {}
    for e in events:
        replica, shard = e["key"]
        if e["version"] is not None:
            by_step.setdefault((shard, e["version"], e["index"]), {})[replica] = e
        by_iteration.setdefault((replica, e["pid"], e["iteration"]), set()).add(e["committed"])
    for step, group in by_step.items():
        assert len({e["committed"] for e in group.values()}) == 1, (step, group)
        if next(iter(group.values()))["committed"]:
            assert len({e["params"] for e in group.values()}) == 1, (step, group)
            assert len({e["optim"] for e in group.values()}) == 1, (step, group)
    for it, decisions in by_iteration.items():
        assert len(decisions) == 1, (it, decisions)


@pytest.mark.slow
def lose_replica_1_and_heal(
    job, survivors: list, until: int, until_healed: int
) -> tuple[list[dict], dict, dict]:
    """Replica 1's processes SIGKILL themselves mid-step (5 steps committed) while the survivors
    train to ``until``; a replacement replica then asks to be activated and everyone trains to
    ``until_healed``. Returns the victims' events, the survivors' until then, and everyone's
    after the replacement came."""
    job.send(survivors, "steps", until=until)
    job.send(job.keys([1]), "steps", until=until, die_at=5)
    victims = []
    for k in job.keys([1]):
        victims += drain(job, k)
        assert job.exits.get(timeout=60).returncode == -9
    phase2 = {k: collect(job, k, until) for k in survivors}
    job.start_replica(1)
    newcomers = job.keys([1])
    for k in newcomers:
        job.expect(k, "started", timeout=120)
    job.send(newcomers, "activate_self")
    job.send(newcomers, "steps", until=until_healed)
    job.send(survivors, "steps", until=until_healed, with_rank=1)
    for k in newcomers:
        assert job.expect(k, "proposal", timeout=120)["status"] == "applied"
    everyone = job.keys()  # (replica, shard) pairs: a method of the job, not a dict
    phase3 = {k: collect(job, k, until_healed) for k in everyone}
    return victims, phase2, phase3


def test_hsdp_survives_a_replica_sigkill_and_a_replacement_heals_bit_identical(hsdp, coordinator):
    job = hsdp("hsdpkill", 2, 2)
    keys = job.keys()
    for k in keys:
        job.expect(k, "started", timeout=120)
    survivors = job.keys([0])
    pids = {k: job.pid(k) for k in survivors}
    first = steps_of(job, keys, 3)
    for step in first:
        assert all(e["committed"] for e in step.values()), step
        assert_replicas_identical(step, 2)

    # Both processes of replica 1 SIGKILL themselves after the backward pass of the step that
    # starts with 5 steps committed, before voting: that step cannot commit anywhere. Then a
    # replacement replica: new processes, a new shard group; each asks to be activated.
    victims, phase2, phase3 = lose_replica_1_and_heal(job, survivors, 12, 24)
    for k, events in phase2.items():
        skipped = [e for e in events if not e["committed"]]
        assert skipped, f"{k}: the step the victims never voted on was not skipped: {events}"
        assert all(e["failed"] in ([], [1]) for e in skipped), skipped
        after = [e for e in events if e["committed"] and e["iteration"] > skipped[0]["iteration"]]
        assert after and all(e["members"] == [0] for e in after), events

    events = [{**e, "pid": 0} for e in victims]
    for k, evs in [*phase2.items(), *phase3.items()]:
        events += [{**e, "pid": job.pid(k) if k in survivors else 1} for e in evs]
    check_agreed(events, 2)
    assert {k: job.pid(k) for k in survivors} == pids, "a survivor was restarted"
    # The replacement's first committed step is a step of the survivors too, and after it the
    # shards of each index are bit-identical across the replicas (they healed, then stepped).
    for s in range(2):
        mine = next(e for e in phase3[(1, s)] if e["committed"])
        theirs = next(
            e
            for e in phase3[(0, s)]
            if (e["version"], e["index"]) == (mine["version"], mine["index"])
        )
        assert mine["members"] == [0, 1] and theirs["committed"]
        assert (mine["params"], mine["optim"], mine["steps"]) == (
            theirs["params"],
            theirs["optim"],
            theirs["steps"],
        )
    final = {k: phase3[k][-1] for k in keys}
    assert len({e["steps"] for e in final.values()}) == 1, final
    assert_replicas_identical(final, 2)
    for s in range(2):
        history = [v["active_ranks"] for v in coordinator.history(f"hsdpkill-s{s}")]
        assert [0] in history and history[-1] == [0, 1], history


def test_fully_shard_over_the_whole_foldplane_group_trains_as_one_process_would(workers):
    """1-D: ``init_device_mesh`` over the foldplane default group, FSDP's all-gather and
    reduce-scatter on it; every step equals Adam on the mean of the ranks' gradients."""
    from tests.fsdp.fsdp1d_worker import batch, make_model

    w = workers("fsdp1d", 2, script=WORKER_1D)
    meshes = {r: w.expect(r, "mesh", timeout=120) for r in range(2)}
    assert all(m["ranks"] == m["from_group"] == [0, 1] for m in meshes.values()), meshes
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(3):
        events = {r: w.expect(r, "step", timeout=120) for r in range(2)}
        opt.zero_grad()
        for r in range(2):
            x, y = batch(events[r]["seed"])
            (torch.nn.functional.mse_loss(model(x), y) / 2).backward()
        opt.step()
        for i, p in enumerate(model.parameters()):
            pieces = [torch.tensor(events[r]["shards"][i], dtype=torch.float64) for r in range(2)]
            got = torch.cat([t.reshape(-1, *p.shape[1:]) for t in pieces if t.numel()])
            torch.testing.assert_close(got, p.detach(), rtol=1e-9, atol=1e-12)
