"""Group configuration: defaults, validation that names the field, resolution to nanoseconds."""

from __future__ import annotations

import pytest

from foldplane.coordinator.fold.config import ConfigError, GroupConfig, failure_budget


def test_defaults_suit_a_real_job():
    cfg = GroupConfig.from_request({"group": "train", "world_size": 8})
    assert cfg == GroupConfig(world_size=8)
    r = cfg.resolve()
    assert r.heartbeat_timeout_ns == 10_000_000_000
    assert r.ack_timeout_ns == r.admission_timeout_ns == 30_000_000_000
    assert r.formation_timeout_ns == 300_000_000_000
    assert r.reconcile_window_ns == 250_000_000
    assert (r.min_ranks, r.min_active, r.max_failure) == (8, 1, None)
    assert (r.auto_deactivate, r.survivor_floor) == (True, 1)


def test_round_trip_through_json():
    cfg = GroupConfig.from_request(
        {"world_size": 4, "max_failure": "50%", "backend": "nccl", "reconcile_window_s": 0}
    )
    assert GroupConfig.from_request(cfg.to_dict()) == cfg
    assert cfg.resolve().survivor_floor == 2


@pytest.mark.parametrize(
    "request_body, field",
    [
        ({}, "world_size"),
        ({"world_size": 0}, "world_size"),
        ({"world_size": True}, "world_size"),
        ({"world_size": 4, "heartbeat_timeout_s": 0}, "heartbeat_timeout_s"),
        ({"world_size": 4, "ack_timeout_s": -1}, "ack_timeout_s"),
        ({"world_size": 4, "formation_timeout_s": float("inf")}, "formation_timeout_s"),
        ({"world_size": 4, "admission_timeout_s": "30"}, "admission_timeout_s"),
        ({"world_size": 4, "reconcile_window_s": -0.1}, "reconcile_window_s"),
        ({"world_size": 4, "min_ranks": 5}, "min_ranks"),
        ({"world_size": 4, "min_active": 0}, "min_active"),
        ({"world_size": 4, "max_failure": 0}, "max_failure"),
        ({"world_size": 4, "max_failure": "150%"}, "max_failure"),
        ({"world_size": 4, "max_failure": "lots"}, "max_failure"),
        ({"world_size": 4, "auto_deactivate_on_failure": 1}, "auto_deactivate_on_failure"),
        ({"world_size": 4, "backend": "mpi"}, "backend"),
        ({"world_size": 4, "heartbeat_timeout": 3}, "heartbeat_timeout"),
    ],
)
def test_bad_fields_are_named(request_body, field):
    with pytest.raises(ConfigError) as info:
        GroupConfig.from_request(request_body)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")


@pytest.mark.parametrize(
    "max_failure, world_size, budget",
    [(None, 8, None), (3, 8, 3), ("25%", 8, 2), ("25%", 10, 3), ("1%", 8, 1), ("100%", 5, 5)],
)
def test_failure_budget(max_failure, world_size, budget):
    assert failure_budget(max_failure, world_size) == budget
