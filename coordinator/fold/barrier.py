"""The view change: the barrier every change of ``active_ranks`` goes through.

The rule. One change is in flight per group at a time.

1. **Prepare.** ``view_prepare(version + 1)`` names the new active ranks and the
   *participants*: the online ranks active in the old view or the new one. Each participant
   must ACK that version by the ACK deadline.
2. **Commit.** Once every participant ACKed, was dropped (lost, or silent past the deadline)
   or exited, the version commits. Dropped and exited ranks leave the view; the proposals the
   change carries resolve ``applied``, or ``applied_with_dropped_ranks`` when some were
   dropped. A participant that is lost stops being awaited at once.
3. A view never commits with empty ``active_ranks``: if every rank of the new active set left
   first, the version commits for the participants of the old view that ACKed and are still
   online, or the change is withdrawn when none is (its proposals are rejected either way).

A prepare is a decision (:func:`prepare` returns ``Prepared``; ``apply.py`` makes it the
change in flight). Formation is the first change (:func:`form`, which ``_settle`` in
``machine.py`` asks, prepares it once ``min_ranks`` are HEALTHY); a group that does not get there by its
formation deadline fails to form (``formation.py``). A participant that has not ACKed by the
ACK deadline is lost (:func:`missed_acks`, which a tick asks).

A view that failed with every member alive is retried, then decided by the evidence: the
decision is ``stalls.py``'s, the view change (or the shutdown) that carries it out is decided
here (:func:`resolve_stall`).
Each committed view, and the group's shutdown, names its checkpoint rank.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ...eventlog.record import Record
from ...wire.codes import APPLIED, APPLIED_WITH_DROPPED_RANKS
from .budget import checkpoint_rank, shutdown
from .effects import (
    HEALTHY,
    OFFLINE,
    View,
)
from .facets import FoldContext
from .outcomes import Rejected, Resolved
from .ranks import Lost
from .reasons import ranks_text
from .stalls import FAILED as VIEW_FAILED
from .stalls import RETRY as VIEW_RETRY
from .stalls import UNRESOLVED, StallOver, decide
from .state import Change, GroupState, rank_state


class ViewChange:
    """The view change of every group (see the module docstring).

    It reads the groups it is handed and the fold's time (``fold.now``); it decides a
    change's commit, as decisions that the machine applies."""

    def __init__(self, fold: FoldContext) -> None:
        self._fold = fold

    def commit(self, g: GroupState, record: Record) -> list[Any]:
        """Phase two: every participant ACKed, was dropped or exited. Dropped and exited ranks
        leave the view (only the dropped ones are reported as dropped); the proposals it
        carries resolve ``applied`` (or ``applied_with_dropped_ranks``). Its decisions
        (``Committed``, each proposal's ``outcomes.Resolved``) change nothing; the machine
        applies them, then judges the budget.

        A view never commits with empty ``active_ranks``: if every rank of the new active set
        left first, see :meth:`_commit_without_target`."""
        change = g.change
        assert change is not None
        gone = change.dropped | change.exited
        active = tuple(r for r in change.active if r not in gone)
        if not active:
            return self._commit_without_target(g, record)
        dropped = tuple(sorted(change.dropped))
        exited = ranks_text(r for r in change.active if r in change.exited)
        view = self._view(g, change, active, change.cause(), record)
        status = APPLIED_WITH_DROPPED_RANKS if dropped else APPLIED
        decisions: list[Any] = [Committed(view)]
        for pid in change.proposals:
            reason = f"committed in version {view.version}"
            if dropped:
                reason += f"; dropped ranks {ranks_text(dropped)} (no ACK)"
            if exited != "[]":
                reason += f"; exited cleanly before it committed: {exited}"
            decisions.append(Resolved(pid, status, view.version, reason, dropped))
        return decisions

    def _view(
        self,
        g: GroupState,
        change: Change,
        active: tuple[int, ...],
        cause: dict[str, Any],
        record: Record,
    ) -> View:
        """The view ``change``'s version commits, with ``active`` ranks."""
        return View(
            group=g.name,
            version=change.version,
            active_ranks=active,
            rank_states={r: info.state for r, info in enumerate(g.ranks)},
            healthy_set=tuple(sorted(g.healthy)),
            cause=cause,
            acked_ranks=tuple(sorted(change.acked)),
            dropped_ranks=tuple(sorted(change.dropped)),
            offset=record.offset,
            ts=self._fold.now,
            checkpoint_rank=checkpoint_rank(g, active),
        )

    def _commit_without_target(self, g: GroupState, record: Record) -> list[Any]:
        """Every rank of the change's new active set exited or was dropped before the commit.

        An empty view is never committed. If participants of the old view are still online
        (they ACKed, all of them: the commit waits for that), the version commits for them, so
        the ranks that are left keep a view to run on and no ACKed version is ever prepared
        again with other contents. If nobody is left (every worker exited or died), the change
        is withdrawn: the last committed view stays current, a record of the ranks that ran in
        it; rank states say who exited and who failed, and the budget has already judged the
        losses. Either way the change's proposals did not take effect and are rejected."""
        change = g.change
        assert change is not None
        left = (
            f"every rank of version {change.version}'s active ranks {ranks_text(change.active)} "
            f"left before it committed (exited {ranks_text(change.exited)}, dropped "
            f"{ranks_text(change.dropped)})"
        )
        live = tuple(r for r in sorted(change.acked) if g.ranks[r].state != OFFLINE)
        if live:
            cause = change.cause()
            cause["detail"] += f"; {left}, so it keeps the live ranks {ranks_text(live)}"
            view = self._view(g, change, live, cause, record)
            outcome = f"{left}; version {view.version} keeps {ranks_text(live)}"
            done: Any = Committed(view)
        else:
            outcome = f"{left}; version {g.version} stays current"
            done = Withdrawn()
        return [done, Rejected(tuple(change.proposals), outcome)]


