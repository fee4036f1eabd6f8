"""The epochs facet's moves: how ranges of a plan move between ranks, as one committed
decision (``decide``), and the weights that size each rank's share (``plan_weights``,
``rate_weights``), what a move may take from a holding (``movable``) and what a committed view
moves (``view_moves``). ``fold.py`` decides
when a move happens; its module docstring states the rules.
"""

from __future__ import annotations

from ...coordinator.fold.effects import Effect, View
from ...coordinator.fold.reasons import abridged, ranks_text
from ...coordinator.fold.state import GroupState
from ...eventlog.record import Record
from .effects import AssignmentChanged, Move
from .partition import Segment, apportion, integer_weights, normalized, split_at
from .state import Epoch, GroupEpochs, Holding


def decide(
    g: GroupState,
    ge: GroupEpochs,
    e: Epoch,
    gives: dict[int, int],
    gets: dict[int, int],
    cause: str,
    detail: str,
    record: Record,
    effects: list[Effect],
    *,
    version: int | None = None,
) -> None:
    """One committed move: the tails ``gives`` names (positions per donor, rank order)
    leave their sequences into one pool, dealt in rank order to the ranks of ``gets``.
    Donors are fenced at the new assignment; a rank whose part did not change keeps its
    fence, so its reports in flight stay good; a taker notes where its part grew, so a
    report made before counts nothing of what it got. The effect carries the moves only: each
    rank's new part is its old one with them applied, and ``reported`` names the ranks whose
    cursor is then at the end of what they kept (a leaver, a rank that ran dry)."""
    e.assignment += 1
    e.decided = record.offset
    a = e.assignment
    pool: list[tuple[int, Segment]] = []
    for donor in sorted(gives):
        h = e.holdings[donor]
        keep = h.held - gives[donor]
        h.sequence, tail = split_at(h.sequence, keep)
        pool.extend((donor, s) for s in tail)
        h.fence = h.assignment = a
        h.grown = []
    reported = tuple(
        r
        for r in sorted(set(gives) | set(gets))
        if r in e.holdings and e.holdings[r].remaining == 0
    )
    moves: list[Move] = []
    segments = [s for _, s in pool]
    owners = [d for d, _ in pool]
    for taker in sorted(gets):
        n = gets[taker]
        h = e.holding(taker)
        h.grown.append((a, h.held))
        while n > 0:
            start, size = segments[0]
            part = min(size, n)
            h.sequence.append((start, part))
            moves.append(Move(from_rank=owners[0], to_rank=taker, start=start, length=part))
            if part == size:
                segments.pop(0)
                owners.pop(0)
            else:
                segments[0] = (start + part, size - part)
            n -= part
        h.sequence = normalized(h.sequence)
        h.assignment = a
    assert not segments, "every position given up is taken"
    ge.changes += 1
    effects.append(
        AssignmentChanged(
            group=g.name,
            epoch=e.number,
            assignment=a,
            version=g.version if version is None else version,
            cause=cause,
            detail=detail,
            change=ge.changes,
            moves=tuple(moves),
            reported=reported,
            offset=record.offset,
        )
    )


def plan_weights(
    ge: GroupEpochs, e: Epoch, g: GroupState, members: tuple[int, ...] | list[int]
) -> dict[int, int]:
    """The plan's weights over ``members`` (integers): 1 each for an equal split, the
    plan's ratios (equal when no member has a positive one), or the reported rates."""
    if e.plan.split == "ratios":
        ratios = e.plan.partition_ratios or ()
        weights = integer_weights({r: ratios[r] for r in members})
        if any(weights.values()):
            return weights
        return {r: 1 for r in members}
    if e.plan.split == "throughput":
        return rate_weights(ge, g, members)
    return {r: 1 for r in members}


def rate_weights(
    ge: GroupEpochs, g: GroupState, ranks: tuple[int, ...] | list[int]
) -> dict[int, int]:
    """Each rank's reported rate as an integer weight; a rank that reported none counts
    as the mean of those that did (1 when none did)."""
    known = [ge.rates[r] for r in ranks if ge.rates.get(r, 0) > 0]
    mean = sum(known) / len(known) if known else 1.0
    return integer_weights({r: ge.rates.get(r) or mean for r in ranks})


def movable(e: Epoch, h: Holding) -> int:
    """What a move may take from a holding: its remaining work beyond the lookahead its
    sampler may already be reading."""
    return max(0, h.remaining - e.plan.lookahead)


def view_moves(
    e: Epoch, view: View, base: View | None, weights: dict[int, int]
) -> tuple[dict[int, int], dict[int, int], list[str]]:
    """What a committed view moves (``Epochs.view_committed``): the remainders of the ranks
    that left it, split across its members by ``weights``; then each joiner's weighted share
    of what is left, from the members with the most to spare. Returns the positions each
    donor gives, each taker gets, and the decision's details."""
    members = view.active_ranks
    leavers = [r for r in sorted(e.holdings) if e.holdings[r].remaining and not view.is_active(r)]
    gives: dict[int, int] = {}
    gets: dict[int, int] = {}
    details: list[str] = []
    if leavers:
        pooled = sum(e.holdings[r].remaining for r in leavers)
        for r in leavers:
            gives[r] = e.holdings[r].remaining
        shares = apportion(pooled, weights, e.plan.grain)
        for r, n in shares.items():
            if n:
                gets[r] = gets.get(r, 0) + n
        details.append(
            f"{_ranks_word(leavers)} left the view (version {view.version}): "
            f"{pooled} remaining positions split across {ranks_text(r for r in shares if shares[r])}"
        )
    old = set(base.active_ranks) if base is not None else set()
    joiners = [r for r in members if r not in old and not _holds(e, r) and r not in gets]
    if joiners:
        after = {r: _remaining_after(e, r, gives, gets) for r in members}
        total = sum(after.values())
        target = apportion(total, weights, e.plan.grain) if total else {}
        for j in joiners:
            need = target.get(j, 0)
            taken: list[str] = []
            spare_of = {
                d: min(
                    max(0, after[d] - target.get(d, 0)),
                    movable(e, e.holdings[d]) - gives.get(d, 0),
                )
                for d in members
                if d != j and d in e.holdings and d not in gets
            }
            for d in sorted(spare_of, key=lambda d: (-spare_of[d], d)):
                give = min(spare_of[d], need) // e.plan.grain * e.plan.grain
                if give <= 0:
                    continue
                gives[d] = gives.get(d, 0) + give
                gets[j] = gets.get(j, 0) + give
                after[d] -= give
                after[j] = after.get(j, 0) + give
                need -= give
                taken.append(f"{give} from rank {d}")
                if need < e.plan.grain:
                    break
            if taken:
                details.append(f"rank {j} joined: it took {abridged(taken)}")
    return gives, gets, details


def _ranks_word(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks_text(ranks)}"


def _holds(e: Epoch, rank: int) -> bool:
    h = e.holdings.get(rank)
    return h is not None and h.remaining > 0


def _remaining_after(e: Epoch, rank: int, gives: dict[int, int], gets: dict[int, int]) -> int:
    h = e.holdings.get(rank)
    have = 0 if h is None else h.remaining
    return have - gives.get(rank, 0) + gets.get(rank, 0)
