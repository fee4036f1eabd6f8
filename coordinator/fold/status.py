"""``group_status``: a group's state as plain JSON data for ``GET /groups/{group}``.

Rendered from a :class:`~coordinator.fold.capture.GroupCapture` (the group as captured at one
offset), so the HTTP surface never holds a reference to anything the fold mutates, and the
read model renders a captured group whenever it is first asked.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ...wire import life
from .capture import GroupCapture
from .state import FAILED


def plain(value: Any) -> Any:
    """JSON-shaped plain data (lists, string keys), as a client would see it."""
    return msgspec.json.decode(msgspec.json.encode(value))


def run_status(g: GroupCapture) -> str:
    """Where the group's run stands, in the one vocabulary (``wire.life``)."""
    return life.run_status(
        formed=g.view is not None,
        failed=g.formation == FAILED,
        shutdown=g.shutdown,
        ended=g.ended is not None,
        finished=g.finished,
        deleted=g.deleted,
    )


def rank_counts(g: GroupCapture) -> dict[str, int]:
    """How many ranks are in each physical state, and what became of them in the one
    vocabulary (``wire.life``): online, exited cleanly, died, never joined."""
    counts = {"HEALTHY": 0, "SYNCED": 0, "OFFLINE": 0, "exited": 0, "online": 0, "died": 0}
    for state, incarnation, exited in zip(
        g.column("state"), g.column("incarnation"), g.column("exited"), strict=True
    ):
        counts[state] += 1
        if state != "OFFLINE":
            counts[life.ONLINE] += 1
        elif exited:
            counts[life.EXITED] += 1
        elif incarnation is not None:
            counts[life.DIED] += 1
    counts[life.NOT_JOINED] = (
        g.world_size - counts[life.ONLINE] - counts[life.EXITED] - counts[life.DIED]
    )
    return counts


def group_status(g: GroupCapture) -> dict[str, Any]:
    """Config, formation status, current view, per-rank state, queue and change in flight."""
    active = set(g.active)
    alive = g.alive
    change = g.change
    counts = rank_counts(g)
    return {
        "group": g.name,
        #: the run's id: the offset of the group's ``group_created`` record (a name runs once)
        "run": g.created_offset,
        #: where the run stands, in the one vocabulary (``wire.life``)
        "status": run_status(g),
        "config": g.config.to_dict(),
        "formation": {"status": g.formation, "error": g.formation_error},
        "view": None if g.view is None else plain(g.view),
        "healthy_set": sorted(g.healthy),
        #: how many ranks are in each state (``exited``: OFFLINE after a clean exit), over every
        #: rank, not only the page
        "rank_counts": counts,
        "ranks": [
            {
                "rank": r,
                "state": state,
                "incarnation": incarnation,
                "rank_epoch": rank_epoch,
                "last_heartbeat_ts": alive.get(r, last_heartbeat_ts),
                "exited": exited,
                "active": r in active,
                "self_ready": self_ready,
                "down_peers": sorted(down),
            }
            for r, (
                state,
                incarnation,
                rank_epoch,
                last_heartbeat_ts,
                exited,
                self_ready,
                down,
            ) in enumerate(g.rows())
        ],
        "pending_proposals": list(g.queue),
        "change_in_flight": None
        if change is None
        else {
            "version": change.version,
            "active_ranks": list(change.active),
            "participants": list(change.participants),
            "acked": sorted(change.acked),
            "dropped": sorted(change.dropped),
            "exited": sorted(change.exited),
            "ack_deadline_ts": change.ack_deadline,
            "cause": change.cause(),
        },
        "failures": g.failures,
        "shutdown": g.shutdown,
        "ended": None
        if g.ended is None
        else {
            "reason": g.ended,
            "offset": g.ended_offset,
            "deleted": g.deleted,
            "finished": g.finished,
        },
        "reconcile_window_end_ts": g.window_end,
    }
