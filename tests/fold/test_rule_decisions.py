"""The rules with a declared interface, called directly with the values they read: each returns
its decision as a value and changes nothing; the machine's ``apply.py`` is what applies it."""

from __future__ import annotations

from msgspec import UNSET, structs

from foldplane.coordinator.fold import ending, ranks
from foldplane.coordinator.fold.admission import admission_problem
from foldplane.coordinator.fold.apply import Applier, move_healthy, shut_down
from foldplane.coordinator.fold.barrier import (
    Prepared,
    ViewChange,
    Withdrawn,
    form,
    missed_acks,
    prepare,
    resolve_stall,
)
from foldplane.coordinator.fold.budget import Shutdown, budget_shutdown
from foldplane.coordinator.fold.config import GroupConfig
from foldplane.coordinator.fold.deadlines import Resumed, WindowClosed, resumed, window_closed
from foldplane.coordinator.fold.effects import (
    HEALTHY,
    OFFLINE,
    SYNCED,
    GroupEnded,
    Proposal,
    RankState,
    ViewPrepare,
)
from foldplane.coordinator.fold.formation import FormationFailed, formation_failed
from foldplane.coordinator.fold.healthy_set import HealthyMoves, healthy_moves
from foldplane.coordinator.fold.outcomes import Dequeued, Rejected, Resolved
from foldplane.coordinator.fold.proposals import (
    Attached,
    ProposalQueue,
    Queued,
    attach_heads,
    auto_deactivate,
    expire_unformed_heads,
)
from foldplane.coordinator.fold.reconfigure import decide_reconfigure
from foldplane.coordinator.fold.stalls import Stall, StallOver, StallReport
from foldplane.coordinator.fold.state import Change, GroupState
from foldplane.eventlog.record import Record
from foldplane.wire.inputs import (
    DeathReportedInput,
    ExitInput,
    GroupEndedInput,
    JoinInput,
    LinksInput,
    ProposalInput,
)
from foldplane.wire.protocol import CAUSE_DEATH_REPORTED
from tests.fold.script import T0, Script

RECORD = Record(7, 0, 1, "links", "g", 0, {}, 0)


def of_rank(rank: int) -> Record:
    """A record of ``rank`` (the rules read its rank and offset; its input comes decoded)."""
    return Record(7, 0, 1, "links", "g", rank, {}, 0)


def group(world_size: int = 4, **config) -> GroupState:
    """A group as the fold keeps it, made by hand: every rank OFFLINE, nothing decided."""
    return GroupState("g", GroupConfig(world_size=world_size, **config), 0, 1)


def formed(world_size: int = 4, **config) -> GroupState:
    """A group the fold formed (every rank HEALTHY and active in version 1)."""
    s = Script()
    s.form(world_size=world_size, **config)
    return s.m.group_states["g"]


def as_data(g: GroupState) -> dict:
    return {**g.to_dict(), "touched": sorted(g.touched), "dirty": g.dirty}


# ------------------------------------------------------------------ the budget


def test_the_budget_decides_a_shutdown_at_max_failure_and_changes_nothing():
    g = formed(max_failure=2)
    g.failures, g.failed = 2, [(3, 1), (2, 1)]
    before = as_data(g)
    decision = budget_shutdown(g)
    assert decision == Shutdown(
        "max_failure_exceeded",
        "2 failed incarnations (rank@rank_epoch [3@1, 2@1]) reached max_failure 2 = 2",
        0,
    )
    assert as_data(g) == before and g.shutdown is None


def test_the_budget_decides_nothing_below_max_failure_or_once_shut_down():
    g = formed(max_failure=2)
    g.failures, g.failed = 1, [(3, 1)]
    assert budget_shutdown(g) is None
    g.failures, g.shutdown = 2, "ended"
    assert budget_shutdown(g) is None


