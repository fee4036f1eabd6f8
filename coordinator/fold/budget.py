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

Its interface: :func:`budget_shutdown` reads a group and returns its decision, a
:class:`Shutdown` or None; the machine applies it (``apply.py``).
"""

from __future__ import annotations

import msgspec

from .effects import OFFLINE
from .reasons import ranks_text
from .state import FAILED, GroupState


class Shutdown(msgspec.Struct, frozen=True, gc=False):
    """A decision: the group's one ``shutdown_with_save``, why (``reason``, ``detail``), and
    who saves the checkpoint. The machine applies it (``apply.shut_down``): the group is shut
    down, a stall forgotten, and its queued proposals rejected."""

    reason: str
    detail: str
    checkpoint_rank: int | None


def budget_shutdown(g: GroupState) -> Shutdown | None:
    """One ``shutdown_with_save`` per group, ever: at ``max_failure`` failed incarnations, or
    when failures leave fewer live active ranks than the backend needs; None if neither.

    Reads ``g``'s failures (``failed``), its view and its ranks' states; changes nothing."""
    if g.shutdown is not None or g.formation == FAILED:
        return None
    cfg = g.cfg
    if cfg.max_failure is not None and g.failures >= cfg.max_failure:
        failed = ", ".join(f"{r}@{e}" for r, e in g.failed[:16])
        if len(g.failed) > 16:
            failed += f", ... (+{len(g.failed) - 16} more)"
        detail = (
            f"{g.failures} failed incarnations (rank@rank_epoch [{failed}]) "
            f"reached max_failure {g.config.max_failure!r} = {cfg.max_failure}"
        )
        return shutdown(g, "max_failure_exceeded", detail)
    if g.view is None:
        return None
    active = g.view.active_ranks
    lost = [r for r in active if g.ranks[r].state == OFFLINE]
    if not lost or all(g.ranks[r].exited for r in lost):
        return None
    survivors = len(active) - len(lost)
    if survivors >= cfg.survivor_floor:
        return None
    detail = (
        f"{survivors} of active ranks {ranks_text(active)} left (lost "
        f"{ranks_text(lost)}); backend {g.config.backend} needs {cfg.survivor_floor}"
    )
    return shutdown(g, "all_ranks_lost" if survivors == 0 else "single_survivor", detail)


def shutdown(g: GroupState, reason: str, detail: str) -> Shutdown:
    """The decision to shut ``g`` down for ``reason``, naming its checkpoint rank now."""
    return Shutdown(reason, detail, checkpoint_rank(g, g.active))


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
