"""Clean exits during a view change: an exited rank is never reported as dropped, and no view
ever commits with empty ``active_ranks`` (when everyone leaves, the last view stays current)."""

from __future__ import annotations

from foldplane.coordinator.fold.effects import (
    OFFLINE,
    ProposalResolved,
    ShutdownWithSave,
    ViewCommitted,
    ViewPrepare,
)
from tests.fold.script import Script, of, one


def test_a_rank_that_exits_during_a_change_leaves_the_view_without_being_dropped():
    s = Script()
    s.form(world_size=4)
    assert one(s.exit(3), ViewPrepare).participants == (0, 1, 2)
    s.exit(2)  # awaited, then gone cleanly: not awaited any more, not dropped
    change = s.m.group_status("g")["change_in_flight"]
    assert (change["exited"], change["dropped"]) == ([2], [])
    effects = s.ack(0, 2) + s.ack(1, 2)
    view = one(effects, ViewCommitted).view
    assert view.active_ranks == (0, 1)
    assert (view.acked_ranks, view.dropped_ranks) == ((0, 1), ())
    assert of(effects, ShutdownWithSave) == []


def test_a_rank_that_dies_during_a_change_is_still_dropped():
    """The twin of the test above: a death, unlike an exit, is a drop."""
    s = Script()
    s.form(world_size=4)
    s.exit(3)
    s.death(2)
    effects = s.ack(0, 2) + s.ack(1, 2)
    view = one(effects, ViewCommitted).view
    assert (view.active_ranks, view.dropped_ranks) == ((0, 1), (2,))


def test_a_proposal_carried_by_a_change_a_rank_exited_from_is_applied_naming_it():
    s = Script()
    s.form(world_size=3)
    s.propose("deactivate", [0])
    s.exit(2)
    effects = s.ack(0, 2) + s.ack(1, 2)
    resolved = one(effects, ProposalResolved).proposal
    assert (resolved.status, resolved.version, resolved.dropped_ranks) == ("applied", 2, ())
    assert "exited cleanly before it committed: [2]" in resolved.reason
    assert one(effects, ViewCommitted).view.active_ranks == (1,)


def test_when_every_worker_exits_the_last_view_stays_and_nothing_is_lost():
    s = Script()
    s.form(world_size=2)
    effects = s.exit(0)
    assert one(effects, ViewPrepare).active_ranks == (1,)
    effects = s.exit(1)
    assert of(effects, ViewCommitted) == [] and of(effects, ShutdownWithSave) == []
    view = s.m.current_view("g")
    assert (view.version, view.active_ranks) == (1, (0, 1))
    status = s.m.group_status("g")
    assert status["change_in_flight"] is None and status["failures"] == 0
    assert [r["state"] for r in status["ranks"]] == [OFFLINE, OFFLINE]
    assert all(r["exited"] for r in status["ranks"])
    assert s.m.next_deadline() is None


def test_when_every_worker_of_a_change_dies_no_empty_view_commits_and_the_group_shuts_down():
    """The twin of the test above, with deaths: still no empty view; the budget decides."""
    s = Script()
    s.form(world_size=2)
    s.death(0)
    effects = s.death(1)
    assert of(effects, ViewCommitted) == []
    assert one(effects, ShutdownWithSave).reason == "all_ranks_lost"
    assert s.m.current_view("g").active_ranks == (0, 1)


def test_when_the_new_view_empties_it_commits_for_the_live_ranks_that_acked():
    s = Script()
    s.form(world_size=2)
    s.propose("deactivate", [0])
    effects = s.ack(0, 2) + s.exit(1)
    view = one(effects, ViewCommitted).view
    assert (view.version, view.active_ranks, view.dropped_ranks) == (2, (0,), ())
    assert "so it keeps the live ranks [0]" in view.cause["detail"]
    rejected = one(effects, ProposalResolved).proposal
    assert rejected.status == "rejected"
    assert "every rank of version 2's active ranks [1] left before it committed" in rejected.reason
    assert "exited [1]" in rejected.reason and "version 2 keeps [0]" in rejected.reason


def test_a_proposal_withdrawn_with_its_change_is_rejected_naming_who_left():
    s = Script()
    s.form(world_size=2)
    s.propose("deactivate", [0])
    effects = s.death(0) + s.exit(1)
    assert of(effects, ViewCommitted) == []
    rejected = one(effects, ProposalResolved).proposal
    assert rejected.status == "rejected"
    assert "exited [1], dropped [0]" in rejected.reason
    assert "version 1 stays current" in rejected.reason


def test_a_view_change_that_removes_only_clean_exits_reads_as_a_clean_exit():
    """Issue 45: a clean exit is no failure, and the view change it causes says so (cause
    ``exit``, in ``wire.life``'s words), not ``auto_deactivation``."""
    s = Script()
    s.form(world_size=3)
    prepare = one(s.exit(2), ViewPrepare)
    assert prepare.cause == {"kind": "exit", "proposals": [], "detail": "ranks [2] exited cleanly"}
    effects = s.ack(0, 2) + s.ack(1, 2)
    assert one(effects, ViewCommitted).view.cause["kind"] == "exit"


def test_a_view_change_that_removes_a_death_is_still_an_auto_deactivation():
    """The twin of the test above: a death reads as one (``auto_deactivation``, the state)."""
    s = Script()
    s.form(world_size=3)
    prepare = one(s.death(2), ViewPrepare)
    assert prepare.cause == {
        "kind": "auto_deactivation",
        "proposals": [],
        "detail": "active ranks left the Healthy Set: 2 OFFLINE",
    }
