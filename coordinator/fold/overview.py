"""What the operator's console shows of a group, built from the fold's state on demand.

Compact on purpose, so it stays cheap at 16,384 ranks: a rank's state and membership are one
character each (``states``: ``H`` HEALTHY, ``S`` SYNCED, ``O`` OFFLINE, ``X`` OFFLINE after a
clean exit; ``active``: ``1`` in ``active_ranks``, ``0`` not), and lists of ranks that can be
long are abridged to their first :data:`RANKS_SHOWN` with a count.

Read-only: like :mod:`coordinator.fold.status`, nothing returned here refers to what the fold mutates.
"""

from __future__ import annotations

from typing import Any

from .effects import HEALTHY, OFFLINE, SYNCED
from .machine import Coordinator
from .projections import proposal_doc
from .state import GroupState
from .status import rank_counts, run_status

#: How many ranks a list in the overview names before it only counts.
RANKS_SHOWN = 64
#: How many pending and how many resolved proposals the overview carries.
PROPOSALS_SHOWN = 20

_CODE = {HEALTHY: "H", SYNCED: "S", OFFLINE: "O"}


def _groups(machine: Coordinator) -> dict[str, GroupState]:
    return machine._groups  # noqa: SLF001 - same package, read-only


def ranks_brief(ranks: Any) -> dict[str, Any]:
    """``{"count": n, "ranks": [first RANKS_SHOWN, sorted]}``."""
    items = sorted(ranks)
    return {"count": len(items), "ranks": items[:RANKS_SHOWN]}


def group_list(machine: Coordinator) -> list[dict[str, Any]]:
    """One line per group that was not deleted: size, version, state counts, failures, and
    whether it was shut down or ended."""
    out = []
    groups = _groups(machine)
    for name in sorted(groups):
        g = groups[name]
        if g.deleted:
            continue
        counts = {HEALTHY: 0, SYNCED: 0, OFFLINE: 0}
        for info in g.ranks:
            counts[info.state] += 1
        out.append(
            {
                "group": name,
                "run": g.created_offset,
                "status": run_status(g),
                "world_size": g.config.world_size,
                "version": g.version,
                "formation": g.formation,
                "states": counts,
                "rank_counts": rank_counts(g),
                "active": len(g.active),
                "failures": g.failures,
                "shutdown": g.shutdown,
                "ended": g.ended,
            }
        )
    return out


def group_overview(machine: Coordinator, group: str) -> dict[str, Any] | None:
    """The console's picture of one group, or None for an unknown group."""
    g = _groups(machine).get(group)
    if g is None:
        return None
    active = set(g.active)
    states = "".join(
        "X" if info.state == OFFLINE and info.exited else _CODE[info.state] for info in g.ranks
    )
    view = g.view
    change = g.change
    cfg = g.cfg
    return {
        "group": g.name,
        "run": g.created_offset,
        "status": run_status(g),
        "offset": machine.offset,
        "config": g.config.to_dict(),
        "formation": {"status": g.formation, "error": g.formation_error},
        "world_size": g.config.world_size,
        "states": states,
        "active": "".join("1" if r in active else "0" for r in range(g.config.world_size)),
        "healthy_set": len(g.healthy),
        "view": None
        if view is None
        else {
            "version": view.version,
            "active_ranks": len(view.active_ranks),
            "cause": view.cause,
            "offset": view.offset,
            "ts": view.ts,
        },
        "change_in_flight": None
        if change is None
        else {
            "version": change.version,
            "active_ranks": len(change.active),
            "participants": len(change.participants),
            "acked": len(change.acked),
            "waiting": ranks_brief(change.waiting),
            "dropped": ranks_brief(change.dropped),
            "ack_deadline_ts": change.ack_deadline,
            "cause": change.cause(),
        },
        "reconcile_window_end_ts": g.window_end,
        "ended": None
        if g.ended is None
        else {
            "reason": g.ended,
            "offset": g.ended_offset,
            "deleted": g.deleted,
            "finished": g.finished,
        },
        "budget": {
            "failures": g.failures,
            "max_failure": g.config.max_failure,
            "max_failure_count": cfg.max_failure,
            "survivor_floor": cfg.survivor_floor,
            "backend": g.config.backend,
            "failed": [f"{r}@{e}" for r, e in g.failed[-16:]],
            "shutdown": g.shutdown,
        },
        "pending_proposals": [
            proposal_doc(p)
            for p in (machine.proposal(pid) for pid, _ in list(g.queue)[:PROPOSALS_SHOWN])
            if p is not None
        ],
        "pending_count": len(g.queue),
        "recent_proposals": recent_proposals(machine, group),
    }


def recent_proposals(machine: Coordinator, group: str, n: int = PROPOSALS_SHOWN) -> list[Any]:
    """The group's latest ``n`` proposals that are no longer queued, newest first (the ones
    riding on the change in flight are still ``pending``)."""
    out = []
    queued = {pid for pid, _ in _groups(machine)[group].queue}
    for proposal in reversed(machine._proposals.values()):  # noqa: SLF001 - read-only
        if proposal.group != group or proposal.id in queued:
            continue
        out.append(proposal_doc(proposal))
        if len(out) == n:
            break
    return out
