"""The one place the decisions of the rules with a declared interface change the state.

Such a rule reads what it is handed (a group, the time, the options) and returns what it
decides as a small value, never a copy of the group (a group of 16,384 ranks copied per step
would cost more than the step). The machine hands the value here, where it changes the
group and adds the effects that tell of it:

- ``budget.Shutdown`` (``budget.budget_shutdown``): :func:`shut_down`, the group shut down,
  a stall forgotten, its queued proposals rejected;
- ``healthy_set.HealthyMoves`` (``healthy_set.healthy_moves``): :func:`move_healthy`, each
  moved rank HEALTHY or SYNCED;
- the ranks' decisions (``ranks.on_join``, ``on_links``, ``on_ack``, ``on_exit``,
  ``on_death_reported``, ``expired``), a stall's report (``stalls.StallReport``), the end of a
  run's (``ending.on_group_ended``, ``finish_if_done``), a proposal's arrival
  (``proposals.ProposalQueue.on_proposal``: ``Recorded``, ``Queued``), the head of the queue
  (``ProposalQueue.decide_head``: ``outcomes.Dequeued``, then ``Resolved`` or ``Prepared``),
  the heads a change takes along (``proposals.attach_heads``: ``Attached``), a prepare
  (``barrier.prepare``, ``form``, ``proposals.auto_deactivate``: ``Prepared``), a stall's end
  (``barrier.resolve_stall``: ``stalls.StallOver``), a commit (``barrier.ViewChange.commit``:
  ``Committed``, ``Withdrawn``), a failed formation (``formation.FormationFailed``), a resumed
  tick and a window's end (``deadlines.resumed``: ``Resumed``; ``window_closed``),
  proposals resolved (``outcomes.Resolved``, ``Rejected``) and a shutdown: :class:`Applier`,
  whose ``go_offline`` is the death chain every lost rank goes through.

A handler of the transition table returns its decisions in order, and an effect among them
is told as it is (:meth:`Applier.apply`). No rule changes a group itself: the machine's
``_settle`` and the tick's loop over the groups due (``deadlines.py``) ask the rules in
order and apply each one's decisions here before they ask the next.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from msgspec import UNSET

from ...eventlog.record import Record
from ...wire.codes import REJECTED
from .barrier import Committed, Prepared, Withdrawn
from .budget import Shutdown, budget_shutdown
from .deadlines import Resumed, WindowClosed
from .effects import (
    HEALTHY,
    OFFLINE,
    SYNCED,
    Effect,
    Proposal,
    ShutdownWithSave,
    ViewCommitted,
    ViewPrepare,
)
from .ending import Deleted, EndShutdown, RunEnd
from .facets import Facet, FoldContext
from .formation import FormationFailed
from .healthy_set import HealthyMoves
from .outcomes import Dequeued, Rejected, Resolved, resolve
from .proposals import Attached, Queued, Recorded, attach_heads
from .ranks import Acked, Evidence, Exited, Identified, Joined, Lost, SignOfLife
from .stalls import Stall, StallOver, StallReport
from .state import FAILED, FORMED, FORMING, Change, GroupState, rank_state


def enforce_budget(
    g: GroupState, proposals: dict[int, Proposal], record: Record, effects: list[Effect]
) -> None:
    """Judge the budget if a rank was lost or a view committed since it was last judged
    (``budget_due``), and apply its shutdown, if any."""
    if not g.budget_due:
        return
    g.budget_due = False
    shutdown = budget_shutdown(g)
    if shutdown is not None:
        shut_down(g, proposals, shutdown, record, effects)


def shut_down(
    g: GroupState,
    proposals: dict[int, Proposal],
    shutdown: Shutdown,
    record: Record,
    effects: list[Effect],
) -> None:
    """The group's one ``shutdown_with_save``; a stall is forgotten and the queued proposals
    are rejected."""
    reason = shutdown.reason
    g.shutdown = reason
    g.stall = None
    effects.append(
        ShutdownWithSave(
            group=g.name,
            reason=reason,
            detail=shutdown.detail,
            offset=record.offset,
            checkpoint_rank=shutdown.checkpoint_rank,
        )
    )
    while g.queue:
        pid, _ = g.queue.popleft()
        resolve(proposals, pid, REJECTED, None, f"group was shut down ({reason})", record, effects)


def move_healthy(g: GroupState, moves: HealthyMoves, effects: list[Effect]) -> None:
    """The Healthy Set decided: each moved rank HEALTHY or SYNCED, the evidence consumed."""
    g.dirty = False
    if moves.healthy is None:
        g.healthy -= moves.left
        g.healthy |= moves.joined
    else:
        g.healthy = moves.healthy
    g.healthy_is_all = moves.all_candidates
    g.touched.clear()
    ranks = g.ranks
    for rank in moves.left:
        ranks[rank].state = SYNCED
    for rank in moves.joined:
        ranks[rank].state = HEALTHY
    effects.extend(moves.effects)


class Applier:
    """Applies the decisions of the ranks' rules (and of a stall's report) to the group they
    are about, in the order they were decided; an effect among them is told as it is.

    It reads the fold's time (``fold.now``: a sign of life, a new stall) and tells the facets
    (``facets``, given ``fold``) of each rank lost or joined, as the fixed points of a step."""

    def __init__(
        self, fold: FoldContext, facets: tuple[Facet, ...], proposals: dict[int, Proposal]
    ) -> None:
        self._fold = fold
        self._facets = facets
        self._proposals = proposals
        self._apply: dict[type, Callable[[GroupState, Any, Any, list[Effect]], None]] = {
            SignOfLife: self._sign_of_life,
            Identified: self._identified,
            Lost: self._lost,
            Joined: self._joined,
            Evidence: self._evidence,
            Acked: self._acked,
            Exited: self._exited,
            StallReport: self._stall_report,
            StallOver: self._stall_over,
            Rejected: self._rejected,
            RunEnd: self._run_end,
            EndShutdown: self._end_shutdown,
            Deleted: self._deleted,
            Recorded: self._recorded,
            Queued: self._queued,
            Attached: self._attached,
            Prepared: self._prepared,
            Committed: self._committed,
            Withdrawn: self._withdrawn,
            Resolved: self._resolved,
            Dequeued: self._dequeued,
            Shutdown: self._shutdown,
            FormationFailed: self._formation_failed,
            Resumed: self._resumed,
            WindowClosed: self._window_closed,
        }

    def apply(self, g: Any, decisions: Iterable[Any], record: Any, effects: list[Effect]) -> None:
        """Apply ``decisions`` to ``g`` in order; tell each effect among them."""
        how = self._apply.get
        for decision in decisions:
            apply = how(type(decision))
            if apply is None:
                effects.append(decision)
            else:
                apply(g, decision, record, effects)

    def go_offline(
        self,
        g: GroupState,
        rank: int,
        reason: str,
        failure: bool,
        record: Any,
        effects: list[Effect],
        *,
        cause: str | None = None,
    ) -> None:
        """Every way a rank is lost ends here: heartbeat timeout, death report, a missed ACK,
        replacement by a new incarnation, and (with ``failure=False``) a clean exit.

        The rank goes OFFLINE, leaves the usable-edge graph and the Healthy Set, stops being
        awaited by the change in flight (dropped at once rather than at the ACK deadline, or,
        after a clean exit, leaving the view without being dropped), and a failure of a
        non-exited incarnation is counted once against ``max_failure``. Budget and
        auto-deactivation follow in ``_settle``.
        """
        info = g.ranks[rank]
        info.state = OFFLINE
        g.fence_epoch += 1
        info.last_heartbeat_ts = g.alive.pop(rank, info.last_heartbeat_ts)
        g.candidates.discard(rank)
        g.healthy.discard(rank)
        g.touched.add(rank)
        g.dirty = True
        if failure and not info.exited and not info.failure_counted:
            info.failure_counted = True
            g.failures += 1
            g.failed.append((rank, info.rank_epoch))
        g.budget_due = True
        change = g.change
        if change is not None and rank in change.waiting:
            change.waiting.discard(rank)
            (change.exited if info.exited else change.dropped).add(rank)
        effects.append(rank_state(g, rank, reason, record, cause=cause))
        for facet in self._facets:
            facet.rank_lost(self._fold, g, rank, record, effects)

    def _lost(self, g: GroupState, lost: Lost, record: Any, effects: list[Effect]) -> None:
        self.go_offline(g, lost.rank, lost.reason, lost.failure, record, effects, cause=lost.cause)

    def _sign_of_life(self, g: GroupState, d: SignOfLife, record: Any, effects: Any) -> None:
        self._touch(g, d.rank)

    def _touch(self, g: GroupState, rank: int) -> None:
        """Any input from the current online incarnation is a sign of life."""
        alive = g.alive
        alive[rank] = self._fold.now
        alive.move_to_end(rank)

    def _identified(self, g: GroupState, d: Identified, record: Any, effects: Any) -> None:
        info = g.ranks[d.rank]
        if d.host is not UNSET:
            info.host = d.host
        if d.pid is not UNSET:
            info.pid = d.pid

    def _joined(self, g: GroupState, d: Joined, record: Any, effects: list[Effect]) -> None:
        rank = d.rank
        info = g.ranks[rank]
        if d.new:
            info.incarnation = d.incarnation
            info.rank_epoch += 1
            info.failure_counted = False
            info.joined_version = g.version
            _forget_evidence_about(g, rank)
        info.state = SYNCED
        g.fence_epoch += 1
        info.exited = False
        _set_evidence(g, rank, frozenset(), False)
        self._touch(g, rank)
        effects.append(rank_state(g, rank, d.reason, record))
        if d.new:
            for facet in self._facets:
                facet.rank_joined(self._fold, g, rank, record, effects)

    def _evidence(self, g: GroupState, d: Evidence, record: Any, effects: Any) -> None:
        self._touch(g, d.rank)
        _set_evidence(g, d.rank, d.down, d.ready)
        if d.window_end is not None:
            g.window_end = d.window_end

    def _acked(self, g: GroupState, d: Acked, record: Any, effects: Any) -> None:
        change = g.change
        assert change is not None
        rank = d.rank
        change.acked.add(rank)
        change.waiting.discard(rank)
        alive = g.alive
        alive[rank] = self._fold.now
        alive.move_to_end(rank)

    def _exited(self, g: GroupState, d: Exited, record: Any, effects: Any) -> None:
        g.ranks[d.rank].exited = True

    def _stall_report(self, g: GroupState, d: StallReport, record: Any, effects: Any) -> None:
        stall = g.stall
        if stall is None or stall.version != d.version:
            stall = g.stall = Stall(d.version, d.retry, self._fold.now)
        stall.reports[d.rank] = (d.issued, d.completed)

    def _stall_over(self, g: GroupState, d: StallOver, record: Any, effects: Any) -> None:
        g.stall = None

    def _rejected(self, g: GroupState, d: Rejected, record: Any, effects: list[Effect]) -> None:
        for pid in d.pids:
            resolve(self._proposals, pid, REJECTED, None, d.reason, record, effects)
        if d.dequeue:
            queue = g.queue
            for _ in d.pids:
                queue.popleft()

    def _run_end(self, g: GroupState, d: RunEnd, record: Any, effects: Any) -> None:
        if d.finished:
            g.finished, g.stall = True, None
        g.ended, g.ended_offset, g.deleted = d.reason, record.offset, d.delete
        g.change, g.window_end = None, None

    def _end_shutdown(self, g: GroupState, d: EndShutdown, record: Any, effects: list) -> None:
        g.shutdown = "ended"
        effects.append(
            ShutdownWithSave(
                group=g.name,
                reason="ended",
                detail=d.detail,
                offset=record.offset,
                checkpoint_rank=d.checkpoint_rank,
            )
        )

    def _deleted(self, g: GroupState, d: Deleted, record: Any, effects: Any) -> None:
        g.deleted = True

    def _recorded(self, g: GroupState, d: Recorded, record: Any, effects: Any) -> None:
        proposal = d.proposal
        self._proposals[proposal.id] = proposal
        if d.new and proposal.uuid is not None:
            g.uuids[proposal.uuid] = proposal.id
        if d.new and proposal.idempotency_key is not None:
            g.keys[proposal.idempotency_key] = proposal.id

    def _queued(self, g: GroupState, d: Queued, record: Any, effects: Any) -> None:
        g.queue.append((d.pid, d.deadline))

    def _prepared(self, g: GroupState, d: Prepared, record: Any, effects: list) -> None:
        proposals = list(d.proposals)
        change = Change(
            d.version,
            d.active,
            d.participants,
            d.ack_deadline,
            d.kind,
            proposals,
            d.detail,
            d.extra,
        )
        g.change = change
        effects.append(
            ViewPrepare(
                group=g.name,
                version=change.version,
                active_ranks=change.active,
                participants=change.participants,
                ack_deadline_ts=change.ack_deadline,
                cause=change.cause(),
                offset=record.offset,
            )
        )
        if g.queue:  # the heads it already satisfies ride along
            self.apply(g, attach_heads(g, self._proposals), record, effects)

    def _committed(self, g: GroupState, d: Committed, record: Any, effects: list) -> None:
        view, base = d.view, g.view
        g.change = None
        g.view = view
        g.budget_due = True
        if g.formation == FORMING:
            g.formation = FORMED
        effects.append(ViewCommitted(view=view, offset=record.offset, base=base))
        for facet in self._facets:
            facet.view_committed(self._fold, g, view, base, record, effects)

    def _shutdown(self, g: GroupState, d: Shutdown, record: Any, effects: list) -> None:
        shut_down(g, self._proposals, d, record, effects)

    def _withdrawn(self, g: GroupState, d: Withdrawn, record: Any, effects: Any) -> None:
        g.change = None

    def _resolved(self, g: GroupState, d: Resolved, record: Any, effects: list) -> None:
        resolve(self._proposals, d.pid, d.status, d.version, d.reason, record, effects, d.dropped)

    def _dequeued(self, g: GroupState, d: Dequeued, record: Any, effects: Any) -> None:
        g.queue.popleft()

    def _attached(self, g: GroupState, d: Attached, record: Any, effects: Any) -> None:
        g.queue.popleft()
        g.change.proposals.append(d.pid)  # type: ignore[union-attr]

    def _formation_failed(self, g: GroupState, d: FormationFailed, record: Any, e: Any) -> None:
        g.formation = FAILED
        g.fence_epoch += 1
        for rank, last in g.alive.items():
            g.ranks[rank].last_heartbeat_ts = last
        g.alive.clear()  # a failed group tracks no more deadlines; its inputs are refused
        g.window_end = None
        g.formation_error = d.error

    def _resumed(self, g: GroupState, d: Resumed, record: Any, effects: Any) -> None:
        now, alive = d.now, g.alive
        for rank in alive:
            alive[rank] = now
        if d.ack_deadline is not None:
            g.change.ack_deadline = d.ack_deadline  # type: ignore[union-attr]
        g.queue = deque((pid, t) for (pid, _), t in zip(g.queue, d.admissions, strict=True))
        if g.stall is not None:  # its reports could not arrive either
            g.stall.first_ts = now

    def _window_closed(self, g: GroupState, d: WindowClosed, record: Any, effects: Any) -> None:
        g.window_end = None


def _set_evidence(g: GroupState, rank: int, down: frozenset[int], ready: bool) -> None:
    info = g.ranks[rank]
    if info.down == down and info.self_ready == ready:
        return
    info.down = down
    info.self_ready = ready
    if down:
        g.reporters.add(rank)
    else:
        g.reporters.discard(rank)
    if ready and info.state != OFFLINE:
        g.candidates.add(rank)
    else:
        g.candidates.discard(rank)
    g.touched.add(rank)
    g.dirty = True


def _forget_evidence_about(g: GroupState, rank: int) -> None:
    """A replacement process is new: other ranks' down evidence about the old one lapses."""
    for reporter in sorted(g.reporters):
        info = g.ranks[reporter]
        if rank in info.down:
            info.down = info.down - {rank}
            if not info.down:
                g.reporters.discard(reporter)
            g.dirty = True
