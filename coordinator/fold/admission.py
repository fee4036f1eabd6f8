"""Proposal admission: what a proposal asks for, and why it cannot be admitted (yet).

Rules (SPEC "Proposals"): ranks in range and named once, or the proposal is rejected at once;
an activation is admitted only when every rank of the resulting view is HEALTHY and the result
is a clique of usable edges. A deactivation needs neither: removing a dead rank must always be
possible; only ``min_active`` bounds it (checked by the fold).
"""

from __future__ import annotations

from .effects import HEALTHY, Proposal
from .reasons import abridged, ranks_text
from .state import GroupState


def requested(proposal: Proposal, active: tuple[int, ...]) -> tuple[int, ...]:
    """The active ranks ``proposal`` asks for, starting from ``active`` (sorted): a
    reconfigure asks for its members, whatever is active now."""
    if proposal.op == "reconfigure":
        return tuple(sorted(set(proposal.ranks)))
    if proposal.op == "activate":
        return tuple(sorted(set(active) | set(proposal.ranks)))
    leaving = set(proposal.ranks)
    return tuple(r for r in active if r not in leaving)


def static_problem(g: GroupState, proposal: Proposal) -> str | None:
    """Ranks out of range or named twice: wrong whatever happens later, so rejected at once."""
    ws = g.cfg.world_size
    out = sorted({r for r in proposal.ranks if not 0 <= r < ws})
    if out:
        return f"ranks {ranks_text(out)} are not in 0..{ws - 1}"
    seen: set[int] = set()
    dup: set[int] = set()
    for r in proposal.ranks:
        (dup if r in seen else seen).add(r)
    if dup:
        return f"ranks {ranks_text(dup)} are named more than once"
    return None


def admission_problem(g: GroupState, target: tuple[int, ...]) -> str | None:
    """Why the view ``target`` cannot be admitted now, naming each rank and its state."""
    bad = [r for r in target if g.ranks[r].state != HEALTHY]
    if bad:
        return abridged([f"rank {r} is {g.ranks[r].state}" for r in bad])
    members = set(target)
    down = sorted(
        (r, p) for r in g.reporters if r in members for p in g.ranks[r].down if p in members
    )
    if down:
        return "not a clique of usable edges: " + abridged([f"{r}->{p} down" for r, p in down])
    return None