class Committed(msgspec.Struct, frozen=True, gc=False):
    """A decision: the change in flight is over and ``view`` is the group's committed view
    (the facets hear of it); the budget is due."""

    view: View


class Withdrawn(msgspec.Struct, frozen=True, gc=False):
    """A decision: the change in flight is over without a view (nobody left to run one)."""


class Prepared(msgspec.Struct, frozen=True, gc=False):
    """A decision: version ``version`` is prepared with ``active`` ranks; ``participants``
    must ACK it by ``ack_deadline`` (ns). Its cause: ``kind``, the ``proposals`` it carries,
    ``detail`` and ``extra`` (a reconfigure's uuid and order). The heads of the queue it
    already satisfies ride along with it (``proposals.attach_heads``, asked when applied)."""

    version: int
    active: tuple[int, ...]
    participants: tuple[int, ...]
    ack_deadline: int
    kind: str
    proposals: tuple[int, ...]
    detail: str
    extra: dict[str, Any] | None = None


def prepare(
    g: GroupState,
    target: tuple[int, ...],
    kind: str,
    proposals: tuple[int, ...],
    detail: str,
    now: int,
    *,
    extra: dict[str, Any] | None = None,
) -> Prepared:
    """Phase one, decided at ``now``: ``view_prepare(version + 1)`` to the participants, the
    online ranks active in the old view or the new one. It changes nothing."""
    members = set(g.active) | set(target)
    participants = tuple(r for r in sorted(members) if g.ranks[r].state != OFFLINE)
    deadline = now + g.cfg.ack_timeout_ns
    return Prepared(g.version + 1, target, participants, deadline, kind, proposals, detail, extra)


def form(g: GroupState, now: int) -> Prepared | None:
    """Formation, the first change: prepared once ``min_ranks`` are HEALTHY, with every
    HEALTHY rank active; None while fewer are. It changes nothing."""
    if len(g.healthy) < g.cfg.min_ranks:
        return None
    detail = f"{len(g.healthy)}/{g.cfg.world_size} ranks HEALTHY (min_ranks {g.cfg.min_ranks})"
    return prepare(g, tuple(sorted(g.healthy)), "formation", (), detail, now)


def missed_acks(g: GroupState, now: int) -> list[Lost]:
    """The participants of the change in flight that had not ACKed by its deadline, in rank
    order: each is lost (a failure). It changes nothing."""
    change = g.change
    if change is None or change.ack_deadline > now:
        return []
    why = f"did not ACK version {change.version} by its deadline {change.ack_deadline}"
    return [Lost(rank, why, True) for rank in change.outstanding()]


def resolve_stall(g: GroupState, record: Record, now: int) -> list[Any]:
    """Decide, at ``now``, a view that failed with every member alive (``fold/stalls.py``):
    ``StallOver`` then the group's shutdown (``budget.Shutdown``), the change that retries
    the view or removes its laggards (``Prepared``), or, without ``auto_deactivate``, the
    ``rank_state`` effects that blame the laggards; nothing while it waits for more reports.
    A stall whose view is no longer current, or whose view has an active rank that is not
    HEALTHY, is only over: the other rules change the view. It changes nothing."""
    stall = g.stall
    assert stall is not None
    active = g.active
    if stall.version != g.version or any(g.ranks[r].state != HEALTHY for r in active):
        return [StallOver()]
    deadline = stall_deadline(g)
    assert deadline is not None
    decision = decide(stall, active, now, deadline, g.cfg.min_active)
    if decision is None:
        return []
    if decision.kind == UNRESOLVED:
        return [StallOver(), shutdown(g, UNRESOLVED, decision.detail)]
    if decision.kind == VIEW_RETRY:
        return [StallOver(), prepare(g, active, VIEW_RETRY, (), decision.detail, now)]
    if not g.cfg.auto_deactivate:
        blamed = f"blamed: {decision.detail}"
        return [StallOver(), *(rank_state(g, r, blamed, record) for r in decision.laggards)]
    laggards = set(decision.laggards)
    target = tuple(r for r in active if r not in laggards)
    return [StallOver(), prepare(g, target, VIEW_FAILED, (), decision.detail, now)]


def stall_deadline(g: GroupState) -> int | None:
    """When the stall of ``g``, if it is about the current view, is decided without more
    reports; None if there is none."""
    stall = g.stall
    if stall is None or stall.version != g.version:
        return None
    return stall.deadline(g.cfg.reconcile_window_ns, g.cfg.heartbeat_timeout_ns)
