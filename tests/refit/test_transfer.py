"""The refit data plane over real torch processes on gloo (loopback): 2 publishers and 4
subscribers, each its own process; the test plays the control plane (plans as JSON, bootstraps
from publisher slot 0, the lane count)."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from foldplane.agent.refit.world import STORE_TIMEOUT_S
from foldplane.wire.refit import MeshSpec, ReshardPlan, encode_plan, make_plan, megatron_layout
from tests.refit import worker

pytestmark = pytest.mark.slow

OPTIONS = {"timeout_s": 20.0, "heartbeat_s": 0.1, "stall_s": 2.0}
SEED = 1234
REPLY_S = 90.0
MEMBERS = [("publisher", 0), ("publisher", 1)] + [("subscriber", s) for s in range(4)]


class Cluster:
    def __init__(self) -> None:
        self.ctx = mp.get_context("spawn")
        self.procs: dict[tuple[str, int], Any] = {}
        self.conns: dict[tuple[str, int], Any] = {}

    def spawn(self, member: tuple[str, int]) -> None:
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=worker.main, args=(child, *member), daemon=True)
        proc.start()
        child.close()
        self.procs[member], self.conns[member] = proc, parent

    def up(self, *members: tuple[str, int]) -> None:
        for m in members:
            assert self.reply(m) == "up"

    def send(self, member: tuple[str, int], *cmd: Any) -> None:
        self.conns[member].send(cmd)

    def reply(self, member: tuple[str, int]) -> Any:
        conn = self.conns[member]
        if not conn.poll(REPLY_S):
            raise AssertionError(f"{member} did not reply within {REPLY_S} s")
        got = conn.recv()
        if isinstance(got, tuple) and got[0] == "error":
            raise AssertionError(f"{member} raised:\n{got[1]}")
        return got

    def bootstrap(self) -> dict[str, str]:
        self.send(("publisher", 0), "bootstrap")
        return self.reply(("publisher", 0))

    def open(self, plans: dict, lanes: int, members: list | None = None, **options: Any) -> dict:
        boot = self.bootstrap()
        members = members or MEMBERS
        for m in members:
            self.send(m, "open", plans[m], boot, lanes, SEED, {**OPTIONS, **options})
        return {m: self.reply(m) for m in members}

    def transfer(self, members: list | None = None) -> dict:
        members = members or MEMBERS
        for m in members:
            self.send(m, "transfer")
        for m in members:
            assert self.reply(m) == ("started",)
        return {m: self.reply(m) for m in members}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    for m in MEMBERS:
        c.spawn(m)
    c.up(*MEMBERS)
    yield c
    for m, proc in c.procs.items():
        if proc.is_alive():
            c.send(m, "stop")
    for proc in c.procs.values():
        proc.join(10)
        if proc.is_alive():
            proc.kill()


def roles(model: Any) -> dict[str, str]:
    from foldplane.agent.refit import roles_from_modules

    return roles_from_modules(
        model,
        column=[model["embed"], model["qkv"], model["up"]],
        row=[model["proj"], model["down"]],
        rest="replicated",
    )


def plan(
    pub: MeshSpec, sub: MeshSpec, pub_roles: str | None = None, sub_roles: str | None = None
) -> ReshardPlan:
    from foldplane.agent.refit import tensors_of

    model = worker.build_model(SEED)
    shapes = tensors_of(model.state_dict())
    megatron = roles(model)
    every = {
        None: megatron,
        "replicated": dict.fromkeys(megatron, "replicated"),
    }
    return make_plan(
        megatron_layout(pub, shapes, every[pub_roles]),
        megatron_layout(sub, shapes, every[sub_roles]),
        misc=("norm.weight", "norm.bias"),
    )


def same_plan(p: ReshardPlan) -> dict:
    body = encode_plan(p)
    return dict.fromkeys(MEMBERS, body)


def expected_hashes(p: ReshardPlan, slot: int) -> dict[str, str]:
    from foldplane.agent.refit import local_shards

    full = worker.full_state(SEED)
    return {n: worker.tensor_hash(t) for n, t in local_shards(full, p, "subscriber", slot).items()}


def assert_bit_identical(p: ReshardPlan, results: dict) -> None:
    for (side, slot), got in results.items():
        assert got[0] == "ok", (side, slot, got)
        if side == "subscriber":
            assert got[3] == expected_hashes(p, slot), f"subscriber slot {slot} differs"


TRAINER = MeshSpec(name="trainer", size=2, tp=2)
GENERATOR = MeshSpec(name="generator", size=4, tp=4)


def test_tp2_trainers_refit_tp4_generators_bit_identical(cluster: Cluster) -> None:
    p = plan(TRAINER, GENERATOR)
    opened = cluster.open(same_plan(p), lanes=3)
    assert set(opened.values()) == {("opened",)}
    first = cluster.transfer()
    assert_bit_identical(p, first)
    # both trainers send: no one root sends everything
    assert all(first[("publisher", s)][1] > 0 for s in (0, 1))
    # the world carries the next refit too
    assert_bit_identical(p, cluster.transfer())
    for m in MEMBERS:
        cluster.send(m, "close")
        assert cluster.reply(m) == ("closed",)


def test_replicated_trainers_refit_sharded_generators(cluster: Cluster) -> None:
    p = plan(MeshSpec(name="trainer", size=2, tp=1), GENERATOR, pub_roles="replicated")
    assert cluster.open(same_plan(p), lanes=2) == dict.fromkeys(MEMBERS, ("opened",))
    results = cluster.transfer()
    assert_bit_identical(p, results)
    assert all(results[("publisher", s)][1] > 0 for s in (0, 1))


def test_sharded_trainers_refit_replicated_generators(cluster: Cluster) -> None:
    p = plan(TRAINER, MeshSpec(name="generator", size=4, tp=1), sub_roles="replicated")
    assert cluster.open(same_plan(p), lanes=2) == dict.fromkeys(MEMBERS, ("opened",))
    assert_bit_identical(p, cluster.transfer())


def test_a_member_with_another_plan_is_named_by_the_others(cluster: Cluster) -> None:
    p = plan(TRAINER, GENERATOR)
    other = plan(TRAINER, MeshSpec(name="generator", size=4, tp=2))
    plans = {**same_plan(p), ("subscriber", 3): encode_plan(other)}
    opened = cluster.open(plans, lanes=2)
    for m in (("publisher", 0), ("publisher", 1)):
        kind, name, message = opened[m]
        assert (kind, name) == ("refused", "RefitError")
        assert message.startswith("subscriber slot 3 opened the world with another plan")


def test_a_member_that_never_joins_is_named(cluster: Cluster) -> None:
    p = plan(TRAINER, GENERATOR)
    present = [m for m in MEMBERS if m != ("subscriber", 3)]
    opened = cluster.open(same_plan(p), lanes=2, members=present, timeout_s=5.0)
    for m in present:
        kind, name, message = opened[m]
        assert (kind, name) == ("refused", "RefitFailed")
        assert "subscriber slot 3 never joined within 5.0 s" in message


def test_a_subscriber_killed_mid_transfer_fails_the_refit_fast_naming_it(cluster: Cluster) -> None:
    """Subscriber slot 2 opens the world but is SIGKILLed once every other member is inside the
    transfer (publisher 1 has sends to it outstanding). Every survivor fails within seconds,
    naming it; the failed world stays closed; a new world on a new bootstrap, with a replacement
    process in slot 2, completes bit-identical."""
    p = plan(TRAINER, GENERATOR)
    victim = ("subscriber", 2)
    assert cluster.open(same_plan(p), lanes=3) == dict.fromkeys(MEMBERS, ("opened",))
    survivors = [m for m in MEMBERS if m != victim]
    for m in survivors:
        cluster.send(m, "transfer")
    for m in survivors:
        assert cluster.reply(m) == ("started",)
    killed_at = time.time()
    os.kill(cluster.procs[victim].pid, signal.SIGKILL)
    results = {m: cluster.reply(m) for m in survivors}
    for m, got in results.items():
        assert got[0] == "failed", (m, got)
        _, message, dead, failed_at = got
        assert ["subscriber", 2] in [list(d) for d in dead], (m, message)
        assert failed_at - killed_at < 5.0, (m, failed_at - killed_at, message)
    for m in (("publisher", 0), ("publisher", 1)):
        assert [tuple(d) for d in results[m][2]] == [victim], results[m][1]
        assert "subscriber slot 2 dead" in results[m][1]
    cluster.send(("publisher", 0), "reuse")
    closed = cluster.reply(("publisher", 0))
    assert closed[0] == "closed" and "open a new world" in closed[1]

    cluster.procs[victim].join(10)
    cluster.spawn(victim)
    cluster.up(victim)
    assert cluster.open(same_plan(p), lanes=3) == dict.fromkeys(MEMBERS, ("opened",))
    assert_bit_identical(p, cluster.transfer())


def _kill_while_the_others_transfer(
    cluster: Cluster, victim: tuple[str, int]
) -> tuple[float, dict]:
    """Open a world of all six, start the transfer on all but ``victim``, SIGKILL ``victim``
    once every other member is inside it; the survivors' replies and the kill's time."""
    p = plan(TRAINER, GENERATOR)
    assert cluster.open(same_plan(p), lanes=2) == dict.fromkeys(MEMBERS, ("opened",))
    survivors = [m for m in MEMBERS if m != victim]
    for m in survivors:
        cluster.send(m, "transfer")
    for m in survivors:
        assert cluster.reply(m) == ("started",)
    killed_at = time.time()
    os.kill(cluster.procs[victim].pid, signal.SIGKILL)
    results = {m: cluster.reply(m) for m in survivors}
    cluster.procs[victim].join(10)
    return killed_at, results


def test_a_publisher_killed_mid_transfer_is_named_by_its_subscribers(cluster: Cluster) -> None:
    victim = ("publisher", 1)
    killed_at, results = _kill_while_the_others_transfer(cluster, victim)
    for m, got in results.items():
        assert got[0] == "failed", (m, got)
        assert got[3] - killed_at < 5.0, (m, got[3] - killed_at, got[1])
    for slot in (2, 3):  # the subscribers whose pieces publisher 1 holds
        got = results[("subscriber", slot)]
        assert [tuple(d) for d in got[2]] == [victim], got[1]
    cluster.spawn(victim)
    cluster.up(victim)
    p = plan(TRAINER, GENERATOR)
    assert cluster.open(same_plan(p), lanes=2) == dict.fromkeys(MEMBERS, ("opened",))
    assert_bit_identical(p, cluster.transfer())


def test_the_store_hosts_death_fails_every_member_naming_the_store(cluster: Cluster) -> None:
    """Publisher slot 0 hosts the store, which also carries the liveness counters and the
    failure notice. When it dies mid-transfer, each member fails when its link to it or its store
    connection breaks (whichever the kernel reports first), within the store client's bound
    (``STORE_TIMEOUT_S``), and every error names the lost store. A replacement hosts a new
    store and the next world completes."""
    victim = ("publisher", 0)
    killed_at, results = _kill_while_the_others_transfer(cluster, victim)
    for m, got in results.items():
        assert got[0] == "failed", (m, got)
        assert got[3] - killed_at < STORE_TIMEOUT_S, (m, got[3] - killed_at, got[1])
        assert "is unreachable" in got[1], got[1]
        assert got[2] == [], got[1]  # the counters were in the lost store: no one is named
    cluster.spawn(victim)
    cluster.up(victim)
    p = plan(TRAINER, GENERATOR)
    assert cluster.open(same_plan(p), lanes=2) == dict.fromkeys(MEMBERS, ("opened",))
    assert_bit_identical(p, cluster.transfer())


def test_plans_travel_as_json(cluster: Cluster) -> None:
    p = plan(TRAINER, GENERATOR)
    assert json.loads(encode_plan(p))["publisher"]["mesh"] == {
        "name": "trainer",
        "size": 2,
        "tp": 2,
    }
