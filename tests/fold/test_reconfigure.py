"""torch's reconfigure as a proposal (coordinator/fold/reconfigure.py): the members' calls of one
uuid make one proposal, its admission, its view, and every refusal (each with its twin)."""

from __future__ import annotations

from typing import Any

from foldplane.coordinator.fold.effects import (
    HEALTHY,
    ProposalAccepted,
    ProposalResolved,
    Refused,
    ViewCommitted,
    ViewPrepare,
)
from foldplane.coordinator.fold.machine import Coordinator
from tests.fold.script import Script, encode, of, one


def call(
    s: Script,
    caller: int,
    uuid: int,
    ranks: list[int],
    *,
    incarnations: list[str] | None = None,
    group: str = "g",
    **extra: Any,
) -> list[Any]:
    """Rank ``caller``'s call of reconfigure(uuid, handles of ``ranks`` in that order)."""
    payload = {
        "op": "reconfigure",
        "ranks": ranks,
        "incarnations": incarnations or [s.inc(r, group) for r in ranks],
        "uuid": uuid,
        "caller": caller,
        "proposer": f"rank:{caller}",
        **extra,
    }
    refusal = s.m.check("proposal", group, None, payload)
    effects = s.record("proposal", group, None, payload)
    # check() and step() never disagree
    assert (refusal is None) == (of(effects, Refused) == []), (refusal, effects)
    return effects


def all_call(s: Script, uuid: int, ranks: list[int], **extra: Any) -> list[Any]:
    out: list[Any] = []
    for r in ranks:
        out += call(s, r, uuid, ranks, **extra)
    return out


def test_the_members_calls_of_one_uuid_make_one_proposal_and_one_view():
    s = Script()
    s.form(world_size=3)
    effects = call(s, 0, 7, [2, 0, 1])
    first = one(effects, ProposalAccepted).proposal
    assert (first.op, first.ranks, first.uuid, first.callers) == ("reconfigure", (2, 0, 1), 7, (0,))
    assert of(effects, ViewPrepare) == []  # members 1 and 2 have not called
    effects = call(s, 2, 7, [2, 0, 1])
    joined = one(effects, ProposalAccepted).proposal
    assert joined.id == first.id and joined.callers == (0, 2)
    assert of(effects, ViewPrepare) == []
    effects = call(s, 1, 7, [2, 0, 1])
    prepare = one(effects, ViewPrepare)
    assert prepare.active_ranks == (0, 1, 2)  # the same ranks as view 1: a new view all the same
    assert prepare.cause["kind"] == "reconfigure"
    assert prepare.cause["uuid"] == 7 and prepare.cause["order"] == [2, 0, 1]
    assert prepare.cause["proposals"] == [first.id]
    effects = s.ack_all()
    view = one(effects, ViewCommitted).view
    assert view.version == 2 and view.cause == prepare.cause
    p = one(effects, ProposalResolved).proposal
    assert (p.id, p.status, p.version, p.callers) == (first.id, "applied", 2, (0, 2, 1))


def test_a_shrink_commits_the_members_and_leaves_the_others_out():
    s = Script()
    s.form(world_size=3)
    all_call(s, 9, [0, 2])
    view = one(s.ack_all(), ViewCommitted).view
    assert view.active_ranks == (0, 2) and view.cause["order"] == [0, 2]
    # rank 1 stays HEALTHY outside the view: a later reconfigure may take it in again
    assert s.m.group_status("g")["ranks"][1]["state"] == HEALTHY
    all_call(s, 10, [0, 1, 2])
    assert one(s.ack_all(), ViewCommitted).view.active_ranks == (0, 1, 2)


def test_disjoint_singletons_commit_one_after_another():
    s = Script()
    s.form(world_size=3)
    versions = []
    for r in (1, 0, 2):
        call(s, r, 600 + r, [r])
        view = one(s.ack_all(), ViewCommitted).view
        versions.append((view.version, view.active_ranks))
    assert versions == [(2, (1,)), (3, (0,)), (4, (2,))]


