"""Ending a group (``group_ended``): the run stops, nothing joins it again, its history stays.

Each guard has a twin: a running group accepts what an ended one refuses."""

from __future__ import annotations

from foldplane.coordinator.fold.effects import (
    OFFLINE,
    GroupEnded,
    ProposalResolved,
    Refused,
    ShutdownWithSave,
    ViewCommitted,
)
from foldplane.coordinator.fold.machine import Coordinator
from foldplane.wire.codes import GROUP_ENDED
from tests.fold.script import Script, of, one


def end(s: Script, group: str = "g", **payload: object) -> list:
    return s.record("group_ended", group, None, dict(payload))


def test_ending_a_formed_group_stops_its_ranks_without_counting_failures():
    s = Script()
    s.form(world_size=4)
    effects = end(s, reason="rerun")
    shutdown = one(effects, ShutdownWithSave)
    assert (shutdown.reason, shutdown.detail) == ("ended", "rerun")
    ended = one(effects, GroupEnded)
    assert (ended.reason, ended.deleted) == ("rerun", False)
    status = s.m.group_status("g")
    assert [r["state"] for r in status["ranks"]] == [OFFLINE] * 4
    assert status["failures"] == 0
    assert status["ended"] == {
        "reason": "rerun",
        "offset": s.offset,
        "deleted": False,
        "finished": False,
    }
    assert s.m.next_deadline() is None  # nothing waits on an ended group
    assert of(effects, ViewCommitted) == []


def test_an_ended_group_refuses_joins_and_a_new_creation_naming_what_to_do():
    s = Script()
    s.form(world_size=2)
    end(s)
    refused = one(s.join(0, incarnation="new"), Refused)
    assert refused.code == GROUP_ENDED
    assert "was ended" in refused.message and "another group name" in refused.message
    again = s.m.check("group_created", "g", None, {"world_size": 2, "config": {}})
    assert again is not None and again.code == GROUP_ENDED
    assert s.m.repeat_of("group_created", "g", None, {"world_size": 2, "config": {}}) is None


def test_twin_a_running_group_takes_a_new_incarnation_and_repeats_its_creation():
    s = Script()
    s.form(world_size=2)
    s.exit(0)
    assert of(s.join(0, incarnation="new"), Refused) == []
    assert s.m.repeat_of("group_created", "g", None, {"world_size": 2, "config": {}}) is not None


def test_ending_rejects_queued_proposals_and_drops_the_change_in_flight():
    s = Script()
    s.form(world_size=4)
    s.propose("deactivate", [3])  # prepared: in flight
    s.propose("deactivate", [2])  # queued behind it
    effects = end(s)
    reasons = sorted(p.proposal.reason for p in of(effects, ProposalResolved))
    assert len(reasons) == 2 and all(
        p.proposal.status == "rejected" for p in of(effects, ProposalResolved)
    )
    assert any("before version 2 committed" in r for r in reasons)
    assert s.m.group_status("g")["change_in_flight"] is None


def test_ending_again_changes_nothing_and_delete_marks_it_once():
    s = Script()
    s.form(world_size=2)
    first = end(s)
    assert s.m.repeat_of("group_ended", "g", None, {}) == s.offset
    assert s.m.repeat_of("group_ended", "g", None, {"delete": True}) is None
    effects = end(s, delete=True)
    assert one(effects, GroupEnded).deleted and of(effects, ShutdownWithSave) == []
    assert s.m.group_deleted("g")
    assert s.m.repeat_of("group_ended", "g", None, {"delete": True}) is not None
    assert one(first, GroupEnded).deleted is False


def test_an_ended_group_survives_a_snapshot():
    s = Script()
    s.form(world_size=2)
    end(s, delete=True)
    restored = Coordinator.from_snapshot(s.m.snapshot())
    assert restored.snapshot() == s.m.snapshot()
    assert restored.group_deleted("g") and restored.group_status("g")["ended"]["deleted"]


def test_a_malformed_ending_is_refused():
    s = Script()
    s.form(world_size=2)
    bad = s.m.check("group_ended", "g", None, {"delete": "yes"})
    assert bad is not None and "delete must be true or false" in bad.message
    assert s.m.check("group_ended", "nope", None, {}).code == "unknown_group"


# -- a run that finished: every rank that joined exited cleanly ---------------------------------


def test_the_last_clean_exit_finishes_the_run_and_nothing_joins_it_again():
    s = Script()
    s.form(world_size=2)
    assert of(s.exit(0), GroupEnded) == []  # one rank still runs
    effects = s.exit(1)
    ended = one(effects, GroupEnded)
    assert (ended.reason, ended.deleted) == ("finished: every rank exited cleanly", False)
    assert of(effects, ShutdownWithSave) == []  # nobody is left to save
    status = s.m.group_status("g")
    assert status["ended"]["finished"] and status["ended"]["offset"] == s.offset
    assert status["run"] == 1  # the offset of its group_created
    assert s.m.next_deadline() is None
    refused = one(s.join(0, incarnation="stray"), Refused)
    assert refused.code == GROUP_ENDED
    assert "finished" in refused.message and "another group name" in refused.message
    for kind, rank, payload in (
        ("heartbeat", 0, {"incarnation": "g-0-a"}),
        ("exit", 1, {"incarnation": "g-1-a"}),
        ("death_reported", 1, {}),
        ("proposal", None, {"op": "activate", "ranks": [0, 1]}),
        ("group_created", None, {"world_size": 2, "config": {}}),
        ("epoch_plan", None, {"epoch": 0, "dataset_size": 10}),
    ):
        refused = s.m.check(kind, "g", rank, payload)
        assert refused is not None and refused.code == GROUP_ENDED, (kind, refused)
    assert s.m.repeat_of("group_created", "g", None, {"world_size": 2, "config": {}}) is None


def test_twin_a_run_with_a_dead_rank_or_not_formed_does_not_finish():
    s = Script()
    s.form(world_size=3)
    s.death(2)
    s.exit(0)
    assert of(s.exit(1), GroupEnded) == []  # rank 2 died: a replacement may still come
    assert of(s.join(2, incarnation="replacement"), Refused) == []
    unformed = Script()
    unformed.create(world_size=2)
    unformed.join(0)
    assert of(unformed.exit(0), GroupEnded) == []  # never formed: not a finished run
    assert of(unformed.join(0, incarnation="again"), Refused) == []


def test_a_finished_run_can_still_be_deleted_and_survives_a_snapshot():
    s = Script()
    s.form(world_size=1)
    s.exit(0)
    effects = end(s, delete=True)
    assert one(effects, GroupEnded).deleted and of(effects, ShutdownWithSave) == []
    restored = Coordinator.from_snapshot(s.m.snapshot())
    assert restored.snapshot() == s.m.snapshot()
    assert restored.group_status("g")["ended"]["finished"]
    assert restored.check("join", "g", 0, {"incarnation": "x"}).code == GROUP_ENDED
