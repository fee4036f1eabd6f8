"""Fencing a proposal: an idempotency key names one proposal of its group; the same body under
a known key is that proposal again (a duplicate, or a repeat ``fencing.repeat_of`` answers),
another body a conflict naming both; a reconfigure is one member's call, fenced as its rank's
inputs are (``fencing_ranks.online_rank_refusal``) and by its uuid
(``coordinator/fold/reconfigure.py``).
"""

from __future__ import annotations

from collections.abc import Mapping

from ...wire.codes import DUPLICATE_PROPOSAL, IDEMPOTENCY_CONFLICT
from ...wire.inputs import RECONFIGURE, ProposalInput
from .effects import Proposal
from .fencing_ranks import Refusal, online_rank_refusal
from .reconfigure import caller_problem, uuid_refusal
from .state import GroupState


def proposal_refusal(
    g: GroupState, proposals: Mapping[int, Proposal], proposal: ProposalInput
) -> Refusal | None:
    """A known idempotency key: the same body is the same proposal, another body a conflict.

    A reconfigure is one member's call (``coordinator/fold/reconfigure.py``): the caller is a
    member, speaking as its current, online incarnation (fenced as every rank input), and its
    uuid is new or names a pending proposal with the same members."""
    if proposal.op == RECONFIGURE:
        return (
            caller_problem(proposal)
            or online_rank_refusal(g, "reconfigure", proposal.caller, proposal.caller_incarnation)
            or uuid_refusal(g, proposals, proposal)
        )
    seen = keyed(g, proposals, proposal)
    if seen is None:
        return None
    key = proposal.idempotency_key
    if same_body(seen, proposal):
        return DUPLICATE_PROPOSAL, (
            f"idempotency key {key!r} already names proposal {seen.id} (status {seen.status})"
        )
    return IDEMPOTENCY_CONFLICT, (
        f"idempotency key {key!r} already names proposal {seen.id} "
        f"({seen.op} {list(seen.ranks)}, proposer {seen.proposer!r}); this one is "
        f"{proposal.op} {list(proposal.ranks)}, proposer {proposal.proposer!r}"
    )


def keyed(
    g: GroupState, proposals: Mapping[int, Proposal], proposal: ProposalInput
) -> Proposal | None:
    """The proposal of the group that the input's idempotency key already names, if any."""
    key = proposal.idempotency_key
    if key is None or key not in g.keys:
        return None
    return proposals[g.keys[key]]


def same_body(seen: Proposal, proposal: ProposalInput) -> bool:
    """The same body is the same request: the same op, set of ranks and proposer."""
    return (seen.op, sorted(set(seen.ranks)), seen.proposer) == (
        proposal.op,
        sorted(set(proposal.ranks)),
        proposal.proposer,
    )