def test_the_same_call_sent_again_is_answered_with_the_proposal_and_nothing_is_logged():
    s = Script()
    s.form(world_size=3)
    call(s, 0, 5, [0, 1], call="c-0")
    pid = s.offset
    payload = {
        "op": "reconfigure",
        "ranks": [0, 1],
        "incarnations": [s.inc(0), s.inc(1)],
        "uuid": 5,
        "caller": 0,
        "call": "c-0",
    }
    assert s.m.repeat_of("proposal", "g", None, payload) == pid
    assert s.m.check("proposal", "g", None, payload).code == "duplicate_proposal"
    # twins: another member's first call is no repeat; nor is another call of the same member
    assert s.m.repeat_of("proposal", "g", None, {**payload, "caller": 1}) is None
    assert s.m.check("proposal", "g", None, {**payload, "caller": 1}) is None
    again = {**payload, "call": "c-0-later"}
    assert s.m.repeat_of("proposal", "g", None, again) is None
    refused = s.m.check("proposal", "g", None, again)
    assert refused.code == "reconfigure_uuid_used" and "already called" in refused.message
    # and after the outcome, the same call sent again still names the proposal (a lost answer)
    call(s, 1, 5, [0, 1])
    s.ack_all()
    assert s.m.proposal(pid).status == "applied"
    assert s.m.proposal(pid).calls == ("c-0", None)
    assert s.m.repeat_of("proposal", "g", None, payload) == pid
    # while a call without an id is never the same call: a reused uuid
    assert s.m.repeat_of("proposal", "g", None, {**payload, "call": None}) is None
    refused = s.m.check("proposal", "g", None, {k: v for k, v in payload.items() if k != "call"})
    assert refused.code == "reconfigure_uuid_used" and "applied in version 2" in refused.message


def test_the_same_uuid_with_other_members_is_a_conflict_naming_both():
    s = Script()
    s.form(world_size=3)
    call(s, 0, 5, [0, 1])
    effects = call(s, 1, 5, [1, 0])  # the same ranks in another order: another configuration
    refused = one(effects, Refused)
    assert refused.code == "idempotency_conflict"
    assert "[0 as g-0-a, 1 as g-1-a]" in refused.message
    assert "[1 as g-1-a, 0 as g-0-a]" in refused.message
    effects = call(s, 1, 5, [0, 1], incarnations=["g-0-a", "other"])
    assert one(effects, Refused).code in ("idempotency_conflict", "stale_incarnation")
    # twin: the same members join
    assert one(call(s, 1, 5, [0, 1]), ViewPrepare).active_ranks == (0, 1)


def test_a_used_uuid_is_refused_naming_its_view_or_its_rejection():
    s = Script()
    s.form(world_size=3)
    all_call(s, 11, [0, 1, 2])
    s.ack_all()
    effects = call(s, 0, 11, [0])
    refused = one(effects, Refused)
    assert refused.code == "reconfigure_uuid_used"
    assert "already used" in refused.message and "applied in version 2" in refused.message
    # a rejected one's uuid is used too
    call(s, 0, 12, [0, 1], timeout_s=1.0)
    s.at(2).tick()
    assert s.m.proposal_by_uuid("g", 12).status == "rejected"
    refused = one(call(s, 1, 12, [0, 1]), Refused)
    assert refused.code == "reconfigure_uuid_used" and "never called it" in refused.message
    # twin: a fresh uuid goes in
    assert of(call(s, 0, 13, [0]), Refused) == []


def test_a_rank_left_out_does_not_call():
    s = Script()
    s.form(world_size=3)
    refused = one(call(s, 2, 5, [0, 1]), Refused)
    assert (
        refused.code == "invalid_event" and "caller 2 is not one of the members" in refused.message
    )
    assert s.m.proposal_by_uuid("g", 5) is None  # the uuid stays free


