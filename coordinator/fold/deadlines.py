"""Time: the only clock the fold has is the ``tick`` record.

The rule. The host appends a tick once ``next_deadline()`` has passed; a tick fires every
deadline that is due, group by group in name order: heartbeat timeouts, the end of a
reconciliation window, missed ACKs, the formation deadline, admission deadlines; then each
facet's. Every deadline reported is one a tick at or after it resolves, so the host never spins.
A tick with ``{"resumed": true}`` says the coordinator (re)started serving: the deadlines that
wait on the ranks (heartbeats, ACKs, admissions) restart at its time, since the silence was the
coordinator's; the formation deadline and an open window keep running.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from ...eventlog.record import Record
from ...wire.inputs import TickInput
from .barrier import missed_acks, stall_deadline
from .capture import FoldChanges
from .effects import (
    Effect,
    Proposal,
)
from .facets import Facet, FoldContext
from .formation import formation_failed
from .proposals import admission_timeout_ns, expire_unformed_heads
from .ranks import expired
from .state import FORMED, FORMING, GroupState


class Deadlines:
    """The deadlines of every group and facet (see the module docstring).

    It reads the groups, the proposals (their admission deadlines), the facets (theirs) and
    the fold's time (``fold.now``); it changes no group itself. What a due deadline decides
    is a rule's, as decisions that ``apply`` applies: the deadlines restarted when the
    coordinator resumed (:func:`resumed`), ranks silent (``ranks.expired``), the window over
    (:func:`window_closed`), ranks not ACKing (``barrier.missed_acks``) lost, a formation
    failed (``formation.formation_failed``); then unformed heads rejected, and the step's
    decisions (``settle``, the machine's)."""

    def __init__(
        self,
        fold: FoldContext,
        groups: dict[str, GroupState],
        proposals: dict[int, Proposal],
        facets: tuple[Facet, ...],
        apply: Callable[[GroupState, Iterable[Any], Record, list[Effect]], None],
        settle: Callable[[GroupState, Record, list[Effect]], None],
        changes: FoldChanges,
    ) -> None:
        self._fold = fold
        #: what the fold's steps changed (the read model takes them): a tick notes each group
        #: whose deadline fell due (every group when it resumes)
        self._changes = changes
        self._groups = groups
        self._proposals = proposals
        self._facets = facets
        self._apply = apply
        self._settle = settle

    def next_deadline(self) -> int | None:
        """The earliest pending deadline (ns), or None. The host appends a tick once now >= it.

        Every deadline reported here is one that a tick at or after it resolves, so the host
        never spins on a deadline in the past.
        """
        best: int | None = None
        for g in self._groups.values():
            d = self._group_deadline(g)
            if d is not None and (best is None or d < best):
                best = d
        for facet in self._facets:
            d = facet.next_deadline()
            if d is not None and (best is None or d < best):
                best = d
        return best

    def waits_on_ranks(self) -> bool:
        """Whether a deadline waits on the ranks (an online rank's heartbeat, a change's ACKs,
        a queued proposal): what a resumed tick restarts, so a host that finds none need not
        append one."""
        return any(
            g.alive or g.change is not None or g.queue for g in self._groups.values()
        ) or any(f.waits_on_ranks() for f in self._facets)

    def on_tick(self, record: Record, tick: TickInput) -> list[Effect]:
        """Time passed: fire every deadline that is due, group by group in name order.

        A tick with payload ``{"resumed": true}`` says the coordinator (re)started serving: the
        deadlines that measure the ranks' silence restart first (see :func:`resumed`)."""
        effects: list[Effect] = []
        now = self._fold.now
        if tick.resumed is True:
            for name in sorted(self._groups):
                g = self._groups[name]
                self._apply(g, (resumed(g, self._proposals, now),), record, effects)
            for facet in self._facets:
                facet.resume(now)
            self._changes.groups.update(self._groups)
        for name in sorted(self._groups):
            g = self._groups[name]
            due = self._group_deadline(g)
            if due is None or due > now:
                continue
            self._changes.groups.add(name)
            self._apply(g, expired(g, now), record, effects)
            self._apply(g, window_closed(g, now), record, effects)
            self._apply(g, missed_acks(g, now), record, effects)
            if g.formation == FORMING and g.change is None and g.shutdown is None:
                deadline = g.created_ts + g.cfg.formation_timeout_ns
                if deadline <= now:
                    self._apply(g, formation_failed(g, deadline, record), record, effects)
            if g.formation == FORMING:
                self._apply(g, expire_unformed_heads(g, now), record, effects)
            self._settle(g, record, effects)
            if g.formation == FORMING and g.change is None and g.shutdown is None:
                deadline = g.created_ts + g.cfg.formation_timeout_ns
                if deadline <= now:  # this tick lost the formation change's last participant
                    self._apply(g, formation_failed(g, deadline, record), record, effects)
        for facet in self._facets:
            facet.tick(self._fold, record, effects)
        return effects

    def _group_deadline(self, g: GroupState) -> int | None:
        if g.ended is not None:  # a run that is over waits for nothing (ending.py)
            return None
        best: int | None = None

        def consider(t: int) -> None:
            nonlocal best
            if best is None or t < best:
                best = t

        if g.alive:
            consider(next(iter(g.alive.values())) + g.cfg.heartbeat_timeout_ns)
        if g.window_end is not None:
            consider(g.window_end)
        if g.change is not None:
            consider(g.change.ack_deadline)
        if g.formation == FORMING:
            if g.change is None and g.shutdown is None:
                consider(g.created_ts + g.cfg.formation_timeout_ns)
            if g.queue:
                consider(g.queue[0][1])
        elif (
            g.formation == FORMED
            and g.queue
            and g.change is None
            and g.window_end is None
            and g.shutdown is None
        ):
            consider(g.queue[0][1])
        if g.change is None and g.window_end is None and g.shutdown is None:
            stall = stall_deadline(g)
            if stall is not None:
                consider(stall)
        return best


class Resumed(msgspec.Struct, frozen=True, gc=False):
    """A decision: the coordinator resumed serving at ``now``. Each online rank's heartbeat
    deadline and a stall's wait for reports restart at ``now``, the change in flight waits for
    its ACKs until ``ack_deadline`` (None: no change in flight) and the queued proposals for
    their admission until ``admissions`` (in the queue's order)."""

    now: int
    ack_deadline: int | None
    admissions: tuple[int, ...]


def resumed(g: GroupState, proposals: dict[int, Proposal], now: int) -> Resumed:
    """The coordinator was not serving for a while (a restart, a failover): nobody could
    send a heartbeat, an ACK or a ready report to it, so silence during the outage is the
    coordinator's, not the ranks'. Every deadline that waits for the ranks restarts at the
    resumed tick's time ``now``: each online rank's heartbeat deadline, the ACK deadline of
    the change in flight, the admission deadlines of queued proposals and the wait for the
    reports of a view that failed with nobody blamed. The formation deadline (a bound on the
    whole start-up) and an open reconciliation window (a delay for more evidence, not a wait
    on anyone) keep running. It changes nothing."""
    ack_deadline = None if g.change is None else now + g.cfg.ack_timeout_ns
    admissions = tuple(now + admission_timeout_ns(g, proposals[pid]) for pid, _ in g.queue)
    return Resumed(now, ack_deadline, admissions)


class WindowClosed(msgspec.Struct, frozen=True, gc=False):
    """A decision: the reconciliation window is over; the Healthy Set is decided again."""


def window_closed(g: GroupState, now: int) -> list[WindowClosed]:
    """The reconciliation window closes once its end passed. It changes nothing."""
    window_end = g.window_end
    if window_end is not None and window_end <= now:
        return [WindowClosed()]
    return []