def test_the_budget_decides_single_survivor_from_the_view_and_the_ranks_states():
    g = formed(world_size=2, backend="nccl")
    g.ranks[0].state = OFFLINE
    decision = budget_shutdown(g)
    assert decision is not None and decision.reason == "single_survivor"
    assert decision.detail == ("1 of active ranks [0, 1] left (lost [0]); backend nccl needs 2")
    assert decision.checkpoint_rank == 1  # rank 0 is OFFLINE: the lowest live one saves
    g.ranks[0].exited = True  # a clean exit is not a loss the floor counts
    assert budget_shutdown(g) is None


def test_a_shutdown_applied_rejects_the_queue_and_tells_of_it():
    g = formed()
    effects: list = []
    shut_down(g, {}, Shutdown("ended", "why", 2), RECORD, effects)
    assert g.shutdown == "ended" and g.stall is None
    [told] = effects
    assert (told.reason, told.detail, told.checkpoint_rank, told.offset) == ("ended", "why", 2, 7)


# ------------------------------------------------------------------ the Healthy Set


def candidates(g: GroupState, ranks: range) -> None:
    """``ranks`` online and self-ready: what join and links reports leave behind."""
    for r in ranks:
        g.ranks[r].state = SYNCED
        g.ranks[r].self_ready = True
        g.candidates.add(r)
        g.touched.add(r)
    g.dirty = True


def test_the_healthy_set_decides_who_joins_from_the_touched_candidates_and_changes_nothing():
    g = group()
    candidates(g, range(3))
    g.healthy_is_all = True  # no down edge yet: only the touched ranks are looked at
    before = as_data(g)
    moves = healthy_moves(g, RECORD)
    assert (moves.joined, moves.left, moves.healthy, moves.all_candidates) == (
        {0, 1, 2},
        set(),
        None,
        True,
    )
    assert [(e.rank, e.state, e.reason) for e in moves.effects] == [
        (r, HEALTHY, "in the Healthy Set (3 ranks)") for r in range(3)
    ]
    assert as_data(g) == before and g.healthy == set()


def test_a_down_edge_moves_the_lower_scoring_end_out_naming_the_link():
    g = group()
    candidates(g, range(4))
    effects: list = []
    move_healthy(g, healthy_moves(g, RECORD), effects)
    assert g.healthy == {0, 1, 2, 3} and len(effects) == 4
    g.ranks[3].down = frozenset({2})  # rank 3 reports its link to rank 2 down
    g.reporters.add(3)
    moves = healthy_moves(g, RECORD)
    assert moves == HealthyMoves(
        joined=set(),
        left={3},
        healthy={0, 1, 2},
        all_candidates=False,
        effects=(
            RankState(
                group="g",
                rank=3,
                state=SYNCED,
                incarnation=None,
                rank_epoch=0,
                reason="left the Healthy Set (3 ranks): links down to [2]",
                offset=7,
            ),
        ),
    )
    assert g.ranks[3].state == HEALTHY  # not yet: the machine applies the decision
    move_healthy(g, moves, effects)
    assert g.healthy == {0, 1, 2} and g.ranks[3].state == SYNCED and not g.dirty
    assert effects[-1] is moves.effects[0]


# ------------------------------------------------------------------ the ranks


def test_a_new_incarnation_of_an_online_rank_decides_its_loss_then_its_join():
    g = formed()
    before = as_data(g)
    join = JoinInput(incarnation="g-2-b", host="node7")
    decisions = ranks.on_join(g, of_rank(2), join, T0)
    assert decisions == [
        ranks.Identified(2, "node7", UNSET),
        ranks.Lost(2, "incarnation g-2-a replaced by g-2-b", True),
        ranks.Joined(2, "g-2-b", True, "joined as incarnation g-2-b (rank_epoch 2)"),
    ]
    assert as_data(g) == before  # the rule changed nothing: the machine applies it


def test_the_same_incarnation_joining_while_online_is_only_a_sign_of_life():
    g = formed()
    assert ranks.on_join(g, of_rank(1), JoinInput(incarnation="g-1-a"), T0) == [ranks.SignOfLife(1)]


