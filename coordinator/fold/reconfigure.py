"""A reconfigure: torch's ``ProcessGroup.reconfigure`` as one proposal and one committed view.

The rule. torch's reconfigure API (torch >= 2.14) changes a group by the consent of its new
members: each calls ``reconfigure(uuid, handles)`` with the same fresh uuid and the same handles
in the same order (a handle names the group, a rank and its incarnation; a list orders the new
ranks by position), and ranks left out do not call. Here each member's call is a ``proposal``
record (``op: reconfigure``, ``ranks`` in handle order, each member's ``incarnations``, the
``uuid``, the ``caller``), and all the calls of one uuid are ONE proposal:

- The first call of a uuid creates the proposal (its id is that record's offset), queued first
  in, first out like every proposal. Each other member's call with the same uuid and the same
  members (the same ranks in the same order, as the same incarnations) is logged and joins it
  (``callers``), so the log says who called and when.
- A call may carry its ``call`` id (the agent makes one per ``reconfigure()``): the same call
  sent again (the same member, uuid, members and call id: a retry after a lost answer) is
  answered with the proposal, and nothing is logged.
- Refused, and not logged (the caller learns at once; the uuid stays unused): a caller that is
  not one of the members (ranks left out do not call: ``invalid_event``); a caller whose own
  handle names an incarnation other than its current one, or that is OFFLINE (as for every
  rank input: ``stale_incarnation``, ``rank_offline``); a uuid whose pending proposal has other
  members (``idempotency_conflict``, naming both); a uuid used before in this group by a
  proposal that is over, or by an earlier call of the same member (``reconfigure_uuid_used``,
  naming the proposal's outcome and its view: pass a fresh uuid each time).
- Decided at the head of the queue, so it never races the coordinator's own changes: one change
  is in flight per group, and formation, auto-deactivation and a stalled view's retry go before
  the queue's head. A reconfigure that waited behind such a change is checked against the view
  that change committed.

  - ranks out of range or named twice: ``rejected`` (``admission.static_problem``);
  - a member whose handle names an incarnation that is not the rank's current one (the process
    that made the handle is gone), or that is OFFLINE or exited: ``rejected`` at once, naming
    the member, its state and incarnation (the members left can reconfigure with a fresh uuid);
  - a member that has not called yet, a member that is not HEALTHY, or members that are not a
    clique of usable edges: it waits; at its admission deadline (its first call's ``timeout_s``,
    else the group's ``admission_timeout_s``) it is ``rejected``, naming the members that never
    called, or each member and its state; the last committed view stays;
  - else a view change whose active ranks are the members, even when they are the active ranks
    already: a reconfigure always makes a new configuration, as torch builds a new communicator
    for each. Its cause is ``{"kind": "reconfigure", "proposals": [id], "detail", "uuid",
    "order"}`` (``order``: the members in handle order). It never rides along with another
    change.

The view change is the usual barrier: ``applied`` once every participant ACKed, or
``applied_with_dropped_ranks`` when a participant was lost meanwhile (the view commits without
it; the members' reconfigure fails, and each keeps its last configuration, torch's way).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from ...wire.codes import (
    APPLIED,
    APPLIED_WITH_DROPPED_RANKS,
    DUPLICATE_PROPOSAL,
    IDEMPOTENCY_CONFLICT,
    INVALID_EVENT,
    PENDING,
    RECONFIGURE_UUID_USED,
)
from ...wire.inputs import ProposalInput
from .admission import static_problem
from .effects import (
    OFFLINE,
    Proposal,
)
from .outcomes import Rejected
from .reasons import LIMIT, abridged, ranks_text
from .state import GroupState

#: (code, message)
Refusal = tuple[str, str]


# -- a call, before it is logged ------------------------------------------------------------------


def caller_problem(call: ProposalInput) -> Refusal | None:
    """A call from a rank that is not one of the members: ranks left out do not call."""
    caller, ranks = call.caller, call.ranks
    if caller not in ranks:
        return INVALID_EVENT, (
            f"reconfigure uuid {call.uuid}: caller {caller} is not one of the members "
            f"{ranks_text(ranks)}; a rank the reconfigure leaves out does not call it"
        )
    return None


def uuid_refusal(
    g: GroupState, proposals: Mapping[int, Proposal], call: ProposalInput
) -> Refusal | None:
    """Why a call cannot join or start the proposal of its uuid (None: it may)."""
    seen = uuid_proposal(g, proposals, call.uuid)  # type: ignore[arg-type]
    if seen is None:
        return None
    caller = call.caller
    same = same_members(seen, call)
    if same and same_call(seen, call):
        return DUPLICATE_PROPOSAL, (
            f"call {call.call} of rank {caller} is already in proposal {seen.id} "
            f"(reconfigure uuid {seen.uuid}, status {seen.status})"
        )
    if caller in seen.callers:
        return RECONFIGURE_UUID_USED, (
            f"rank {caller} already called reconfigure uuid {seen.uuid} in another call: "
            + used_text(g, seen)
        )
    if seen.status != PENDING:
        return RECONFIGURE_UUID_USED, used_text(g, seen)
    if not same:
        return IDEMPOTENCY_CONFLICT, (
            f"reconfigure uuid {seen.uuid} already names proposal {seen.id} with members "
            f"{members_text(seen.ranks, seen.incarnations)} (called by "
            f"{ranks_text(seen.callers)}); rank {caller} calls it with members "
            f"{members_text(call.ranks, call.incarnations)}"
        )
    return None


def repeated_call(
    g: GroupState, proposals: Mapping[int, Proposal], call: ProposalInput
) -> int | None:
    """The proposal a call repeats (the same call of the same member, sent again: the same
    uuid, members and call id), so the host answers with it and logs nothing; None otherwise."""
    seen = uuid_proposal(g, proposals, call.uuid)  # type: ignore[arg-type]
    if seen is None or not same_members(seen, call) or not same_call(seen, call):
        return None
    return seen.id


def same_call(seen: Proposal, call: ProposalInput) -> bool:
    """The caller called before with this very call id (a call without one is never the same)."""
    if call.call is None or call.caller not in seen.callers:
        return False
    return seen.calls[seen.callers.index(call.caller)] == call.call


def uuid_proposal(g: GroupState, proposals: Mapping[int, Proposal], uuid: int) -> Proposal | None:
    """The proposal that ``uuid`` names in group ``g``, if any."""
    pid = g.uuids.get(uuid)
    return None if pid is None else proposals[pid]


def same_members(seen: Proposal, call: ProposalInput) -> bool:
    """The same reconfigure: the same ranks in the same order, as the same incarnations."""
    return seen.ranks == tuple(call.ranks) and seen.incarnations == tuple(
        call.incarnations  # type: ignore[arg-type]
    )


def used_text(g: GroupState, seen: Proposal) -> str:
    """Why a uuid cannot be used again: the outcome of the proposal that used it."""
    if seen.status in (APPLIED, APPLIED_WITH_DROPPED_RANKS):
        outcome = f"{seen.status} in version {seen.version} of group {g.name!r}"
    else:
        outcome = f"{seen.status}: {seen.reason}"
    return (
        f"reconfigure uuid {seen.uuid} was already used: proposal {seen.id} (members "
        f"{list(seen.ranks)}) was {outcome}; pass a fresh uuid each time"
    )


def members_text(ranks: tuple[int, ...] | list[int], incarnations: Any) -> str:
    """``[0 as inc-a, 2 as inc-c]``: members in their order, abridged when long."""
    return "[" + abridged([f"{r} as {i}" for r, i in zip(ranks, incarnations, strict=True)]) + "]"


# -- the proposal, once logged --------------------------------------------------------------------


def gone_members(g: GroupState, proposal: Proposal) -> list[str]:
    """The members that can never take part: the handle names an incarnation that is not the
    rank's current one, or the rank is OFFLINE (dead, timed out, exited). Each named with its
    state and incarnation."""
    out: list[str] = []
    for rank, inc in zip(proposal.ranks, proposal.incarnations, strict=True):
        info = g.ranks[rank]
        if info.incarnation != inc:
            now = (
                "has not joined"
                if info.incarnation is None
                else f"is incarnation {info.incarnation} now (rank_epoch {info.rank_epoch})"
            )
            out.append(f"rank {rank}'s handle names incarnation {inc}, but rank {rank} {now}")
        elif info.state == OFFLINE:
            how = "exited" if info.exited else "OFFLINE"
            out.append(f"rank {rank} is {how} (incarnation {inc})")
    return out


def reconfigure_detail(proposal: Proposal) -> str:
    """The cause's detail of a reconfigure's view."""
    return (
        f"proposal {proposal.id}: reconfigure uuid {proposal.uuid} to members "
        f"{_order_text(proposal.ranks)} in that order, called by {ranks_text(proposal.callers)}"
    )


def _order_text(ranks: tuple[int, ...]) -> str:
    """The members in handle order (not sorted), abridged when long."""
    return "[" + abridged([str(r) for r in ranks], LIMIT) + "]"


#: A reconfigure's view change, to prepare: its active ranks, its detail, its cause's extra.
Prepare = tuple[tuple[int, ...], str, dict[str, Any]]


def joined_call(proposal: Proposal, call: ProposalInput) -> Proposal:
    """A further member's call of a pending reconfigure joins its proposal (its checks let
    it through: the same members, a member that had not called): the proposal it makes."""
    return msgspec.structs.replace(
        proposal,
        callers=(*proposal.callers, call.caller),
        calls=(*proposal.calls, call.call),
    )


def decide_reconfigure(
    g: GroupState,
    proposal: Proposal,
    deadline: int,
    now: int,
    admission_problem: Callable[[GroupState, tuple[int, ...]], str | None],
) -> list[Rejected] | Prepare:
    """Decide the reconfigure at the head of ``g``'s queue (the module docstring's order), at
    ``now``, its admission deadline ``deadline``: nothing (``[]``) while it waits, its rejection
    (``outcomes.Rejected``, leaving the queue), else the view change to prepare for it (the
    queue makes it a ``barrier.Prepared``: the barrier imports the ranks, whose fences import
    this file). It changes nothing."""
    pid = proposal.id
    invalid = static_problem(g, proposal)
    gone = [] if invalid is not None else gone_members(g, proposal)
    if invalid is not None or gone:
        why = invalid or (abridged(gone) + "; the members left can reconfigure with a fresh uuid")
        return [Rejected((pid,), f"reconfigure uuid {proposal.uuid}: {why}", dequeue=True)]
    target = tuple(sorted(proposal.ranks))
    missing = [r for r in proposal.ranks if r not in proposal.callers]
    if missing:
        problem: str | None = (
            f"members {ranks_text(missing)} never called it (called: "
            f"{ranks_text(proposal.callers)})"
        )
    else:
        problem = admission_problem(g, target)
    if problem is not None:
        if now < deadline:
            return []
        why = (
            f"reconfigure uuid {proposal.uuid} not admissible by the admission deadline "
            f"{deadline}: {problem}; the last committed view (version {g.version}) stays"
        )
        return [Rejected((pid,), why, dequeue=True)]
    extra = {"uuid": proposal.uuid, "order": list(proposal.ranks)}
    return target, reconfigure_detail(proposal), extra
