"""The failure budget and the survivor floor: exactly one shutdown_with_save, with its reason."""

from __future__ import annotations

from foldplane.coordinator.fold.effects import ShutdownWithSave
from tests.fold.script import Script, of, one


def shutdowns(s: Script, effects) -> list[ShutdownWithSave]:
    return of(effects, ShutdownWithSave)


def test_reaching_max_failure_emits_exactly_one_shutdown_with_save():
    s = Script()
    all_effects = s.form(world_size=6, max_failure=2)
    all_effects += s.at(1).death(5)
    assert shutdowns(s, all_effects) == []
    effects = s.at(2).death(4)
    shutdown = one(effects, ShutdownWithSave)
    assert shutdown.reason == "max_failure_exceeded"
    assert "2 failed incarnations" in shutdown.detail and "5@1, 4@1" in shutdown.detail
    assert "max_failure 2" in shutdown.detail
    all_effects += effects
    for r in (3, 2):
        all_effects += s.death(r)
    all_effects += s.ack_all()
    all_effects += s.at(100).tick()
    assert len(shutdowns(s, all_effects)) == 1
    assert s.m.group_status("g")["shutdown"] == "max_failure_exceeded"


def test_a_percentage_budget_rounds_up():
    s = Script()
    s.form(world_size=10, max_failure="25%")  # ceil(2.5) = 3 failures
    assert shutdowns(s, s.death(9) + s.death(8)) == []
    shutdown = one(s.death(7), ShutdownWithSave)
    assert shutdown.reason == "max_failure_exceeded" and "max_failure '25%' = 3" in shutdown.detail


def test_clean_exits_are_not_counted_against_max_failure():
    s = Script()
    effects = s.form(world_size=4, max_failure=1)
    for r in (3, 2):
        effects += s.exit(r)
    effects += s.ack_all()
    assert shutdowns(s, effects) == []
    assert s.m.group_status("g")["failures"] == 0
    assert one(s.death(1), ShutdownWithSave).reason == "max_failure_exceeded"


def test_nccl_with_one_survivor_shuts_down_as_single_survivor():
    s = Script()
    s.form(world_size=2, backend="nccl")
    shutdown = one(s.death(1), ShutdownWithSave)
    assert shutdown.reason == "single_survivor"
    assert "backend nccl needs 2" in shutdown.detail and "lost [1]" in shutdown.detail


def test_gloo_runs_on_with_one_survivor_and_shuts_down_when_all_are_lost():
    s = Script()
    s.form(world_size=2)
    effects = s.death(1)
    assert shutdowns(s, effects) == []
    effects += s.ack_all()
    assert s.m.current_view("g").active_ranks == (0,)
    effects = s.death(0)
    shutdown = one(effects, ShutdownWithSave)
    assert shutdown.reason == "all_ranks_lost" and "0 of active ranks [0] left" in shutdown.detail


def test_every_rank_exiting_cleanly_is_not_a_loss():
    s = Script()
    effects = s.form(world_size=2)
    effects += s.exit(0)
    effects += s.exit(1)
    assert shutdowns(s, effects) == []


def test_a_group_shut_down_before_forming_does_not_also_fail_formation():
    s = Script()
    s.create(world_size=3, max_failure=1, formation_timeout_s=60)
    s.join(0)
    assert one(s.death(0), ShutdownWithSave).reason == "max_failure_exceeded"
    assert s.m.next_deadline() is None
    assert s.at(61).tick() == []
    assert s.m.group_status("g")["formation"]["status"] == "forming"
