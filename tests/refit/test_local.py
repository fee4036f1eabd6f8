"""The refit data plane's local checks and torch helpers, in one process (members as threads)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch
from torch import nn

from foldplane.agent.refit import (
    Peer,
    RefitClosed,
    RefitError,
    RefitFailed,
    RefitStore,
    Verdict,
    dtype_name,
    empty_shards,
    local_shards,
    local_view,
    make_bootstrap,
    open_world,
    roles_from_modules,
    tensors_of,
)
from foldplane.wire.refit import MeshSpec, PlanError, make_plan, megatron_layout

STATE = {"w": torch.arange(32.0).reshape(8, 4), "b": torch.arange(4, dtype=torch.int64)}
ROLES = {"w": "column", "b": "replicated"}


def plan_1_to_2() -> Any:
    shapes = tensors_of(STATE)
    return make_plan(
        megatron_layout(MeshSpec(name="trainer", size=1), shapes, ROLES),
        megatron_layout(MeshSpec(name="generator", size=2, tp=2), shapes, ROLES),
        misc=("b",),
    )


def open_all(plan: Any, bootstrap: dict) -> dict:
    worlds: dict = {}

    def member(side: str, slot: int) -> None:
        worlds[(side, slot)] = open_world(plan, side, slot, bootstrap, 2, timeout_s=20.0)

    threads = [
        threading.Thread(target=member, args=m)
        for m in (("publisher", 0), ("subscriber", 0), ("subscriber", 1))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return worlds


def transfer_all(worlds: dict, tensors: dict) -> dict:
    out: dict = {}

    def member(m: tuple) -> None:
        try:
            out[m] = worlds[m].transfer(tensors[m])
        except Exception as e:  # the test asserts on it
            out[m] = e

    threads = [threading.Thread(target=member, args=(m,)) for m in worlds]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def test_one_publisher_to_two_subscribers_in_threads_and_the_local_checks() -> None:
    plan = plan_1_to_2()
    store = RefitStore()
    worlds = open_all(plan, store.bootstrap("gloo"))
    assert len(worlds) == 3
    tensors = {
        ("publisher", 0): local_shards(STATE, plan, "publisher", 0),
        ("subscriber", 0): empty_shards(plan, "subscriber", 0),
        ("subscriber", 1): empty_shards(plan, "subscriber", 1),
    }
    # a wrong tensor is refused before anything moves, and the world stays open
    with pytest.raises(RefitError, match=r"w: subscriber slot 0 must pass a torch.float32 tensor"):
        worlds[("subscriber", 0)].transfer(
            {"w": torch.empty(8, 4), "b": torch.empty(4, dtype=torch.int64)}
        )
    with pytest.raises(RefitError, match=r"missing \['b'\], not in the plan \['x'\]"):
        worlds[("subscriber", 0)].transfer({"w": torch.empty(4, 4), "x": torch.empty(4)})
    results = transfer_all(worlds, tensors)
    assert all(not isinstance(r, Exception) for r in results.values()), results
    for slot in (0, 1):
        got = tensors[("subscriber", slot)]
        assert torch.equal(got["w"], STATE["w"][4 * slot : 4 * slot + 4])
        assert torch.equal(got["b"], STATE["b"])
    assert results[("publisher", 0)].bytes_sent == 32 * 4 + 2 * 4 * 8
    for w in worlds.values():
        w.close()
    with pytest.raises(RefitClosed, match="open a new world"):
        worlds[("publisher", 0)].transfer(tensors[("publisher", 0)])
    store.close()


def test_open_world_refuses_bad_arguments_before_connecting() -> None:
    plan = plan_1_to_2()
    boot = {"store": "127.0.0.1:1", "prefix": "p", "backend": "gloo"}
    with pytest.raises(RefitError, match=r"subscriber slot must be in 0..1, got 2"):
        open_world(plan, "subscriber", 2, boot, 1)
    with pytest.raises(RefitError, match="side must be one of"):
        open_world(plan, "trainer", 0, boot, 1)  # type: ignore[arg-type]
    with pytest.raises(RefitError, match="0 < timeout_s <= 3600"):
        open_world(plan, "publisher", 0, boot, 1, timeout_s=0)
    with pytest.raises(PlanError, match="must be 'host:port'"):
        open_world(plan, "publisher", 0, {**boot, "store": "nowhere"}, 1)


def test_local_view_is_a_view_of_the_slots_region() -> None:
    plan = plan_1_to_2()
    view = local_view(STATE["w"], plan.subscriber, "w", 1)
    assert view is not None and view.data_ptr() == STATE["w"][4].data_ptr()
    assert dtype_name(torch.bfloat16) == "bfloat16"
    with pytest.raises(PlanError, match="cannot be refit"):
        dtype_name(torch.complex64)


def test_roles_come_from_the_modules_the_user_marks() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4), nn.LayerNorm(4))
    roles = roles_from_modules(model, column=[model[0]], row=[model[2]], rest="replicated")
    assert roles == {
        "0.weight": "column",
        "0.bias": "column",
        "2.weight": "row",
        "2.bias": "replicated",
        "3.weight": "replicated",
        "3.bias": "replicated",
    }
    with pytest.raises(PlanError, match=r"no role for 3.bias, 3.weight"):
        roles_from_modules(model, column=[model[0]], row=[model[2]])
    with pytest.raises(TypeError, match="only nn.Linear and nn.Embedding"):
        roles_from_modules(model, column=[model[3]])
    with pytest.raises(PlanError, match="marked both column and row"):
        roles_from_modules(model, column=[model[0]], row=[model[0]], rest="replicated")


def _form_alone(plan: Any, boot: dict, verdict: Any, timeout_s: float) -> BaseException | None:
    """Subscriber slot 0 opens the world alone (the others never join); what it raised."""
    caught: list[BaseException] = []

    def member() -> None:
        try:
            open_world(plan, "subscriber", 0, boot, 1, timeout_s=timeout_s, verdict=verdict)
        except BaseException as exc:  # noqa: BLE001 (handed to the test)
            caught.append(exc)

    thread = threading.Thread(target=member)
    thread.start()
    thread.join(timeout_s + 30)
    return caught[0] if caught else None


def test_formation_ends_at_the_coordinators_verdict_naming_who_died() -> None:
    """Publisher slot 0 went OFFLINE before it joined: the coordinator moved the refit's
    epoch. A member forming the world reads that verdict while it waits, and fails at once
    naming the dead member, instead of waiting out its deadline and naming no one."""
    store, boot = make_bootstrap("gloo")
    dead = Peer("publisher", 0)
    moved = Verdict(
        "the coordinator moved refit 'rl' from epoch 1 to 2: publisher slot 0 went OFFLINE", (dead,)
    )
    told_at = time.monotonic() + 0.5
    try:
        exc = _form_alone(
            plan_1_to_2(), boot, lambda: moved if time.monotonic() >= told_at else None, 15.0
        )
        assert isinstance(exc, RefitFailed), exc
        assert exc.transfer == 0 and exc.dead == (dead,)
        assert "had not joined" in exc.reason and "went OFFLINE" in exc.reason
    finally:
        store.close()


def test_twin_formation_without_a_verdict_names_the_absent_at_its_deadline() -> None:
    store, boot = make_bootstrap("gloo")
    try:
        exc = _form_alone(plan_1_to_2(), boot, lambda: None, 1.0)
        assert isinstance(exc, RefitFailed), exc
        assert exc.dead == () and "never joined within 1.0 s" in exc.reason
    finally:
        store.close()