def test_a_caller_speaks_as_its_current_incarnation():
    s = Script()
    s.form(world_size=3)
    refused = one(call(s, 1, 5, [0, 1], incarnations=["g-0-a", "old"]), Refused)
    assert refused.code == "stale_incarnation" and "g-1-a" in refused.message
    s.death(1)
    s.ack_all()
    refused = one(call(s, 1, 6, [0, 1]), Refused)
    assert refused.code == "rank_offline"


def test_a_handle_of_a_process_that_is_gone_rejects_at_once_naming_it():
    s = Script()
    s.form(world_size=3)
    old = s.inc(2)
    s.death(2)
    s.ack_all()  # the coordinator's own change: rank 2 leaves the view
    s.join(2, incarnation="g-2-b")
    s.links(2)
    effects = call(s, 0, 5, [0, 1, 2], incarnations=["g-0-a", "g-1-a", old])
    p = one(effects, ProposalResolved).proposal
    assert p.status == "rejected"
    assert f"rank 2's handle names incarnation {old}" in p.reason
    assert "is incarnation g-2-b now (rank_epoch 2)" in p.reason
    assert "fresh uuid" in p.reason


def test_a_reconfigure_queued_behind_a_death_is_checked_against_the_view_it_made():
    s = Script()
    s.form(world_size=3)
    s.death(2)  # the auto-deactivation is prepared and waits for ACKs
    change = s.m.group_status("g")["change_in_flight"]
    assert change["cause"]["kind"] == "auto_deactivation"
    effects = call(s, 0, 5, [0, 1, 2])
    assert of(effects, ViewPrepare) == [] and of(effects, ProposalResolved) == []
    call(s, 1, 5, [0, 1, 2])
    effects = s.ack_all()  # the coordinator's change commits first, then the head is decided
    assert one(effects, ViewCommitted).view.active_ranks == (0, 1)
    p = one(effects, ProposalResolved).proposal
    assert p.status == "rejected" and "rank 2 is OFFLINE (incarnation g-2-a)" in p.reason
    # the members left reconfigure with a fresh uuid
    all_call(s, 6, [0, 1])
    assert one(s.ack_all(), ViewCommitted).view.cause["uuid"] == 6


def test_members_that_never_call_are_named_at_the_deadline_and_the_view_stays():
    s = Script()
    s.form(world_size=3, admission_timeout_s=30.0)
    s.at(1)
    call(s, 0, 5, [0, 1, 2], timeout_s=4.0)
    call(s, 2, 5, [0, 1, 2])
    # its own timeout, counted from its first call
    assert s.m.next_deadline() == s.now + 4 * 1_000_000_000
    s.at(4.9)
    assert of(s.tick(), ProposalResolved) == []
    s.at(5)
    p = one(s.tick(), ProposalResolved).proposal
    assert p.status == "rejected"
    assert "members [1] never called it (called: [0, 2])" in p.reason
    assert "the last committed view (version 1) stays" in p.reason
    assert s.m.current_view("g").version == 1


def test_a_member_not_healthy_waits_then_is_named_with_its_state():
    s = Script()
    s.form(world_size=3, auto_deactivate_on_failure=False, reconcile_window_s=0)
    s.links(1, ready=False)  # rank 1 is SYNCED: not HEALTHY, still online
    assert s.m.group_status("g")["ranks"][1]["state"] == "SYNCED"
    all_call(s, 5, [0, 1], timeout_s=2.0)
    assert s.m.proposal_by_uuid("g", 5).status == "pending"
    s.at(3).tick()
    p = s.m.proposal_by_uuid("g", 5)
    assert p.status == "rejected" and "rank 1 is SYNCED" in p.reason
    # twin: once it is HEALTHY again, a fresh uuid is admitted
    s.links(1)
    all_call(s, 6, [0, 1])
    assert s.m.group_status("g")["change_in_flight"]["cause"]["uuid"] == 6


def test_duplicate_ranks_are_logged_and_rejected():
    s = Script()
    s.form(world_size=3)
    effects = call(s, 0, 5, [0, 0])
    p = one(effects, ProposalResolved).proposal
    assert p.status == "rejected" and "named more than once" in p.reason