def test_worse_evidence_opens_the_reconciliation_window_at_the_time_it_is_handed():
    g = formed()
    links = LinksInput(incarnation="g-0-a", self_ready=True, down=[3])
    before = as_data(g)
    window = g.cfg.reconcile_window_ns
    assert ranks.on_links(g, RECORD, links, T0 + 5) == [  # a sign of life too
        ranks.Evidence(0, frozenset({3}), True, T0 + 5 + window),
    ]
    g.window_end = T0 + 1  # a window already open: the evidence waits in it, none opens
    assert ranks.on_links(g, RECORD, links, T0 + 5)[-1].window_end is None
    g.window_end = None
    assert as_data(g) == before
    same = LinksInput(incarnation="g-0-a", self_ready=True)
    assert ranks.on_links(g, RECORD, same, T0) == [ranks.SignOfLife(0)]  # nothing new


def test_a_report_that_the_view_failed_blaming_nobody_is_a_stall_report():
    g = formed()
    links = LinksInput(incarnation="g-1-a", self_ready=True, failed=1, issued=7, completed=6)
    assert ranks.on_links(g, of_rank(1), links, T0) == [
        StallReport(rank=1, version=1, retry=False, issued=7, completed=6),
        ranks.SignOfLife(1),
    ]
    stale = LinksInput(incarnation="g-1-a", self_ready=True, failed=0)  # not the current view
    assert ranks.on_links(g, of_rank(1), stale, T0) == [ranks.SignOfLife(1)]


def test_exits_deaths_and_silence_decide_the_death_chain_and_whether_it_is_a_failure():
    g = formed()
    exit_, death = ExitInput(incarnation="g-3-a"), DeathReportedInput(reporter="launcher")
    assert ranks.on_exit(g, of_rank(3), exit_, T0) == (
        ranks.Exited(3),
        ranks.Lost(3, "exited cleanly", False),
    )
    assert ranks.on_death_reported(g, of_rank(3), death, T0) == (
        ranks.Lost(3, "death reported by launcher", True, CAUSE_DEATH_REPORTED),
    )
    timeout = g.cfg.heartbeat_timeout_ns
    last = dict(g.alive)
    assert ranks.expired(g, T0 + timeout - 1) == []
    lost = ranks.expired(g, T0 + timeout)
    assert [d.rank for d in lost] == list(last) and all(d.failure for d in lost)
    assert lost[0].reason == (
        f"heartbeat timeout: last sign of life at {T0}, deadline {T0 + timeout}"
    )
    assert dict(g.alive) == last
    g.ranks[3].state = OFFLINE
    assert ranks.on_death_reported(g, of_rank(3), death, T0) == ()  # already OFFLINE: nothing
    assert ranks.on_exit(g, of_rank(3), exit_, T0) == (ranks.Exited(3),)


def test_the_machine_applies_a_rules_decisions_in_order_through_the_death_chain():
    s = Script()
    s.form()
    g = s.m.group_states["g"]
    applier = Applier(s.m, (), {}).apply
    effects: list = []
    applier(g, (ranks.Exited(3), ranks.Lost(3, "exited cleanly", False)), RECORD, effects)
    [told] = effects
    assert (told.rank, told.state, told.reason) == (3, OFFLINE, "exited cleanly")
    assert g.ranks[3].exited and g.failures == 0 and 3 not in g.alive and g.budget_due
    applier(g, (ranks.Lost(2, "death reported", True),), RECORD, effects)
    assert g.failures == 1 and g.failed == [(2, 1)]


# ------------------------------------------------------------------ the end of a run


