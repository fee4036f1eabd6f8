"""The failure budget: when a group stops for good.

The rule. One ``shutdown_with_save`` per group, ever, when either

- ``max_failure`` incarnations have failed (a rank lost by timeout, death report, missed ACK or
  replacement; a clean exit never counts), or
- failures leave fewer live active ranks than the backend needs (``survivor_floor``: 1 for
  gloo, 2 for nccl): ``all_ranks_lost`` or ``single_survivor``, or
- a view that failed with nobody blamed cannot be resolved (``stalls.py``):
  ``unresolved_view_failure``.

Pending proposals are then rejected; a change already in flight may still commit. The budget
is judged in every step that lost a rank or committed a view (``budget_due``).
"""

from __future__ import annotations

from ...eventlog.record import Record
from ...wire.codes import REJECTED
from .effects import (
    OFFLINE,
    Effect,
    Proposal,
    ShutdownWithSave,
)
from .outcomes import resolve
from .reasons import ranks_text
from .state import FAILED, GroupState


def enforce_budget(
    g: GroupState, proposals: dict[int, Proposal], record: Record, effects: list[Effect]
) -> None:
    """One ``shutdown_with_save`` per group, ever: at ``max_failure`` failed incarnations, or
    when failures leave fewer live active ranks than the backend needs. Pending proposals
    are then rejected; a change already in flight may still commit."""
    if not g.budget_due:
        return
    g.budget_due = False
    if g.shutdown is not None or g.formation == FAILED:
        return
    cfg = g.cfg
    reason = detail = None
    if cfg.max_failure is not None and g.failures >= cfg.max_failure:
        reason = "max_failure_exceeded"
        failed = ", ".join(f"{r}@{e}" for r, e in g.failed[:16])
        if len(g.failed) > 16:
            failed += f", ... (+{len(g.failed) - 16} more)"
        detail = (
            f"{g.failures} failed incarnations (rank@rank_epoch [{failed}]) "
            f"reached max_failure {g.config.max_failure!r} = {cfg.max_failure}"
        )
    elif g.view is not None:
        active = g.view.active_ranks
        lost = [r for r in active if g.ranks[r].state == OFFLINE]
        if lost and any(not g.ranks[r].exited for r in lost):
            survivors = len(active) - len(lost)
            if survivors < cfg.survivor_floor:
                reason = "all_ranks_lost" if survivors == 0 else "single_survivor"
                detail = (
                    f"{survivors} of active ranks {ranks_text(active)} left (lost "
                    f"{ranks_text(lost)}); backend {g.config.backend} needs "
                    f"{cfg.survivor_floor}"
                )
    if reason is None:
        return
    shut_down(g, proposals, reason, detail or "", record, effects)


def shut_down(
    g: GroupState,
    proposals: dict[int, Proposal],
    reason: str,
    detail: str,
    record: Record,
    effects: list[Effect],
) -> None:
    """The group's one ``shutdown_with_save``; queued proposals are rejected. It names the
    checkpoint rank: the current view's, failing over to the lowest live active rank."""
    g.shutdown = reason
    g.stall = None
    effects.append(
        ShutdownWithSave(
            group=g.name,
            reason=reason,
            detail=detail,
            offset=record.offset,
            checkpoint_rank=checkpoint_rank(g, g.active),
        )
    )
    while g.queue:
        pid, _ = g.queue.popleft()
        resolve(proposals, pid, REJECTED, None, f"group was shut down ({reason})", record, effects)


def checkpoint_rank(g: GroupState, active: tuple[int, ...]) -> int | None:
    """Who saves the group's checkpoint among ``active``: the rank the operator pinned
    (``checkpoint_rank``) while it is active and not OFFLINE, else the lowest active rank
    that is not OFFLINE (the lowest active rank if every one is). None with no active rank.
    Every committed view and every ``shutdown_with_save`` names it."""
    pin = g.config.checkpoint_rank
    if pin is not None and pin in active and g.ranks[pin].state != OFFLINE:
        return pin
    live = (r for r in active if g.ranks[r].state != OFFLINE)
    return next(live, active[0] if active else None)
