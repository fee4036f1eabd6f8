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

from typing import Any

from ...coordinator.fold.effects import Effect, View
from ...coordinator.fold.facets import FoldContext, Refusal
from ...coordinator.fold.state import GroupState
from ...eventlog.record import Record
from .checks import RendezvousChecks
from .effects import (
    JobClosed,
    JobCreated,
    NodeJoined,
    NodeLeft,
)
from .inputs import (
    SETTINGS,
    CloseInput,
    JoinInput,
    KeepaliveInput,
    LeaveInput,
    RendezvousInput,
    decode,
)
from .reads import RendezvousReads, read_model
from .rounds import _names, form, formation
from .state import Job, Waiting

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
        self._checks = RendezvousChecks(self.jobs)
        #: the jobs a record changed since the last read model (``reads.py``)
        self._moved: set[str] = set()

    # -- queries (the routes and the story read these) -----------------------------------------

    def job(self, name: str) -> Job | None:
        return self.jobs.get(name)

    def names(self) -> list[str]:
        return sorted(self.jobs)

    def read_model(self, previous: RendezvousReads | None) -> RendezvousReads:
        """See ``coordinator.fold.facets.Facet.read_model`` and ``reads.py``."""
        if previous is None:
            return read_model(self.jobs, None, set())
        moved, self._moved = self._moved, set()
        return read_model(self.jobs, previous, moved)

    # -- checks (``checks.py``) ---------------------------------------------------------------

    def refusal(
        self, fold: FoldContext, kind: str, group: str | None, rank: int | None, payload: Any
    ) -> Refusal | None:
        return self._checks.refusal(fold, kind, group, rank, payload)

    def repeat_of(
        self, fold: FoldContext, kind: str, group: str | None, rank: int | None, payload: Any
    ) -> int | None:
        return self._checks.repeat_of(fold, kind, group, rank, payload)

    # -- steps ---------------------------------------------------------------------------------

    def apply(self, fold: FoldContext, record: Record, effects: list[Effect]) -> None:
        """Step an input: its Struct (``inputs.py``) picks the rule (:data:`TRANSITIONS`)."""
        inp = decode(record.kind, record.payload)
        self._moved.add(inp.job)
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
        formed = formation(job, now)
        if formed is None:
            return
        form(job, formed, record, now, effects)

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
            self._moved.add(name)
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
        self._moved.update(self.jobs)
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
        self.jobs.clear()  # in place: the checks read the same dict
        for item in data.get("jobs", []):
            job = Job.from_dict(item)
            self.jobs[job.job] = job
        self._moved = set(self.jobs)


# -- the words -------------------------------------------------------------------------------------


def _next_event(job: Job) -> int:
    job.node_events += 1
    return job.node_events


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