def test_the_operators_end_decides_the_shutdown_the_rejections_and_each_ranks_clean_exit():
    s = Script()
    s.form(world_size=3)
    s.propose("deactivate", [2])  # the change in flight
    s.propose("deactivate", [1])  # queued behind it
    g = s.m.group_states["g"]
    [carried] = g.change.proposals
    [(queued, _)] = g.queue
    before = as_data(g)
    decisions = ending.on_group_ended(g, RECORD, GroupEndedInput(reason="done"), T0)
    assert decisions[:4] == [
        ending.RunEnd("done", False, False),
        Rejected((carried,), "group ended before version 2 committed (done)"),
        ending.EndShutdown("done", 0),
        Rejected((queued,), "group was ended (done)", dequeue=True),
    ]
    assert decisions[4:-1] == [
        d
        for r in sorted(g.alive)
        for d in (ranks.Exited(r), ranks.Lost(r, "group ended: done", False))
    ]
    assert decisions[-1] == GroupEnded(group="g", reason="done", deleted=False, offset=7)
    assert as_data(g) == before  # the machine applies it


def test_ending_again_decides_only_the_delete():
    g = formed()
    g.ended = "done"
    again = ending.on_group_ended(g, RECORD, GroupEndedInput(delete=True), T0)
    assert again == [
        ending.Deleted(),
        GroupEnded(group="g", reason="done", deleted=True, offset=7),
    ]
    g.deleted = True
    assert ending.on_group_ended(g, RECORD, GroupEndedInput(), T0) == [
        GroupEnded(group="g", reason="done", deleted=True, offset=7)
    ]


def test_a_run_finishes_once_every_rank_that_joined_has_exited_without_a_shutdown():
    g = formed(world_size=2)
    assert not ending.finish_if_done(g, RECORD)  # ranks still online
    for r in (0, 1):
        g.ranks[r].exited = True
    g.alive.clear()
    assert ending.finish_if_done(g, RECORD) == [
        ending.RunEnd(ending.FINISHED, False, True),
        Rejected((), f"group was ended ({ending.FINISHED})", dequeue=True),
        GroupEnded(group="g", reason=ending.FINISHED, deleted=False, offset=7),
    ]


# ------------------------------------------------------------------ a proposal's arrival


def test_a_proposal_is_recorded_then_queued_until_its_admission_deadline():
    s = Script()
    s.form()
    g = s.m.group_states["g"]
    proposals: dict = {}  # what it reads besides the group: the proposals (none yet)
    queue = ProposalQueue(s.m, proposals, admission_problem)
    call = ProposalInput(op="deactivate", ranks=[3], idempotency_key="k1")
    before = as_data(g)
    decisions = queue.on_proposal(g, RECORD, call, T0)
    recorded, accepted, queued = decisions
    assert recorded.new and recorded.proposal.id == 7 and recorded.proposal.ranks == (3,)
    assert accepted.proposal is recorded.proposal and accepted.offset == 7
    assert queued == Queued(7, T0 + g.cfg.admission_timeout_ns)
    assert as_data(g) == before and proposals == {}  # the machine applies them
    g.shutdown = "max_failure_exceeded"
    *_, rejected = queue.on_proposal(g, RECORD, call, T0)
    assert rejected == Rejected((7,), "group was shut down (max_failure_exceeded)")


# ------------------------------------------------------------------ what a tick decides


def test_a_formation_that_fails_names_how_far_it_got_and_rejects_the_queue():
    s = Script()
    s.create(world_size=3)
    for r in (0, 1):
        s.join(r)
        s.links(r)
    s.propose("deactivate", [2])
    g = s.m.group_states["g"]
    before = as_data(g)
    failed, told, rejected = formation_failed(g, T0 + 5, RECORD)
    error = f"2/3 ranks HEALTHY by the formation deadline {T0 + 5} (min_ranks 3); missing [2]"
    assert failed == FormationFailed(error)
    assert (told.reason, told.missing_ranks, told.offset) == (error, (2,), 7)
    assert rejected == Rejected((g.queue[0][0],), f"group failed to form: {error}", dequeue=True)
    assert as_data(g) == before


