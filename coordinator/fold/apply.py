"""The one place the decisions of the rules with a declared interface change the state.

Such a rule reads what it is handed (a group, the time, the options) and returns what it
decides as a small value, never a copy of the group (a group of 16,384 ranks copied per step
would cost more than the step). The machine hands the value here, where it changes the
group and adds the effects that tell of it:

- ``budget.Shutdown`` (``budget.budget_shutdown``): :func:`shut_down`, the group shut down,
  a stall forgotten, its queued proposals rejected;
- ``healthy_set.HealthyMoves`` (``healthy_set.healthy_moves``): :func:`move_healthy`, each
  moved rank HEALTHY or SYNCED.

The rules that still change a group themselves (``ranks.py``, ``barrier.py``,
``proposals.py``, ``ending.py``, ``deadlines.py``) apply a decision through this module too.
"""

from __future__ import annotations

from ...eventlog.record import Record
from ...wire.codes import REJECTED
from .budget import Shutdown, budget_shutdown
from .effects import HEALTHY, SYNCED, Effect, Proposal, ShutdownWithSave
from .healthy_set import HealthyMoves
from .outcomes import resolve
from .state import GroupState


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
