"""torchrun's rendezvous, decided by the fold: who is in each round of a job, and why.

``torchrun --rdzv-backend foldplane --rdzv-endpoint URL --rdzv-id JOB`` runs foldplane's
rendezvous handler (``agent/rendezvous.py``) in each torchrun agent, a *node*. Every call the
handler makes is a record (``rdzv_join``, ``rdzv_keepalive``, ``rdzv_leave``, ``rdzv_close``)
and this facet decides, from those records and the ticks alone, each *round* of the job: the
nodes that run the job's workers together, in rank order. torch's own backends decide the same
thing inside each node, on a shared blob; here the decision is the coordinator's, made once,
durable and explained (docs/torchrun.md).

The rules, each with its reason:

1. **A job's settings are its first node's.** The first join fixes ``min_nodes``,
   ``max_nodes`` (torchrun's ``--nnodes MIN:MAX``), the last call, the join timeout and the
   keep-alive timeout; a join that says otherwise is refused (``rendezvous_conflict``, naming
   each setting). Two nodes started with different ``--nnodes`` would wait for different
   rounds; torch's backends let each node use its own and the round depends on who syncs first.
2. **A join is a wait for the next round.** Node N joining job J while its latest round is R
   waits for round R+1. A member of round R that joins again has left round R: its torchrun
   restarts its workers (they failed, or nodes wait to be admitted; the node says which and
   its restart count). The same join sent again (the same ``attempt``: an answer lost in a
   failover) is that join, answered with its offset and not appended.
3. **Round R+1 never forms while a live member of round R runs it.** Every node that is still
   in round R (alive and not waiting) must have left it first, so no node is in two rounds and
   no round's store is read by another round's workers (torch's rule too). Then it forms:

   a. at once when ``max_nodes`` nodes wait ("max_nodes reached");
   b. at once when every live member of round R waits again and at least ``min_nodes`` wait:
      a restart brings back everyone who was there, so a last call would wait for nobody
      (torchft's fast quorum). A node that arrives after it formed waits for the next round,
      which the members start by restarting (rule 5);
   c. when no member of a round is alive (the first round, or every member gone), at least
      ``min_nodes`` wait and the last call has ended: ``last_call_s`` after the join that
      brought the count to ``min_nodes`` ("last call ended"). It is cancelled if the count
      falls below ``min_nodes`` again.
4. **Ranks.** The round takes the members of round R that wait, in their old rank order (rank
   0 hosts the round's store, so it stays on the same node when it can), then the other nodes
   in the order they joined, up to ``max_nodes``; the rest wait for the next round (spares).
   Rank 0's store is new for every round (each join offers one), so no round can read
   another's keys: the stale-port failure of a store shared across rounds cannot happen.
5. **Who waits** (``nodes_waiting``, what a member's torchrun asks every monitor interval): the
   nodes waiting, when restarting would change the round (a member is among them, or the round
   has fewer than ``max_nodes``), else 0: spares wait without stopping a full round.
6. **Liveness.** Each node sends a keep-alive every second or so; a node silent for
   ``keepalive_timeout_s`` is lost: it no longer waits and is no longer a live member (so rule
   3 stops waiting for it). A coordinator that resumes serving (a restart, a failover)
   restarts every node's clock: the silence was the coordinator's, not the nodes'.
7. **Join timeout.** A node whose round has not formed ``join_timeout_s`` after its join leaves
   the job, told how far the round got ("1/2 nodes waiting (min_nodes 2)", the members still
   running). The last call and the join timeout keep running through a resume: they bound the
   wait, they do not wait on anyone's word.
8. **Leaving and closing.** A node may leave (its torchrun stops while it waits). A node's
   torchrun shuts the rendezvous down when its run ends, which closes the job for every node
   (torch's semantics): the nodes waiting are told, and every later join is refused
   (``rendezvous_closed``) with what to do: a new run takes a new ``--rdzv-id``.

Everything here is pure: time is the records' ``ts`` (``FoldContext.now``); iteration is in
insertion order (arrival order), which the snapshot keeps.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...coordinator.fold.effects import Effect, View
from ...coordinator.fold.facets import FoldContext, Refusal
from ...coordinator.fold.state import GroupState
from ...eventlog.record import Record
from ...wire.codes import (
    INVALID_EVENT,
    NODE_GONE,
    RENDEZVOUS_CLOSED,
    RENDEZVOUS_CONFLICT,
    TOO_MANY_NODES,
    UNKNOWN_RENDEZVOUS,
)
from .effects import (
    JobClosed,
    JobCreated,
    NodeJoined,
    NodeLeft,
    RoundFormed,
    RoundNode,
)
from .inputs import (
    INPUTS,
    SETTINGS,
    CloseInput,
    JoinInput,
    KeepaliveInput,
    LeaveInput,
    RendezvousInput,
    decode,
)
from .state import Job, Waiting, _world_size

#: The most nodes that may wait at once.
MAX_PENDING = 4096
#: The nodes that left a job, kept to say why when they speak again (the oldest forgotten).
LEFT_KEPT = 64

#: The transition table: each input (``inputs.py``), the rule that steps it and what it moves.
TRANSITIONS: dict[type[RendezvousInput], str] = {
    JoinInput: "_on_join",  # the node waits for the next round (the first join: a new job)
    KeepaliveInput: "_on_keepalive",  # the node's liveness only
    LeaveInput: "_on_leave",  # the node leaves; the next round may form
    CloseInput: "_on_close",  # the job closes for every node
}


# -- the facet -------------------------------------------------------------------------------------


class Rendezvous:
    """The ``rendezvous`` facet (``coordinator.fold.facets.Facet``): every job's rounds."""

    name = "rendezvous"
    kinds = frozenset({"rdzv_join", "rdzv_keepalive", "rdzv_leave", "rdzv_close"})
    repeatable = frozenset({"rdzv_join", "rdzv_close"})

    def __init__(self) -> None:
        self.jobs: dict[str, Job] = {}

    # -- queries (the routes and the story read these) -----------------------------------------

    def job(self, name: str) -> Job | None:
        return self.jobs.get(name)

    def names(self) -> list[str]:
        return sorted(self.jobs)

    # -- checks --------------------------------------------------------------------------------

    def refusal(
        self, fold: FoldContext, kind: str, group: str | None, rank: int | None, payload: Any
    ) -> Refusal | None:
        """Why an input must not be applied: a malformed one (``invalid_event``, naming the
        field), one for a job that is closed (``rendezvous_closed``) or unknown
        (``unknown_rendezvous``), a join whose settings differ from the job's
        (``rendezvous_conflict``) or that would make too many nodes wait (``too_many_nodes``),
        a keep-alive or a leave from a node that is not part of the job (``node_gone``, saying
        why it left)."""
        if group is not None or rank is not None:
            return INVALID_EVENT, f"{kind} names no group and no rank (its job is in the payload)"
        problem = INPUTS[kind].problem(payload)
        if problem is not None:
            return INVALID_EVENT, f"{kind}: {problem}"
        inp = decode(kind, payload)
        job = self.jobs.get(inp.job)
        if job is None:
            if isinstance(inp, JoinInput):
                return None
            return UNKNOWN_RENDEZVOUS, f"no rendezvous {inp.job!r}: no node ever joined it"
        if job.closed is not None:
            if isinstance(inp, CloseInput):
                return None  # a repeat (repeat_of answers it)
            return RENDEZVOUS_CLOSED, _closed_text(job)
        node = inp.node
        if isinstance(inp, JoinInput):
            return self._join_refusal(job, node, inp)
        if isinstance(inp, KeepaliveInput | LeaveInput) and node not in job.alive:
            return NODE_GONE, _gone_text(job, node)
        return None

    def _join_refusal(self, job: Job, node: str, join: JoinInput) -> Refusal | None:
        differ = [
            f"{k} {getattr(join, k):g} (the rendezvous has {getattr(job, k):g})"
            for k in SETTINGS
            if getattr(join, k) != getattr(job, k)
        ]
        if differ:
            return RENDEZVOUS_CONFLICT, (
                f"node {node} joins rendezvous {job.job!r} with other settings than its first "
                f"node's: {', '.join(differ)}; start every node with the same --nnodes and "
                "--rdzv-conf"
            )
        if node not in job.pending and len(job.pending) >= MAX_PENDING:
            return TOO_MANY_NODES, (
                f"{len(job.pending)} nodes already wait for round {job.round + 1} of "
                f"{job.job!r}, the most a rendezvous holds"
            )
        return None

    def repeat_of(
        self, fold: FoldContext, kind: str, group: str | None, rank: int | None, payload: Any
    ) -> int | None:
        """A join sent again with the same ``attempt`` is that join; a close of a closed job is
        its closing."""
        if INPUTS[kind].problem(payload) is not None:
            return None
        inp = decode(kind, payload)
        job = self.jobs.get(inp.job)
        if job is None:
            return None
        if isinstance(inp, CloseInput):
            return None if job.closed is None else int(job.closed["offset"])
        if isinstance(inp, JoinInput):
            latest = job.attempts.get(inp.node)
            if latest is not None and latest[0] == inp.attempt and job.closed is None:
                return latest[1]
        return None

    # -- steps ---------------------------------------------------------------------------------

    def apply(self, fold: FoldContext, record: Record, effects: list[Effect]) -> None:
        """Step an input: its Struct (``inputs.py``) picks the rule (:data:`TRANSITIONS`)."""
        inp = decode(record.kind, record.payload)
        getattr(self, TRANSITIONS[type(inp)])(inp, record, fold.now, effects)

    def _on_join(self, join: JoinInput, record: Record, now: int, effects: list[Effect]) -> None:
        job = self.jobs.get(join.job)
        if job is None:
            job = self._create(join, record, effects)
        self._join(job, join, record, now, effects)
        self._decide(job, record, now, effects)

    def _on_keepalive(
        self, beat: KeepaliveInput, record: Record, now: int, effects: list[Effect]
    ) -> None:
        """Liveness only: nothing a node waits on changed."""
        job = self.jobs[beat.job]
        job.alive.pop(beat.node, None)
        job.alive[beat.node] = now

    def _on_leave(self, leave: LeaveInput, record: Record, now: int, effects: list[Effect]) -> None:
        job = self.jobs[leave.job]
        self._drop(job, leave.node, "left", f"it left: {leave.reason}", record, effects)
        self._decide(job, record, now, effects)

    def _on_close(self, close: CloseInput, record: Record, now: int, effects: list[Effect]) -> None:
        self._close(self.jobs[close.job], close, record, effects)

    def _create(self, join: JoinInput, record: Record, effects: list[Effect]) -> Job:
        """Rule 1: the first join fixes the job's settings."""
        job = Job(
            job=join.job,
            **{k: getattr(join, k) for k in SETTINGS},
            created_offset=record.offset,
        )
        self.jobs[job.job] = job
        effects.append(
            JobCreated(job=job.job, node=join.node, **job.settings(), offset=record.offset)
        )
        return job

    def _join(
        self, job: Job, join: JoinInput, record: Record, now: int, effects: list[Effect]
    ) -> None:
        """Rule 2: the node waits for the next round; a member of the latest round has left it."""
        node = join.node
        left_round = job.round if any(m.node == node for m in job.members) else 0
        job.pending.pop(node, None)
        job.pending[node] = Waiting(
            node=node,
            attempt=join.attempt,
            host=join.host,
            store_port=join.store_port,
            local_world_size=join.local_world_size,
            cause=join.cause,
            restart_count=join.restart_count,
            offset=record.offset,
            joined_ts=now,
            join_deadline=now + job.join_timeout_ns,
        )
        job.attempts.pop(node, None)
        job.attempts[node] = (join.attempt, record.offset)
        job.left.pop(node, None)
        job.alive.pop(node, None)
        job.alive[node] = now
        job.version = record.offset
        effects.append(
            NodeJoined(
                job=job.job,
                node=node,
                round=job.round + 1,
                cause=join.cause,
                restart_count=join.restart_count,
                left_round=left_round,
                pending=len(job.pending),
                reason=_join_text(job, node, join, left_round),
                seq=_next_event(job),
                offset=record.offset,
            )
        )

    def _drop(
        self, job: Job, node: str, how: str, why: str, record: Record, effects: list[Effect]
    ) -> None:
        """A node is no longer part of the job (rules 6, 7, 8)."""
        waited = node in job.pending
        job.pending.pop(node, None)
        job.alive.pop(node, None)
        job.left.pop(node, None)
        job.left[node] = f"{how} at offset {record.offset}: {why}"
        while len(job.left) > LEFT_KEPT:
            del job.left[next(iter(job.left))]
        job.version = record.offset
        in_round = job.round + 1 if waited else job.round
        where = f"waiting for round {in_round}" if waited else f"member of round {in_round}"
        effects.append(
            NodeLeft(
                job=job.job,
                node=node,
                how=how,
                round=in_round,
                reason=f"node {node} ({where}) {how}: {why}",
                seq=_next_event(job),
                offset=record.offset,
            )
        )

    def _close(self, job: Job, close: CloseInput, record: Record, effects: list[Effect]) -> None:
        """Rule 8: a closed job tells its waiting nodes and takes no more."""
        job.closed = {"node": close.node, "reason": close.reason, "offset": record.offset}
        job.pending.clear()
        job.alive.clear()
        job.last_call = None
        job.version = record.offset
        effects.append(
            JobClosed(
                job=job.job,
                node=close.node,
                round=job.round,
                reason=close.reason,
                offset=record.offset,
            )
        )

    def _decide(self, job: Job, record: Record, now: int, effects: list[Effect]) -> None:
        """Rule 3: form the next round if a rule allows it now; else keep (or cancel) the last
        call of a round being gathered."""
        if job.closed is not None:
            return
        formed = self._formation(job, now)
        if formed is None:
            return
        self._form(job, formed, record, now, effects)

    def _formation(self, job: Job, now: int) -> str | None:
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

    def _form(self, job: Job, why: str, record: Record, now: int, effects: list[Effect]) -> None:
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

    # -- time ----------------------------------------------------------------------------------

    def tick(self, fold: FoldContext, record: Record, effects: list[Effect]) -> None:
        """Rules 6, 7 and 3c at ``fold.now``: lose the silent nodes, time out the long waits,
        then form what can form, job by job in name order."""
        now = fold.now
        for name in sorted(self.jobs):
            job = self.jobs[name]
            if job.closed is not None:
                continue
            due = self._deadline(job)
            if due is None or due > now:
                continue
            limit = job.keepalive_ns
            for node in [n for n, t in job.alive.items() if t + limit <= now]:
                since = job.alive[node]
                self._drop(
                    job,
                    node,
                    "lost",
                    f"no keep-alive for {job.keepalive_timeout_s:g} s (the last at {since})",
                    record,
                    effects,
                )
            for w in [w for w in job.pending.values() if w.join_deadline <= now]:
                self._drop(job, w.node, "timed_out", _timed_out_text(job, w), record, effects)
            self._decide(job, record, now, effects)

    def next_deadline(self) -> int | None:
        best: int | None = None
        for job in self.jobs.values():
            d = self._deadline(job)
            if d is not None and (best is None or d < best):
                best = d
        return best

    def _deadline(self, job: Job) -> int | None:
        if job.closed is not None:
            return None
        times: list[int] = []
        if job.alive:
            times.append(next(iter(job.alive.values())) + job.keepalive_ns)
        times.extend(w.join_deadline for w in job.pending.values())
        if job.last_call is not None:
            times.append(job.last_call)
        return min(times) if times else None

    def waits_on_ranks(self) -> bool:
        """The keep-alive deadlines wait on the nodes, as heartbeats wait on the ranks."""
        return any(job.alive and job.closed is None for job in self.jobs.values())

    def resume(self, now: int) -> None:
        """Rule 6: every node's keep-alive clock restarts; the last call and the join timeouts
        keep running (rule 7)."""
        for job in self.jobs.values():
            for node in job.alive:
                job.alive[node] = now

    # -- membership's hooks: a rendezvous is not a group's, so it hears nothing of them ---------

    def view_committed(
        self,
        fold: FoldContext,
        g: GroupState,
        view: View,
        base: View | None,
        record: Record,
        effects: list[Effect],
    ) -> None:
        return None

    def rank_lost(
        self, fold: FoldContext, g: GroupState, rank: int, record: Record, effects: list[Effect]
    ) -> None:
        return None

    def rank_joined(
        self, fold: FoldContext, g: GroupState, rank: int, record: Record, effects: list[Effect]
    ) -> None:
        return None

    # -- snapshots -----------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        return {"jobs": [self.jobs[name].to_dict() for name in sorted(self.jobs)]}

    def restore(self, data: dict[str, Any]) -> None:
        self.jobs = {}
        for item in data.get("jobs", []):
            job = Job.from_dict(item)
            self.jobs[job.job] = job