def test_the_participants_that_missed_the_ack_deadline_are_lost_in_rank_order():
    s = Script()
    s.form()
    s.death(3)  # auto-deactivation prepares version 2 for ranks 0, 1, 2
    g = s.m.group_states["g"]
    deadline = g.change.ack_deadline
    s.ack(1, 2)
    assert missed_acks(g, deadline - 1) == []
    why = f"did not ACK version 2 by its deadline {deadline}"
    assert missed_acks(g, deadline) == [ranks.Lost(0, why, True), ranks.Lost(2, why, True)]


def proposal(pid: int, op: str, ranks: tuple[int, ...]) -> Proposal:
    return Proposal(
        id=pid,
        group="g",
        op=op,
        ranks=ranks,
        proposer=None,
        idempotency_key=None,
        status="pending",
        version=None,
        reason="queued",
        dropped_ranks=(),
        offset=pid,
        resolved_offset=None,
    )


def test_the_heads_a_change_in_flight_satisfies_ride_along_and_malformed_ones_are_rejected():
    s = Script()
    s.form(world_size=5)
    s.death(4)  # auto-deactivation prepares version 2 without rank 4
    g = s.m.group_states["g"]
    assert g.change.active == (0, 1, 2, 3) and not g.queue
    queued = {
        101: proposal(101, "deactivate", (4,)),  # the change in flight satisfies it
        102: proposal(102, "deactivate", (9,)),  # no rank 9 in a group of 5
        103: proposal(103, "deactivate", (3,)),  # a change of its own: it waits
        104: proposal(104, "deactivate", (4,)),  # behind one that waits: it waits too
    }
    g.queue.extend((pid, T0 + 30) for pid in queued)
    before = as_data(g)
    [attached, rejected] = attach_heads(g, queued)
    assert attached == Attached(101)
    assert rejected.pids == (102,) and rejected.dequeue and "9" in rejected.reason
    assert as_data(g) == before and [pid for pid, _ in g.queue] == [101, 102, 103, 104]


def test_before_formation_the_heads_past_their_admission_deadline_are_rejected_in_order():
    s = Script()
    s.create(world_size=3)
    g = s.m.group_states["g"]
    g.queue.extend([(11, T0 + 1), (12, T0 + 2), (13, T0 + 9)])
    assert expire_unformed_heads(g, T0) == []
    assert expire_unformed_heads(g, T0 + 2) == [
        Rejected((11,), f"group 'g' had not formed by the admission deadline {T0 + 1}", True),
        Rejected((12,), f"group 'g' had not formed by the admission deadline {T0 + 2}", True),
    ]
    assert len(g.queue) == 3


# ------------------------------------------------------------------ the commit


def test_a_complete_barrier_decides_the_view_and_each_carried_proposals_outcome():
    s = Script()
    s.form(world_size=4)
    g = s.m.group_states["g"]
    views = ViewChange(s.m)
    change = Change(2, (0, 1, 2), (0, 1, 2, 3), T0, "deactivate", [41], "by hand")
    change.acked, change.dropped, change.waiting = {0, 1, 3}, {2}, set()
    g.change = change
    before = as_data(g)
    committed, resolved = views.commit(g, RECORD)
    view = committed.view
    assert (view.version, view.active_ranks, view.acked_ranks) == (2, (0, 1), (0, 1, 3))
    assert view.dropped_ranks == (2,) and view.offset == 7
    assert resolved == Resolved(
        41,
        "applied_with_dropped_ranks",
        2,
        "committed in version 2; dropped ranks [2] (no ACK)",
        (2,),
    )
    assert as_data(g) == before and g.change is change  # the machine applies it
    change.acked, change.dropped = set(), {0, 1, 2, 3}  # nobody of either view is left
    withdrawn, rejected = views.commit(g, RECORD)
    assert withdrawn == Withdrawn() and rejected.pids == (41,)
    assert rejected.reason.endswith("; version 1 stays current")


# ------------------------------------------------------------------ the prepare


