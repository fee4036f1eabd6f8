"""The rendezvous facet's checks: which inputs it refuses, with which code, and which repeat
an earlier one. They read the jobs (``state.py``) and decide nothing; the steps are
``fold.py``'s, whose module docstring states the rules.
"""

from __future__ import annotations

from typing import Any

from ...coordinator.fold.facets import FoldContext, Refusal
from ...wire.codes import (
    INVALID_EVENT,
    NODE_GONE,
    RENDEZVOUS_CLOSED,
    RENDEZVOUS_CONFLICT,
    TOO_MANY_NODES,
    UNKNOWN_RENDEZVOUS,
)
from .inputs import INPUTS, SETTINGS, CloseInput, JoinInput, KeepaliveInput, LeaveInput, decode
from .state import Job

#: The most nodes that may wait at once.
MAX_PENDING = 4096


class RendezvousChecks:
    """``Rendezvous.refusal`` and ``Rendezvous.repeat_of`` (``coordinator.fold.facets.Facet``),
    over the facet's jobs by name (the same dict the fold steps, read only here)."""

    def __init__(self, jobs: dict[str, Job]) -> None:
        self.jobs = jobs

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
