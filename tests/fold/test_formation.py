"""Group creation and formation: view 1 through the barrier, the deadline, the error."""

from __future__ import annotations

from foldplane.coordinator.fold.config import GroupConfig
from foldplane.coordinator.fold.effects import (
    GroupCreated,
    GroupFailed,
    ProposalResolved,
    Refused,
    ViewCommitted,
    ViewPrepare,
)
from tests.fold.script import T0, S, Script, of, one


def test_group_created_carries_the_validated_config():
    s = Script()
    created = one(s.create(world_size=4, max_failure="25%", backend="nccl"), GroupCreated)
    assert created.config == GroupConfig(world_size=4, max_failure="25%", backend="nccl")
    assert s.m.groups() == ["g"]
    assert s.m.group_status("g")["formation"] == {"status": "forming", "error": None}


def test_creating_an_identical_group_again_changes_nothing():
    s = Script()
    s.create(world_size=4, ack_timeout_s=5)
    before = s.m.snapshot()["groups"]
    assert s.create(world_size=4, ack_timeout_s=5.0) == []
    assert s.m.snapshot()["groups"] == before


def test_a_different_config_under_the_same_name_is_a_conflict():
    s = Script()
    s.create(world_size=4)
    refused = one(s.create(world_size=5), Refused)
    assert refused.code == "group_conflict" and "'g'" in refused.message
    assert s.m.group_config("g").world_size == 4
    assert s.m.check("group_created", "g", None, {"world_size": 4, "config": {}}) is None


def test_creating_a_group_again_repeats_its_creation_only_with_the_same_config():
    s = Script()
    s.create(world_size=4, ack_timeout_s=5)
    created = s.offset
    s.create(group="h", world_size=2)
    same = {"world_size": 4, "config": {"ack_timeout_s": 5.0}}
    assert s.m.repeat_of("group_created", "g", None, same) == created
    other = {"world_size": 4, "config": {"ack_timeout_s": 6}}
    assert s.m.repeat_of("group_created", "g", None, other) is None
    refused = s.m.check("group_created", "g", None, other)
    assert refused.code == "group_conflict"
    assert "ack_timeout_s: 5.0 (existing) vs 6.0" in refused.message
    assert s.m.repeat_of("group_created", "new", None, same) is None
    assert s.m.repeat_of("group_created", "g", 0, same) is None  # malformed: check words it
    assert s.m.repeat_of("group_created", "g", None, {"config": {}}) is None


def test_an_invalid_config_is_refused_naming_the_field():
    s = Script()
    refused = one(s.create(world_size=4, min_ranks=9), Refused)
    assert refused.code == "invalid_event" and "min_ranks" in refused.message
    assert s.m.groups() == []


def test_view_one_commits_through_the_barrier_once_every_rank_is_healthy():
    s = Script()
    s.create(world_size=3)
    for r in range(3):
        s.join(r)
    s.links(0)
    s.links(1)
    assert s.m.current_view("g") is None
    effects = s.links(2)
    prep = one(effects, ViewPrepare)
    assert (prep.version, prep.active_ranks, prep.participants) == (1, (0, 1, 2), (0, 1, 2))
    assert prep.cause == {
        "kind": "formation",
        "proposals": [],
        "detail": "3/3 ranks HEALTHY (min_ranks 3)",
    }
    assert prep.ack_deadline_ts == T0 + 30 * S
    assert s.ack(0, 1) == [] and s.ack(1, 1) == []
    view = one(s.ack(2, 1), ViewCommitted).view
    assert (view.version, view.active_ranks, view.healthy_set) == (1, (0, 1, 2), (0, 1, 2))
    assert view.acked_ranks == (0, 1, 2) and view.dropped_ranks == ()
    assert s.m.group_status("g")["formation"]["status"] == "formed"


def test_min_ranks_forms_with_the_healthy_set_so_far():
    s = Script()
    s.create(world_size=4, min_ranks=2)
    s.join(3)
    s.links(3)
    s.join(1)
    prep = one(s.links(1), ViewPrepare)
    assert prep.active_ranks == (1, 3)


def test_formation_deadline_fails_the_group_naming_the_missing_ranks():
    s = Script()
    s.create(world_size=4, formation_timeout_s=60, heartbeat_timeout_s=45)
    for r in (0, 1, 3):
        s.join(r)
        s.links(r)
    s.at(30)
    for r in (0, 1, 3):
        s.beat(r)
    assert s.m.next_deadline() == T0 + 60 * S  # the formation deadline comes first
    assert s.at(59.9).tick() == []
    effects = s.at(60).tick()
    failed = one(effects, GroupFailed)
    assert failed.missing_ranks == (2,)
    assert failed.reason.startswith("3/4 ranks HEALTHY") and "missing [2]" in failed.reason
    assert s.m.group_status("g")["formation"]["status"] == "failed"
    assert s.m.next_deadline() is None
    refused = one(s.beat(0), Refused)
    assert refused.code == "group_failed" and "missing [2]" in refused.message


def test_a_proposal_before_formation_waits_and_keeps_its_admission_deadline():
    s = Script()
    s.create(world_size=2, admission_timeout_s=10)
    s.propose("deactivate", [1])
    pid = s.offset
    assert s.m.proposal(pid).status == "pending"
    assert s.m.next_deadline() == T0 + 10 * S
    effects = s.at(10).tick()
    resolved = one(effects, ProposalResolved).proposal
    assert (resolved.id, resolved.status) == (pid, "rejected")
    assert "had not formed" in resolved.reason


def test_a_proposal_before_formation_is_decided_after_it():
    s = Script()
    s.create(world_size=3)
    s.propose("deactivate", [2])
    for r in range(3):
        s.join(r)
        s.links(r)
    effects = s.ack_all()
    assert one(effects, ViewCommitted).view.version == 1
    prep = one(effects, ViewPrepare)
    assert (prep.version, prep.active_ranks, prep.cause["proposals"]) == (2, (0, 1), [2])
    assert of(effects, ProposalResolved) == []