def test_formation_is_prepared_once_min_ranks_are_healthy_and_changes_nothing():
    g = group(world_size=4, min_ranks=3, ack_timeout_s=20)
    for rank in (0, 2):
        g.ranks[rank].state = HEALTHY
        g.healthy.add(rank)
    before = as_data(g)
    assert form(g, T0) is None
    g.ranks[3].state = HEALTHY
    g.healthy.add(3)
    before = as_data(g)
    assert form(g, T0) == Prepared(
        1,
        (0, 2, 3),
        (0, 2, 3),
        T0 + 20_000_000_000,
        "formation",
        (),
        "3/4 ranks HEALTHY (min_ranks 3)",
    )
    assert as_data(g) == before and g.change is None


def test_a_prepare_awaits_the_online_ranks_of_either_view_and_changes_nothing():
    g = formed(world_size=5, ack_timeout_s=20)
    g.ranks[4].state = OFFLINE  # active in the old view, but nobody to ACK
    before = as_data(g)
    prepared = prepare(g, (0, 1), "proposal", (9,), "proposal 9", T0, extra={"uuid": 5})
    assert prepared == Prepared(
        2, (0, 1), (0, 1, 2, 3), T0 + 20_000_000_000, "proposal", (9,), "proposal 9", {"uuid": 5}
    )
    assert as_data(g) == before and g.change is None


def test_a_prepare_applied_is_the_change_in_flight_and_takes_the_heads_it_satisfies():
    g = formed(world_size=4)
    queued = {51: proposal(51, "deactivate", (3,)), 52: proposal(52, "activate", (3,))}
    g.queue.extend((pid, T0 + 30) for pid in queued)
    effects: list = []
    decided = prepare(g, (0, 1, 2), "proposal", (50,), "by hand", T0)
    Applier(Script().m, (), queued).apply(g, (decided,), RECORD, effects)
    [told] = effects
    assert isinstance(told, ViewPrepare) and (told.version, told.active_ranks) == (2, (0, 1, 2))
    assert told.cause == {"kind": "proposal", "proposals": [50], "detail": "by hand"}
    change = g.change
    assert (change.version, change.participants, change.proposals) == (2, (0, 1, 2, 3), [50, 51])
    assert change.waiting == {0, 1, 2, 3} and [pid for pid, _ in g.queue] == [52]


def test_active_ranks_that_left_the_healthy_set_are_removed_never_emptying_the_view():
    g = formed(world_size=4, ack_timeout_s=20)
    assert auto_deactivate(g, T0) is None  # everyone active is HEALTHY
    g.healthy -= {1, 3}
    g.ranks[1].state, g.ranks[3].state = SYNCED, OFFLINE
    before = as_data(g)
    detail = "active ranks left the Healthy Set: 1 SYNCED, 3 OFFLINE"
    assert auto_deactivate(g, T0) == Prepared(
        2, (0, 2), (0, 1, 2), T0 + 20_000_000_000, "auto_deactivation", (), detail
    )
    g.ranks[1].state = OFFLINE
    g.ranks[1].exited = g.ranks[3].exited = True
    assert auto_deactivate(g, T0).detail == "ranks [1, 3] exited cleanly"
    assert auto_deactivate(g, T0).kind == "exit"
    g.healthy.clear()  # nobody active is left healthy: the group waits
    assert auto_deactivate(g, T0) is None
    g.healthy |= {0, 2}
    g.ranks[1].state = SYNCED
    g.ranks[1].exited = g.ranks[3].exited = False
    assert as_data(g) == before and g.change is None


# ------------------------------------------------------------------ a stall's end


def stalled(retry: bool, reports: dict, **config) -> GroupState:
    """A formed group whose view 1 failed blaming nobody, first reported at T0."""
    g = formed(world_size=4, ack_timeout_s=20, heartbeat_timeout_s=3, **config)
    g.stall = Stall(1, retry, T0)
    g.stall.reports.update(reports)
    return g


