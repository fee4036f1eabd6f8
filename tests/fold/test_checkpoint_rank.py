"""Who saves survives a death: each committed view names the group's checkpoint rank (the
lowest active rank, or the rank the operator pinned), failing over to the lowest live one."""

from __future__ import annotations

import pytest

from foldplane.coordinator.fold.config import ConfigError, GroupConfig
from foldplane.coordinator.fold.effects import ShutdownWithSave, ViewCommitted
from foldplane.wire.protocol import apply_view_update, view_update
from tests.fold.script import Script, one


def test_the_lowest_active_rank_saves_and_its_death_fails_over_to_the_next():
    s = Script()
    s.form(world_size=4)
    assert s.m.current_view("g").checkpoint_rank == 0
    s.at(1).death(0)
    view = one(s.ack_all(), ViewCommitted).view
    assert (view.active_ranks, view.checkpoint_rank) == ((1, 2, 3), 1)


def test_a_pinned_rank_saves_while_it_lives_then_the_lowest_live_one_does():
    s = Script()
    s.form(world_size=4, checkpoint_rank=2)
    assert s.m.current_view("g").checkpoint_rank == 2
    s.at(1).death(0)
    assert one(s.ack_all(), ViewCommitted).view.checkpoint_rank == 2  # rank 0 is not the pin
    s.at(2).death(2)
    view = one(s.ack_all(), ViewCommitted).view
    assert (view.active_ranks, view.checkpoint_rank) == ((1, 3), 1)
    # Its replacement rejoins and is activated: the pin saves again.
    s.at(3).join(2, incarnation="g-2-b")
    s.links(2)
    s.propose("activate", [2])
    view = one(s.ack_all(), ViewCommitted).view
    assert (view.active_ranks, view.checkpoint_rank) == ((1, 2, 3), 2)


def test_shutdown_with_save_names_a_live_checkpoint_rank():
    s = Script()
    s.form(world_size=4, checkpoint_rank=0, max_failure=1, auto_deactivate_on_failure=False)
    shutdown = one(s.at(1).death(0), ShutdownWithSave)
    assert shutdown.reason == "max_failure_exceeded" and shutdown.checkpoint_rank == 1


def test_the_checkpoint_rank_travels_in_the_view_delta():
    s = Script()
    s.form(world_size=4, checkpoint_rank=3)
    view = s.m.current_view("g")
    update = view_update(None, view)
    assert update.checkpoint_rank == 3
    assert apply_view_update(None, update, 4).checkpoint_rank == 3


@pytest.mark.parametrize("value", [-1, 4, "1", 1.5, True])
def test_a_checkpoint_rank_outside_the_group_is_refused_naming_the_field(value):
    with pytest.raises(ConfigError, match="checkpoint_rank"):
        GroupConfig.from_request({"world_size": 4, "checkpoint_rank": value})


def test_a_config_without_a_pin_reads_as_before():
    assert "checkpoint_rank" not in GroupConfig.from_request({"world_size": 4}).to_dict()
    pinned = GroupConfig.from_request({"world_size": 4, "checkpoint_rank": 1})
    assert pinned.to_dict()["checkpoint_rank"] == 1


def test_every_shutdown_names_the_failover_checkpoint_rank_of_the_view_in_force():
    """The backend's floor: the lowest rank died (view 2 names rank 1), then rank 1 died too:
    the one survivor, rank 2, is the rank that saves."""
    s = Script()
    s.form(world_size=3, backend="nccl")
    s.at(1).death(0)
    assert one(s.ack_all(), ViewCommitted).view.checkpoint_rank == 1
    shutdown = one(s.at(2).death(1), ShutdownWithSave)
    assert (shutdown.reason, shutdown.checkpoint_rank) == ("single_survivor", 2)


def test_a_run_ended_by_the_operator_names_the_checkpoint_rank_too():
    s = Script()
    s.form(world_size=4, checkpoint_rank=0)
    s.at(1).death(0)
    assert one(s.ack_all(), ViewCommitted).view.checkpoint_rank == 1
    shutdown = one(s.at(2).record("group_ended", "g", None, {}), ShutdownWithSave)
    assert (shutdown.reason, shutdown.checkpoint_rank) == ("ended", 1)
