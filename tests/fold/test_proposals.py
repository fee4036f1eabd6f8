"""Proposals: FIFO queue, validation, deduplication, admission deadline, idempotency keys,
absorbing terminal states."""

from __future__ import annotations

from foldplane.coordinator.fold.effects import (
    HEALTHY,
    ProposalAccepted,
    ProposalResolved,
    Refused,
    ViewCommitted,
    ViewPrepare,
)
from tests.fold.script import T0, S, Script, of, one


def recovered(s: Script, rank: int, at: float) -> None:
    """Take ``rank`` out of the view, then bring a replacement to HEALTHY (but inactive)."""
    s.at(at).death(rank)
    s.ack_all()
    s.join(rank, incarnation=f"g-{rank}-b")
    s.links(rank)
    assert s.m.group_status("g")["ranks"][rank]["state"] == HEALTHY
    assert rank not in s.m.current_view("g").active_ranks


def test_eight_identical_activate_proposals_make_one_view_change_and_all_apply():
    s = Script()
    s.form(world_size=8)
    recovered(s, 3, at=1)
    version = s.m.current_view("g").version
    ids, effects = [], []
    for r in (0, 1, 2, 4, 5, 6, 7, 0):
        effects += s.propose("activate", [3], proposer=f"rank:{r}")
        ids.append(s.offset)
    assert len(of(effects, ProposalAccepted)) == 8
    assert len(of(effects, ViewPrepare)) == 1
    assert of(effects, ProposalResolved) == []
    effects = s.ack_all()
    view = one(effects, ViewCommitted).view
    assert view.version == version + 1 and 3 in view.active_ranks
    assert view.cause["proposals"] == ids
    resolved = [e.proposal for e in of(effects, ProposalResolved)]
    assert [p.id for p in resolved] == ids
    assert {(p.status, p.version) for p in resolved} == {("applied", version + 1)}
    # and once committed, another identical proposal needs no change: applied at once
    effects = s.propose("activate", [3])
    assert one(effects, ProposalResolved).proposal.version == version + 1
    assert s.m.current_view("g").version == version + 1


def test_no_change_needed_is_applied_at_once_with_the_current_version():
    s = Script()
    s.form(world_size=4)
    effects = s.propose("activate", [0, 1])
    p = one(effects, ProposalResolved).proposal
    assert (p.status, p.version, p.resolved_offset) == ("applied", 1, s.offset)
    assert "no change needed" in p.reason
    assert of(effects, ViewPrepare) == []


def test_activating_an_offline_rank_is_rejected_at_the_admission_deadline_naming_it():
    s = Script()
    s.form(world_size=4, admission_timeout_s=5)
    s.at(1).death(3)
    s.ack_all()
    effects = s.at(2).propose("activate", [3])
    assert of(effects, ProposalResolved) == []  # it may still come back: the head waits
    assert s.m.next_deadline() == T0 + 7 * S
    assert s.at(6.9).tick() == []
    p = one(s.at(7).tick(), ProposalResolved).proposal
    assert p.status == "rejected" and "rank 3 is OFFLINE" in p.reason
    assert str(T0 + 7 * S) in p.reason


def test_activating_a_synced_rank_is_rejected_naming_the_rank_and_its_state():
    s = Script()
    s.form(world_size=4, admission_timeout_s=5)
    recovered(s, 3, at=1)
    s.at(2).links(3, ready=False)
    s.at(3).tick()
    s.propose("activate", [3, 2])
    p = one(s.at(8).tick(), ProposalResolved).proposal
    assert p.status == "rejected" and "rank 3 is SYNCED" in p.reason
    assert "rank 2" not in p.reason


def test_a_waiting_head_is_admitted_when_its_ranks_become_healthy():
    s = Script()
    s.form(world_size=4)
    s.at(1).death(3)
    s.ack_all()
    s.propose("activate", [3])
    pid = s.offset
    s.at(2).join(3, incarnation="g-3-b")
    prep = one(s.links(3), ViewPrepare)
    assert prep.active_ranks == (0, 1, 2, 3) and prep.cause["proposals"] == [pid]