def test_a_stall_waits_for_its_reports_then_decides_a_retry_and_changes_nothing():
    g = stalled(False, {0: (7, 6), 1: (7, 6)})
    before = as_data(g)
    assert resolve_stall(g, RECORD, T0) == []  # two reports of four, the window still open
    over, retry = resolve_stall(g, RECORD, T0 + 250_000_000)  # the window passed
    assert over == StallOver() and isinstance(retry, Prepared)
    assert (retry.version, retry.active, retry.kind) == (2, (0, 1, 2, 3), "view_retry")
    assert as_data(g) == before and g.stall is not None and g.stall.version == 1


def test_a_failed_retry_removes_its_laggards_or_blames_them_or_shuts_the_group_down():
    everyone = {0: (9, 0), 1: (9, 0), 2: (4, 0), 3: (9, 0)}  # none completed on the retry
    g = stalled(True, everyone)
    before = as_data(g)
    over, removal = resolve_stall(g, RECORD, T0)
    assert over == StallOver() and (removal.active, removal.kind) == ((0, 1, 3), "view_failed")
    assert as_data(g) == before
    g = stalled(True, everyone, auto_deactivate_on_failure=False)
    over, blamed = resolve_stall(g, RECORD, T0)
    assert isinstance(blamed, RankState) and blamed.rank == 2
    assert blamed.reason.startswith("blamed: version 1 failed")
    g = stalled(True, {r: (9, 0) for r in range(4)})  # nobody issued fewer
    over, shutdown = resolve_stall(g, RECORD, T0)
    assert isinstance(shutdown, Shutdown) and shutdown.reason == "unresolved_view_failure"


def test_a_stall_of_a_view_no_longer_current_is_only_over():
    g = stalled(False, {})
    g.ranks[2].state = SYNCED  # an active rank left the Healthy Set: other rules decide
    assert resolve_stall(g, RECORD, T0) == [StallOver()]
    effects: list = []
    Applier(Script().m, (), {}).apply(g, [StallOver()], RECORD, effects)
    assert g.stall is None and effects == []


# ------------------------------------------------------------------ the head of the queue


def heads(s: Script, *queued: Proposal) -> tuple[GroupState, ProposalQueue]:
    """The group of ``s`` with ``queued`` in its queue (admission deadline T0 + 30 s each), and
    a queue that reads them."""
    g = s.m.group_states["g"]
    g.queue.extend((p.id, T0 + 30_000_000_000) for p in queued)
    return g, ProposalQueue(s.m, {p.id: p for p in queued}, admission_problem)


def test_the_head_of_the_queue_is_rejected_applied_at_once_or_prepared_and_changes_nothing():
    s = Script()
    s.form(world_size=4, min_active=3, ack_timeout_s=20)
    now = s.m.now
    g, queue = heads(s, proposal(61, "deactivate", (9,)))
    before = as_data(g)
    [rejected] = queue.decide_head(g)
    assert rejected.pids == (61,) and rejected.dequeue and "9" in rejected.reason
    assert as_data(g) == before
    g.queue.clear()
    g, queue = heads(s, proposal(62, "activate", (1, 2)))
    why = "no change needed: version 1 already has active ranks [0, 1, 2, 3]"
    assert queue.decide_head(g) == [Dequeued(62), Resolved(62, "applied", 1, why)]
    g.queue.clear()
    g, queue = heads(s, proposal(63, "deactivate", (2, 3)))
    [rejected] = queue.decide_head(g)
    assert rejected.reason.endswith("min_active is 3") and rejected.dequeue
    g.queue.clear()
    g, queue = heads(s, proposal(64, "deactivate", (3,)))
    before = as_data(g)
    assert queue.decide_head(g) == [
        Dequeued(64),
        Prepared(
            2,
            (0, 1, 2),
            (0, 1, 2, 3),
            now + 20_000_000_000,
            "proposal",
            (64,),
            "proposal 64: deactivate [3]",
        ),
    ]
    assert as_data(g) == before and [pid for pid, _ in g.queue] == [64]
    g.queue.clear()
    assert queue.decide_head(g) == []  # no head


