"""Fencing a rank's inputs: two live processes never speak for one rank.

An input of a rank is refused unless the rank is in the group's range, the group's run is not
over and its formation did not fail, and the input names the rank's current incarnation (one
that is not OFFLINE, for the inputs of an online rank); a new incarnation may replace a HEALTHY
one only after that one's heartbeat deadline; an ACK only for the version being prepared, from
a participant still awaited. Each refusal names the rank, the incarnations, the versions and
the deadline involved. Facets fence their rank inputs by :func:`online_rank_refusal` too.
"""

from __future__ import annotations

from typing import Any

from ...wire.codes import (
    GROUP_ENDED,
    GROUP_FAILED,
    INVALID_EVENT,
    RANK_BUSY,
    RANK_OFFLINE,
    RANK_OUT_OF_RANGE,
    STALE_INCARNATION,
    STALE_VERSION,
)
from .effects import HEALTHY, OFFLINE
from .reasons import ranks_text
from .state import FAILED, GroupState, RankInfo

#: (code, message)
Refusal = tuple[str, str]


def online_rank_refusal(g: GroupState, kind: str, rank: Any, incarnation: Any) -> Refusal | None:
    """Why an input of ``rank`` (a heartbeat, a links report, an ACK, a progress report, ...)
    is not from the rank's current, online incarnation of a group that has not failed, or
    None: a rank in range, the group not failed, the input's ``incarnation`` the rank's current
    one, the rank not OFFLINE. Facets (``coordinator.fold.facets``) fence their rank inputs
    by the same checks."""
    if isinstance(rank, bool) or not isinstance(rank, int):
        return INVALID_EVENT, f"a {kind} record must name a rank, got {rank!r}"
    refused = rank_in_group(g, rank) or current_incarnation(g, rank, incarnation)
    if refused is not None:
        return refused
    if g.ranks[rank].state == OFFLINE:
        return RANK_OFFLINE, (
            f"rank {rank} incarnation {incarnation} is OFFLINE; send join to come back"
        )
    return None


def rank_in_group(g: GroupState, rank: int) -> Refusal | None:
    ws = g.config.world_size
    if not 0 <= rank < ws:
        return RANK_OUT_OF_RANGE, f"rank {rank} is not in 0..{ws - 1} for group {g.name!r}"
    if g.ended is not None:
        return GROUP_ENDED, ended_text(g)
    if g.formation == FAILED:
        return GROUP_FAILED, f"group {g.name!r} failed to form: {g.formation_error}"
    return None


def ended_text(g: GroupState) -> str:
    """Why nothing joins ``g`` any more, and what to do instead."""
    how = "finished" if g.finished else "was ended"
    why = "every rank exited cleanly" if g.finished else g.ended
    deleted = ", then deleted" if g.deleted else ""
    return (
        f"group {g.name!r} (run {g.created_offset}) {how} at offset {g.ended_offset} ({why}"
        f"{deleted}); its history stays in the log as it was and a group name is used once: "
        "run again under another group name"
    )


def current_incarnation(g: GroupState, rank: int, inc: Any) -> Refusal | None:
    info = g.ranks[rank]
    if inc != info.incarnation:
        return STALE_INCARNATION, stale_text(rank, info, inc)
    return None


def join_refusal(g: GroupState, rank: int, info: RankInfo, inc: str, now: int) -> Refusal | None:
    """A new incarnation may replace a rank unless the current one is HEALTHY and still
    heartbeating: two live processes must never speak for one rank."""
    if inc == info.incarnation or info.state != HEALTHY:
        return None
    last = g.alive[rank]
    deadline = last + g.cfg.heartbeat_timeout_ns
    if now < deadline:
        return RANK_BUSY, (
            f"rank {rank} is HEALTHY as incarnation {info.incarnation} (rank_epoch "
            f"{info.rank_epoch}), last heartbeat at {last}; a new incarnation can join after "
            f"that one exits, is reported dead or misses its heartbeat deadline at {deadline}"
        )
    return None


def ack_refusal(g: GroupState, rank: int, version: int) -> Refusal | None:
    """Only the version being prepared, only from a participant still awaited or done."""
    change = g.change
    if change is None:
        return STALE_VERSION, (
            f"ACK for version {version} from rank {rank}, but no view change is in flight "
            f"(current version {g.version})"
        )
    if version != change.version:
        return STALE_VERSION, (
            f"ACK for version {version} from rank {rank}, but version {change.version} "
            "is being prepared"
        )
    if rank not in change.members:
        return STALE_VERSION, (
            f"rank {rank} is not a participant of version {version} "
            f"(participants {ranks_text(change.participants)})"
        )
    if rank in change.dropped:
        return STALE_VERSION, f"rank {rank} was already dropped from version {version}"
    return None


def stale_text(rank: int, info: RankInfo, inc: Any) -> str:
    if info.incarnation is None:
        return f"rank {rank} has not joined; incarnation {inc} is unknown"
    return (
        f"rank {rank} is now incarnation {info.incarnation} (rank_epoch {info.rank_epoch}); "
        f"{inc} is stale"
    )