# -- the words -------------------------------------------------------------------------------------


def _next_event(job: Job) -> int:
    job.node_events += 1
    return job.node_events


def _nth(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _names(nodes: Iterable[str]) -> str:
    listed = list(nodes)
    return ", ".join(listed) if listed else "none"


def _join_text(job: Job, node: str, join: JoinInput, left_round: int) -> str:
    cause = join.cause
    if cause == "first":
        why = "arrived"
    elif cause == "workers_failed":
        why = f"restarts after its workers failed (restart {join.restart_count})"
    else:
        why = "restarts to admit the nodes that wait"
    left = f", leaving round {left_round}" if left_round else ""
    text = (
        f"node {node} {why}{left}: waits for round {job.round + 1} of {job.job!r} "
        f"({len(job.pending)} waiting, min_nodes {job.min_nodes}, max_nodes {job.max_nodes})"
    )
    running = job.running()
    if running:
        text += f"; still running round {job.round}: {_names(running)}"
    return text


def _timed_out_text(job: Job, w: Waiting) -> str:
    running = job.running()
    text = (
        f"round {job.round + 1} did not form within its join timeout of "
        f"{job.join_timeout_s:g} s: {len(job.pending)}/{job.min_nodes} nodes waiting "
        f"(min_nodes {job.min_nodes})"
    )
    if running:
        text += f"; still running round {job.round}, not back: {_names(running)}"
    return text


def _why_gone(job: Job, node: str) -> str:
    why = job.left.get(node)
    return f"{node} ({why})" if why else node


def _closed_text(job: Job) -> str:
    closed = job.closed or {}
    return (
        f"rendezvous {job.job!r} was closed at offset {closed.get('offset')} by node "
        f"{closed.get('node')} ({closed.get('reason')}) after round {job.round}; a closed "
        "rendezvous takes no more nodes: start a new run under a new --rdzv-id"
    )


def _gone_text(job: Job, node: str) -> str:
    why = job.left.get(node)
    if why is None:
        return f"node {node} is not part of rendezvous {job.job!r}; it may join it"
    return f"node {node} is no longer part of rendezvous {job.job!r}: {why}; it may join again"
