"""Proposals and what starts the next change.

The rule. Proposals queue first in, first out, each with an admission deadline; each gets
exactly one terminal outcome (``applied``, ``applied_with_dropped_ranks`` or ``rejected``) and
never changes afterwards. With no change in flight and no reconciliation window open, the next
change is, in order: formation (``machine.py``), auto-deactivation of active ranks that left
the Healthy Set (never emptying the view), then the head of the queue, checked in order (ranks
in range and distinct; no change needed: applied at once; a deactivation keeping
``min_active``; an activation whose ranks are HEALTHY and fully linked, else it waits until its
admission deadline). While a change is in flight, heads it already satisfies ride along with it.
A reconfigure (torch's ``ProcessGroup.reconfigure``) queues here too; ``reconfigure.py`` says
how its members' calls make one proposal and how its head is decided.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from ...eventlog.record import Record
from ...wire.codes import APPLIED, PENDING
from ...wire.inputs import RECONFIGURE, ProposalInput
from ...wire.life import EXITED, RANK_WORDS
from .admission import requested, static_problem
from .barrier import Prepared, prepare
from .effects import (
    Proposal,
    ProposalAccepted,
)
from .facets import FoldContext
from .outcomes import Dequeued, Rejected, Resolved
from .reasons import ranks_text
from .reconfigure import decide_reconfigure, joined_call
from .state import FAILED, GroupState

#: The cause of a view change that removes only ranks that exited cleanly.
CLEAN_EXIT = "exit"


class Recorded(msgspec.Struct, frozen=True, gc=False):
    """A decision: ``proposal`` is written, a ``new`` one (its idempotency key and its
    reconfigure's uuid name it from now on) or one a further member's call joined."""

    proposal: Proposal
    new: bool


class Queued(msgspec.Struct, frozen=True, gc=False):
    """A decision: proposal ``pid`` joins the back of its group's queue, to be admitted by
    ``deadline`` (ns)."""

    pid: int
    deadline: int


class ProposalQueue:
    """The proposal queue of every group (see the module docstring); a reconfigure's own
    steps are ``reconfigure.py``'s functions.

    It reads the groups it is handed, the proposals (which it adds to and resolves), the
    fold's time (``fold.now``) and the admission rule (``admission_problem``); it returns
    its decisions (a proposal's arrival, the head of the queue) and changes nothing."""

    def __init__(
        self,
        fold: FoldContext,
        proposals: dict[int, Proposal],
        admission_problem: Callable[[GroupState, tuple[int, ...]], str | None],
    ) -> None:
        self._fold = fold
        self._proposals = proposals
        self._admission_problem = admission_problem

    def on_proposal(
        self, g: GroupState, record: Record, call: ProposalInput, now: int
    ) -> list[Any]:
        """A proposal is logged and queued (first in, first out); ``_settle`` decides it.

        A group that failed to form or was shut down rejects it at once. A reconfigure's
        further members' calls join the proposal of their uuid (``reconfigure.py``). It reads
        the group and the proposals, and returns its decisions (``Recorded``, then ``Queued``
        or an ``outcomes.Rejected``, and the ``proposal_accepted`` effect); it changes
        nothing."""
        reconfigure = call.op == RECONFIGURE
        pid = g.uuids.get(call.uuid) if reconfigure else None  # type: ignore[arg-type]
        if pid is not None:
            joined = joined_call(self._proposals[pid], call)
            accepted = ProposalAccepted(proposal=joined, offset=record.offset)
            return [Recorded(joined, False), accepted]
        proposal = Proposal(
            id=record.offset,
            group=g.name,
            op=call.op,
            ranks=tuple(call.ranks),
            proposer=call.proposer,
            idempotency_key=call.idempotency_key,
            status=PENDING,
            version=None,
            reason="queued",
            dropped_ranks=(),
            offset=record.offset,
            resolved_offset=None,
        )
        if reconfigure:
            proposal = msgspec.structs.replace(
                proposal,
                uuid=call.uuid,
                incarnations=tuple(call.incarnations),  # type: ignore[arg-type]
                callers=(call.caller,),
                calls=(call.call,),
                timeout_s=call.timeout_s,
            )
        decided: list[Any] = [
            Recorded(proposal, True),
            ProposalAccepted(proposal=proposal, offset=record.offset),
        ]
        if g.formation == FAILED:
            why = f"group failed to form: {g.formation_error}"
            decided.append(Rejected((proposal.id,), why))
        elif g.shutdown is not None:
            decided.append(Rejected((proposal.id,), f"group was shut down ({g.shutdown})"))
        else:
            decided.append(Queued(proposal.id, now + admission_timeout_ns(g, proposal)))
        return decided

    def decide_head(self, g: GroupState) -> list[Any]:
        """Decide the proposal at the head of the queue: nothing while it waits (or with no
        head), else its decisions. It changes nothing.

        Checked in order: ranks in range and distinct (else rejected); the resulting view equal
        to the current one (then ``applied`` at once with the current version: deduplication);
        for deactivate, at least ``min_active`` ranks left; for activate, every rank of the
        result HEALTHY and the result a clique of usable edges. A head that is not admissible
        yet waits until its admission deadline, then is rejected naming each rank and state.
        A reconfigure has rules of its own (``reconfigure.py``). A head decided leaves the
        queue: ``outcomes.Rejected`` (``dequeue``), or ``outcomes.Dequeued`` followed by its
        ``outcomes.Resolved`` or the change that carries it (``barrier.Prepared``).
        """
        if not g.queue:
            return []
        pid, deadline = g.queue[0]
        proposal = self._proposals[pid]
        now = self._fold.now
        if proposal.op == RECONFIGURE:
            decided = decide_reconfigure(g, proposal, deadline, now, self._admission_problem)
            if isinstance(decided, list):  # it waits, or it is rejected
                return decided
            target, detail, extra = decided
            change = prepare(g, target, RECONFIGURE, (pid,), detail, now, extra=extra)
            return [Dequeued(pid), change]
        invalid = static_problem(g, proposal)
        if invalid is not None:
            return [Rejected((pid,), invalid, dequeue=True)]
        active = g.active
        target = requested(proposal, active)
        if target == active:
            why = f"no change needed: version {g.version} already has active ranks {ranks_text(active)}"
            return [Dequeued(pid), Resolved(pid, APPLIED, g.version, why)]
        if proposal.op == "deactivate":
            if len(target) < g.cfg.min_active:
                why = (
                    f"deactivating {ranks_text(proposal.ranks)} would leave {len(target)} active "
                    f"ranks {ranks_text(target)}; min_active is {g.cfg.min_active}"
                )
                return [Rejected((pid,), why, dequeue=True)]
        else:
            problem = self._admission_problem(g, target)
            if problem is not None:
                if now < deadline:
                    return []
                why = f"not admissible by the admission deadline {deadline}: {problem}"
                return [Rejected((pid,), why, dequeue=True)]
        detail = f"proposal {pid}: {proposal.op} {ranks_text(proposal.ranks)}"
        return [Dequeued(pid), prepare(g, target, "proposal", (pid,), detail, now)]


def auto_deactivate(g: GroupState, now: int) -> Prepared | None:
    """Active ranks outside the Healthy Set are removed through the barrier: the change it
    decides at ``now``, or None. This takes precedence over queued proposals but never
    preempts the change in flight (the machine asks only with none). It never empties the
    view: with no active rank left healthy, the group waits. It changes nothing.

    When every rank it removes exited cleanly, the change says so: cause ``exit``
    (``ranks [1] exited cleanly``), the words of ``wire.life``; a clean exit is no
    failure and reads as none. Otherwise the cause is ``auto_deactivation``, naming each
    rank's state."""
    active = g.active
    healthy = g.healthy
    leaving = [r for r in active if r not in healthy]
    if not leaving or len(leaving) == len(active):
        return None
    target = tuple(r for r in active if r in healthy)
    if all(g.ranks[r].exited for r in leaving):
        detail = f"ranks {ranks_text(leaving)} {RANK_WORDS[EXITED]}"
        return prepare(g, target, CLEAN_EXIT, (), detail, now)
    states = ", ".join(f"{r} {g.ranks[r].state}" for r in leaving[:16])
    more = f", ... (+{len(leaving) - 16} more)" if len(leaving) > 16 else ""
    detail = f"active ranks left the Healthy Set: {states}{more}"
    return prepare(g, target, "auto_deactivation", (), detail, now)


def admission_timeout_ns(g: GroupState, proposal: Proposal) -> int:
    """How long ``proposal`` may wait at the head to become admissible: a reconfigure's own
    ``timeout_s`` (its first call's), else the group's ``admission_timeout_s``."""
    if proposal.timeout_s is not None:
        return round(proposal.timeout_s * 1_000_000_000)
    return g.cfg.admission_timeout_ns


class Attached(msgspec.Struct, frozen=True, gc=False):
    """A decision: the head of the queue, proposal ``pid``, rides along with the change in
    flight (it resolves with that change's version)."""

    pid: int


def attach_heads(g: GroupState, proposals: dict[int, Proposal]) -> list[Any]:
    """While a change is in flight, heads it already satisfies ride along with it (and
    resolve with its version when it commits); malformed heads are rejected at once. Its
    decisions (``Attached``, ``outcomes.Rejected``) take the heads in order; it changes
    nothing."""
    change = g.change
    assert change is not None
    decisions: list[Any] = []
    for pid, _ in g.queue:
        proposal = proposals[pid]
        invalid = static_problem(g, proposal)
        if invalid is not None:
            decisions.append(Rejected((pid,), invalid, dequeue=True))
            continue
        if proposal.op == RECONFIGURE:  # a new configuration: a view change of its own
            break
        if requested(proposal, change.active) != change.active:
            break
        decisions.append(Attached(pid))
    return decisions


def expire_unformed_heads(g: GroupState, now: int) -> list[Rejected]:
    """Before formation nothing can be admitted, but admission deadlines still run: the heads
    whose deadline passed are rejected, in order. It changes nothing."""
    expired = []
    for pid, deadline in g.queue:
        if deadline > now:
            break
        why = f"group {g.name!r} had not formed by the admission deadline {deadline}"
        expired.append(Rejected((pid,), why, dequeue=True))
    return expired