def test_an_activation_not_admissible_waits_for_its_admission_deadline_then_is_rejected():
    s = Script()
    s.form(world_size=5)
    s.death(4)  # auto-deactivation: version 2 without rank 4
    s.ack_all()
    g, queue = heads(s, proposal(71, "activate", (4,)))
    before = as_data(g)
    assert queue.decide_head(g) == []  # rank 4 is OFFLINE: it waits
    s.m._now = T0 + 30_000_000_000  # the fold's time reaches its admission deadline
    [rejected] = queue.decide_head(g)
    assert rejected.dequeue and rejected.reason.startswith(
        f"not admissible by the admission deadline {T0 + 30_000_000_000}: "
    )
    assert as_data(g) == before


def test_a_reconfigure_at_the_head_waits_for_its_members_then_is_prepared_in_their_order():
    s = Script()
    s.form(world_size=3)
    g = s.m.group_states["g"]
    members = (2, 0)
    called = structs.replace(
        proposal(81, "reconfigure", members),
        uuid=5,
        incarnations=tuple(s.inc(r) for r in members),
        callers=(2,),
        calls=(None,),
    )
    before = as_data(g)
    deadline = T0 + 10
    assert decide_reconfigure(g, called, deadline, T0, admission_problem) == []  # 0 must call
    [late] = decide_reconfigure(g, called, deadline, deadline, admission_problem)
    assert late.pids == (81,) and late.dequeue and "members [0] never called it" in late.reason
    both = structs.replace(called, callers=(2, 0), calls=(None, None))
    target, detail, extra = decide_reconfigure(g, both, deadline, T0, admission_problem)
    assert (target, extra) == ((0, 2), {"uuid": 5, "order": [2, 0]})
    assert detail.startswith("proposal 81: reconfigure uuid 5 to members [2, 0] in that order")
    g.queue.append((81, deadline))
    dequeued, prepared = ProposalQueue(s.m, {81: both}, admission_problem).decide_head(g)
    assert dequeued == Dequeued(81)
    assert (prepared.active, prepared.kind, prepared.proposals) == ((0, 2), "reconfigure", (81,))
    assert prepared.extra == {"uuid": 5, "order": [2, 0]}
    g.queue.clear()
    gone = structs.replace(both, incarnations=("elsewhere", s.inc(0)))
    [rejected] = decide_reconfigure(g, gone, deadline, T0, admission_problem)
    assert rejected.dequeue and "rank 2's handle names incarnation elsewhere" in rejected.reason
    assert as_data(g) == before


# ------------------------------------------------------------------ the tick


def test_a_resumed_coordinator_restarts_what_waits_on_the_ranks_and_changes_nothing():
    s = Script()
    s.form(world_size=4, ack_timeout_s=20, admission_timeout_s=30)
    s.death(3)  # auto-deactivation: version 2 in flight
    g = s.m.group_states["g"]
    queued = {91: proposal(91, "deactivate", (2,))}
    g.queue.append((91, T0 + 1))
    g.stall = Stall(1, False, T0)
    now = T0 + 500_000_000_000
    before = as_data(g)
    decided = resumed(g, queued, now)
    assert decided == Resumed(now, now + 20_000_000_000, (now + 30_000_000_000,))
    assert as_data(g) == before
    Applier(s.m, (), queued).apply(g, (decided,), RECORD, [])
    assert set(g.alive.values()) == {now} and list(g.alive) == [0, 1, 2]
    assert g.change.ack_deadline == now + 20_000_000_000 and g.stall.first_ts == now
    assert list(g.queue) == [(91, now + 30_000_000_000)]


def test_the_reconciliation_window_closes_once_its_end_passed():
    g = formed(world_size=2)
    assert window_closed(g, T0) == []  # none open
    g.window_end = T0 + 5
    assert window_closed(g, T0 + 4) == []
    assert window_closed(g, T0 + 5) == [WindowClosed()]
    assert g.window_end == T0 + 5