def test_a_member_lost_during_the_barrier_applies_with_dropped_ranks():
    s = Script()
    s.form(world_size=3)
    all_call(s, 5, [0, 1, 2])
    s.ack(0, 2)
    s.ack(1, 2)
    effects = s.death(2)
    view = one(effects, ViewCommitted).view
    assert view.active_ranks == (0, 1) and view.dropped_ranks == (2,)
    p = one(effects, ProposalResolved).proposal
    assert p.status == "applied_with_dropped_ranks" and p.dropped_ranks == (2,)


def test_a_reconfigure_never_rides_along_with_another_change():
    s = Script()
    s.form(world_size=3)
    s.propose("deactivate", [2])  # in flight: active [0, 1]
    effects = all_call(s, 5, [0, 1])
    assert of(effects, ProposalResolved) == []
    effects = s.ack_all()
    assert [v.view.version for v in of(effects, ViewCommitted)] == [2]
    assert one(effects, ViewPrepare).cause["uuid"] == 5  # its own change, next
    assert one(s.ack_all(), ViewCommitted).view.version == 3


def test_malformed_calls_are_refused_and_never_logged():
    s = Script()
    s.form(world_size=3)
    good = {
        "op": "reconfigure",
        "ranks": [0, 1],
        "incarnations": [s.inc(0), s.inc(1)],
        "uuid": 5,
        "caller": 0,
    }
    bad = [
        ({**good, "incarnations": [s.inc(0)]}, "incarnations must be a list of 2"),
        ({**good, "incarnations": [s.inc(0), ""]}, "incarnations[1]"),
        ({**good, "uuid": "5"}, "uuid must be a signed 64-bit integer"),
        ({**good, "uuid": 2**63}, "uuid must be a signed 64-bit integer"),
        ({**good, "uuid": True}, "uuid must be a signed 64-bit integer"),
        ({**good, "caller": None}, "caller must be"),
        ({**good, "timeout_s": -1}, "timeout_s"),
        ({**good, "timeout_s": float("nan")}, "timeout_s"),
        ({**good, "idempotency_key": "k"}, "no idempotency_key"),
        ({**good, "call": ""}, "call must be a non-empty string"),
        ({**good, "call": 7}, "call must be a non-empty string"),
        ({"op": "activate", "ranks": [1], "uuid": 5}, "uuid belong to a reconfigure"),
    ]
    for payload, words in bad:
        refused = s.m.check("proposal", "g", None, payload)
        assert refused is not None and refused.code == "invalid_event", payload
        assert words in refused.message, (words, refused.message)
    assert s.m.check("proposal", "g", None, good) is None  # twin


def test_replay_and_snapshot_reproduce_the_reconfigures_exactly():
    s = Script()
    s.form(world_size=3)
    live = []
    live += all_call(s, 1, [2, 0])
    live += s.ack_all()
    snap_at = len(s.records)
    snapshot = s.m.snapshot()
    live += call(s, 0, 2, [0, 1], timeout_s=1.0)
    live += call(s, 0, 1, [0])  # a used uuid
    live += s.at(2).tick()
    live += call(s, 1, 3, [1])
    live += s.ack_all()
    again = Script(Coordinator())
    replayed = []
    for rec in s.records:
        replayed += again.m.step(rec)
    assert encode(replayed[-len(live) :]) == encode(live)
    restored = Coordinator.from_snapshot(snapshot)
    tail = []
    for rec in s.records[snap_at:]:
        tail += restored.step(rec)
    assert restored.snapshot() == s.m.snapshot() == again.m.snapshot()
    assert restored.proposal_by_uuid("g", 2).status == "rejected"


def test_a_snapshot_without_reconfigures_reads_as_before():
    s = Script()
    s.form(world_size=3)
    s.propose("deactivate", [2])
    snapshot = s.m.snapshot()
    assert all("uuids" not in g for g in snapshot["groups"])
    assert all(
        set(p) >= {"id", "op"} and not {"uuid", "callers", "incarnations", "timeout_s"} & set(p)
        for p in snapshot["proposals"]
    )
