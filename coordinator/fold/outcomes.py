"""A proposal's outcome: each proposal resolves once, and never changes afterwards.

The rule. A proposal leaves ``pending`` exactly once, for ``applied`` (with the version that
carries it), ``applied_with_dropped_ranks`` (naming the ranks dropped for a missing ACK) or
``rejected`` (with the reason); the ``proposal_resolved`` effect tells of it. Every rule that
decides a proposal (the queue, the barrier, the budget, a group's end) resolves it here, or
returns a :class:`Rejected` for the machine to resolve (``apply.py``).
"""

from __future__ import annotations

import msgspec

from ...eventlog.record import Record
from ...wire.codes import PENDING
from .effects import Effect, Proposal, ProposalResolved


class Resolved(msgspec.Struct, frozen=True, gc=False):
    """A decision: proposal ``pid`` resolves ``status`` (with ``version``, ``reason`` and the
    ranks ``dropped``)."""

    pid: int
    status: str
    version: int | None
    reason: str
    dropped: tuple[int, ...] = ()


class Rejected(msgspec.Struct, frozen=True, gc=False):
    """A decision: the proposals ``pids`` (in order) are rejected for ``reason``;
    ``dequeue``: they are the head of the group's queue, which they leave."""

    pids: tuple[int, ...]
    reason: str
    dequeue: bool = False


class Dequeued(msgspec.Struct, frozen=True, gc=False):
    """A decision: proposal ``pid``, the head of its group's queue, leaves it (the change
    prepared next carries it, or it resolved at once)."""

    pid: int


def resolve(
    proposals: dict[int, Proposal],
    pid: int,
    status: str,
    version: int | None,
    reason: str,
    record: Record,
    effects: list[Effect],
    dropped: tuple[int, ...] = (),
) -> None:
    """Give proposal ``pid`` its one terminal outcome in ``proposals``, and tell of it."""
    proposal = proposals[pid]
    assert proposal.status == PENDING, f"proposal {pid} is already {proposal.status}"
    resolved = msgspec.structs.replace(
        proposal,
        status=status,
        version=version,
        reason=reason,
        dropped_ranks=dropped,
        resolved_offset=record.offset,
    )
    proposals[pid] = resolved
    effects.append(ProposalResolved(proposal=resolved, offset=record.offset))