def test_proposals_are_decided_first_in_first_out():
    s = Script()
    s.form(world_size=4)
    s.propose("deactivate", [3])
    first = s.offset
    s.propose("deactivate", [2])
    second = s.offset
    effects = s.ack_all()
    assert one(effects, ViewCommitted).view.cause["proposals"] == [first]
    assert one(effects, ViewPrepare).cause["proposals"] == [second]
    view = one(s.ack_all(), ViewCommitted).view
    assert view.active_ranks == (0, 1)


def test_out_of_range_and_duplicate_ranks_are_logged_and_rejected():
    s = Script()
    s.form(world_size=4)
    p = one(s.propose("deactivate", [1, 7, 9]), ProposalResolved).proposal
    assert p.status == "rejected" and "[7, 9] are not in 0..3" in p.reason
    p = one(s.propose("activate", [2, 2]), ProposalResolved).proposal
    assert p.status == "rejected" and "[2] are named more than once" in p.reason


def test_a_deactivation_below_min_active_is_rejected():
    s = Script()
    s.form(world_size=3, min_active=2)
    p = one(s.propose("deactivate", [0, 1]), ProposalResolved).proposal
    assert p.status == "rejected"
    assert "would leave 1 active ranks [2]; min_active is 2" in p.reason


def test_malformed_proposals_are_refused_and_not_logged():
    s = Script()
    s.form(world_size=3)
    for payload, field in [
        ({"op": "grow", "ranks": [1]}, "op"),
        ({"op": "activate", "ranks": []}, "ranks"),
        ({"op": "activate", "ranks": ["1"]}, "ranks"),
        ({"op": "activate", "ranks": [1], "idempotency_key": ""}, "idempotency_key"),
    ]:
        refused = s.m.check("proposal", "g", None, payload)
        assert refused.code == "invalid_event" and field in refused.message
        assert one(s.record("proposal", "g", None, payload), Refused).code == "invalid_event"
        assert s.m.proposal(s.offset) is None


def test_an_idempotency_key_returns_the_same_proposal_and_another_body_conflicts():
    s = Script()
    s.form(world_size=4)
    s.propose("deactivate", [3], idempotency_key="k-17", proposer="sched")
    pid = s.offset
    assert s.m.proposal_by_key("g", "k-17").id == pid
    same = {"op": "deactivate", "ranks": [3], "idempotency_key": "k-17", "proposer": "sched"}
    refused = s.m.check("proposal", "g", None, same)
    assert refused.code == "duplicate_proposal" and f"proposal {pid}" in refused.message
    other = dict(same, ranks=[2])
    refused = s.m.check("proposal", "g", None, other)
    assert refused.code == "idempotency_conflict" and "k-17" in refused.message
    assert "this one is deactivate [2]" in refused.message
    # the host answers the same body with the proposal and appends nothing; never another body
    assert s.m.repeat_of("proposal", "g", None, same) == pid
    assert s.m.repeat_of("proposal", "g", None, dict(same, ranks=[3, 3])) == pid
    assert s.m.repeat_of("proposal", "g", None, other) is None
    assert s.m.repeat_of("proposal", "g", None, dict(same, proposer="other")) is None
    assert s.m.repeat_of("proposal", "g", None, dict(same, idempotency_key="k-18")) is None
    assert s.m.repeat_of("proposal", "g", None, dict(same, ranks=[])) is None  # malformed
    # a duplicate that reached the log anyway creates nothing new
    assert one(s.record("proposal", "g", None, same), Refused).code == "duplicate_proposal"
    assert s.m.proposal(s.offset) is None
    assert s.m.proposal_by_key("g", "k-17").id == pid
    assert s.m.proposal_by_key("other", "k-17") is None


def test_terminal_outcomes_never_change():
    s = Script()
    s.form(world_size=4)
    s.propose("deactivate", [3])
    pid = s.offset
    s.ack_all()
    applied = s.m.proposal(pid)
    assert applied.status == "applied"
    s.propose("activate", [3])
    s.ack_all()
    s.at(50).tick()
    assert s.m.proposal(pid) == applied


def test_a_proposal_on_a_shut_down_group_is_rejected():
    s = Script()
    s.form(world_size=2, max_failure=1)
    s.death(1)
    p = one(s.propose("activate", [0]), ProposalResolved).proposal
    assert p.status == "rejected" and "shut down (max_failure_exceeded)" in p.reason
