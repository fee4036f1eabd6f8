"""What the operator's console shows of a group, rendered from a captured group (``capture.py``).

Compact on purpose, so it stays cheap at 16,384 ranks: a rank's state and membership are one
character each (``states``: ``H`` HEALTHY, ``S`` SYNCED, ``O`` OFFLINE, ``X`` OFFLINE after a
clean exit; ``active``: ``1`` in ``active_ranks``, ``0`` not), and lists of ranks that can be
long are abridged to their first :data:`RANKS_SHOWN` with a count.

Like :mod:`coordinator.fold.status`, it reads a :class:`~coordinator.fold.capture.GroupCapture`,
never the live state, and nothing returned here refers to what the fold mutates.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .capture import GroupCapture
from .effects import HEALTHY, OFFLINE, SYNCED, Proposal
from .projections import proposal_doc
from .status import rank_counts, run_status

#: How many ranks a list in the overview names before it only counts.
RANKS_SHOWN = 64
#: How many pending and how many resolved proposals the overview carries.
PROPOSALS_SHOWN = 20

_CODE = {HEALTHY: "H", SYNCED: "S", OFFLINE: "O"}


def ranks_brief(ranks: Any) -> dict[str, Any]:
    """``{"count": n, "ranks": [first RANKS_SHOWN, sorted]}``."""
    items = sorted(ranks)
    return {"count": len(items), "ranks": items[:RANKS_SHOWN]}


def group_line(g: GroupCapture) -> dict[str, Any]:
    """The group's line in the list of groups (``GET /groups``, the console): size, version,
    state counts, failures, and whether it was shut down or ended."""
    counts = {HEALTHY: 0, SYNCED: 0, OFFLINE: 0}
    for state in g.column("state"):
        counts[state] += 1
    return {
        "group": g.name,
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


def group_overview(
    g: GroupCapture, offset: int, proposals: Mapping[int, Proposal]
) -> dict[str, Any]:
    """The console's picture of one group as captured at ``offset`` (``proposals``: every
    proposal by id as of then, in the order they came)."""
    active = set(g.active)
    states = "".join(
        "X" if state == OFFLINE and exited else _CODE[state]
        for state, exited in zip(g.column("state"), g.column("exited"), strict=True)
    )
    view = g.view
    change = g.change
    cfg = g.cfg
    return {
        "group": g.name,
        "run": g.created_offset,
        "status": run_status(g),
        "offset": offset,
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
            for p in (proposals.get(pid) for pid in g.queue[:PROPOSALS_SHOWN])
            if p is not None
        ],
        "pending_count": len(g.queue),
        "recent_proposals": recent_proposals(g, proposals),
    }


def recent_proposals(
    g: GroupCapture, proposals: Mapping[int, Proposal], n: int = PROPOSALS_SHOWN
) -> list[Any]:
    """The group's latest ``n`` proposals that are no longer queued, newest first (the ones
    riding on the change in flight are still ``pending``)."""
    out = []
    queued = set(g.queue)
    group = g.name
    for pid in reversed(proposals):  # newest first (a dict, or the read model's pages)
        proposal = proposals[pid]
        if proposal.group != group or proposal.id in queued:
            continue
        out.append(proposal_doc(proposal))
        if len(out) == n:
            break
    return out
