"""The rendezvous facet's rounds: when round R+1 of a job forms (rule 3 of ``fold.py``'s
docstring: ``formation``) and who is in it, in which rank order (rule 4: ``form``).
"""

from __future__ import annotations

from collections.abc import Iterable

from ...coordinator.fold.effects import Effect
from ...eventlog.record import Record
from .effects import RoundFormed, RoundNode
from .state import Job, _world_size


def formation(job: Job, now: int) -> str | None:
    """Why round R+1 forms now (rule 3), or None; sets or cancels the last call."""
    waiting = len(job.pending)
    live = job.live_members()
    if live:
        job.last_call = None
        if job.running():
            return None
        if waiting >= job.max_nodes:
            return f"max_nodes {job.max_nodes} nodes wait"
        if waiting >= job.min_nodes:
            return (
                f"every live node of round {job.round} is back ({', '.join(live)}); "
                f"{waiting} nodes wait (min_nodes {job.min_nodes})"
            )
        return None
    if waiting >= job.max_nodes:
        job.last_call = None
        return f"max_nodes {job.max_nodes} nodes wait"
    if waiting < job.min_nodes:
        job.last_call = None
        return None
    if job.last_call is None:
        job.last_call = now + job.last_call_ns
    if job.last_call > now:
        return None
    gone = "" if job.round == 0 else f"no node of round {job.round} is left; "
    return (
        f"{gone}the last call ({job.last_call_s:g} s after the {_nth(job.min_nodes)} node "
        f"joined) ended with {waiting} nodes waiting (min_nodes {job.min_nodes}, "
        f"max_nodes {job.max_nodes})"
    )


def form(job: Job, why: str, record: Record, now: int, effects: list[Effect]) -> None:
    """Rule 4: the members that wait keep their order, then the others as they joined."""
    order = [m.node for m in job.members if m.node in job.pending]
    order += [n for n in job.pending if n not in order]
    chosen, spares = order[: job.max_nodes], order[job.max_nodes :]
    nodes = tuple(
        RoundNode(
            node=n,
            rank=rank,
            host=job.pending[n].host,
            store_port=job.pending[n].store_port,
            local_world_size=job.pending[n].local_world_size,
            cause=job.pending[n].cause,
            restart_count=job.pending[n].restart_count,
        )
        for rank, n in enumerate(chosen)
    )
    previous = {m.node for m in job.members}
    for n in chosen:
        del job.pending[n]
    job.round += 1
    job.members = nodes
    job.formed_ts = now
    job.last_call = None
    job.version = record.offset
    reason = f"round {job.round} of {job.job!r} formed: {why}; rank 0 (the round's store) is "
    reason += f"node {chosen[0]}"
    kept = [n for n in chosen if n in previous]
    if job.round > 1:
        gone = [m for m in previous if m not in chosen]
        reason += f"; back from round {job.round - 1}: {', '.join(kept) or 'none'}"
        if gone:
            reason += f"; gone: {', '.join(_why_gone(job, n) for n in sorted(gone))}"
    new = [n for n in chosen if n not in previous]
    if new and job.round > 1:
        reason += f"; new: {', '.join(new)}"
    if spares:
        reason += f"; {', '.join(spares)} wait for the next round (max_nodes {job.max_nodes})"
    effects.append(
        RoundFormed(
            job=job.job,
            round=job.round,
            nodes=nodes,
            world_size=_world_size(nodes),
            store_host=nodes[0].host,
            store_port=nodes[0].store_port,
            reason=reason,
            spares=tuple(spares),
            formed_ts=now,
            offset=record.offset,
        )
    )


def _nth(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _names(nodes: Iterable[str]) -> str:
    listed = list(nodes)
    return ", ".join(listed) if listed else "none"


def _why_gone(job: Job, node: str) -> str:
    why = job.left.get(node)
    return f"{node} ({why})" if why else node
