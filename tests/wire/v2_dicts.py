"""The agent updates as protocol 2 wrote them before its updates were typed: dict builders,
kept verbatim as the oracle of the wire format. ``tests/wire/test_updates.py`` checks that
every typed update (``wire.updates``) encodes to exactly the JSON these give for the same fold
outputs, so an agent of either side understands the other."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from foldplane.coordinator.fold.effects import RankState, ShutdownWithSave
from foldplane.coordinator.fold.projections import to_doc
from foldplane.facets.epochs.effects import (
    AssignmentChanged,
    EpochCompleted,
    EpochPlanned,
    PartSent,
)
from foldplane.facets.refits.effects import (
    RefitBootstrap,
    RefitEpochChanged,
    TransferChanged,
)
from foldplane.wire import ranks as rank_sets
from foldplane.wire.protocol import View

_SET_FIELDS = ("active_ranks", "healthy_set", "acked_ranks", "dropped_ranks")


def _set_delta(old: Iterable[int], new: Iterable[int]) -> dict[str, Any]:
    old_s, new_s = set(old), set(new)
    delta: dict[str, Any] = {}
    if add := new_s - old_s:
        delta["add"] = rank_sets.encode(add)
    if remove := old_s - new_s:
        delta["remove"] = rank_sets.encode(remove)
    return delta


def view_update(base: View | None, view: View) -> dict[str, Any]:
    old_states: Mapping[int, str] = base.rank_states if base is not None else {}
    changed: dict[str, list[int]] = {}
    for rank, state in view.rank_states.items():
        if old_states.get(rank) != state:
            changed.setdefault(state, []).append(rank)
    update: dict[str, Any] = {
        "offset": view.offset,
        "type": "view_committed",
        "group": view.group,
        "version": view.version,
        "base": base.version if base is not None else 0,
        "states": {state: rank_sets.encode(rs) for state, rs in sorted(changed.items())},
        "cause": view.cause,
        "ts": view.ts,
    }
    if view.checkpoint_rank is not None:
        update["checkpoint_rank"] = view.checkpoint_rank
    for name in _SET_FIELDS:
        update[name] = _set_delta(
            getattr(base, name) if base is not None else (), getattr(view, name)
        )
    return update


def prepare_update(
    *,
    group: str,
    version: int,
    base: View | None,
    active_ranks: Iterable[int],
    participants: Iterable[int],
    ack_deadline_ts: int,
    offset: int,
) -> dict[str, Any]:
    old = base.active_ranks if base is not None else ()
    members = set(old) | set(active_ranks)
    absent = members - set(participants)
    return {
        "offset": offset,
        "type": "view_prepare",
        "group": group,
        "version": version,
        "base": base.version if base is not None else 0,
        "active_ranks": _set_delta(old, active_ranks),
        "absent": rank_sets.encode(absent),
        "ack_deadline_ts": ack_deadline_ts,
    }


def rank_state_update(effect: RankState) -> dict[str, Any]:
    update = {
        "offset": effect.offset,
        "type": "rank_state",
        "group": effect.group,
        "rank": effect.rank,
        "state": effect.state,
        "incarnation": effect.incarnation,
        "rank_epoch": effect.rank_epoch,
        "reason": effect.reason,
    }
    if effect.cause is not None:
        update["cause"] = effect.cause
    return update


def shutdown_update(effect: ShutdownWithSave) -> dict[str, Any]:
    return {
        "offset": effect.offset,
        "type": "shutdown_with_save",
        "group": effect.group,
        "reason": effect.reason,
        "detail": effect.detail,
        "checkpoint_rank": effect.checkpoint_rank,
    }


def epoch_plan_update(effect: EpochPlanned) -> dict[str, Any]:
    return {
        "offset": effect.offset,
        "type": "epoch_plan",
        "group": effect.group,
        "version": effect.version,
        **{k: v for k, v in effect.plan.items() if k != "partition_ratios"},
    }


def data_assignment_update(
    *,
    group: str,
    rank: int,
    epoch: int,
    assignment: int,
    processed: int,
    remaining: Sequence[tuple[int, int]],
    offset: int,
) -> dict[str, Any]:
    return {
        "offset": offset,
        "type": "data_assignment",
        "group": group,
        "rank": rank,
        "epoch": epoch,
        "assignment": assignment,
        "processed": processed,
        "remaining": [[s, n] for s, n in remaining],
    }


def part_sent_update(effect: PartSent) -> dict[str, Any]:
    return data_assignment_update(
        group=effect.group,
        rank=effect.rank,
        epoch=effect.epoch,
        assignment=effect.assignment,
        processed=effect.processed,
        remaining=effect.remaining,
        offset=effect.offset,
    )


def data_assignment_updates(effect: EpochPlanned) -> list[dict[str, Any]]:
    return [
        data_assignment_update(
            group=effect.group,
            rank=r.rank,
            epoch=effect.epoch,
            assignment=effect.assignment,
            processed=r.processed,
            remaining=r.remaining,
            offset=effect.offset,
        )
        for r in effect.ranges
    ]


def data_moves_update(effect: AssignmentChanged) -> dict[str, Any]:
    return {
        "offset": effect.offset,
        "type": "data_moves",
        "group": effect.group,
        "epoch": effect.epoch,
        "assignment": effect.assignment,
        "moves": [[m.from_rank, m.to_rank, m.start, m.length] for m in effect.moves],
        "reported": list(effect.reported),
    }


def epoch_complete_update(effect: EpochCompleted) -> dict[str, Any]:
    return {
        "offset": effect.offset,
        "type": "epoch_complete",
        "group": effect.group,
        "epoch": effect.epoch,
    }


def refit_epoch_update(effect: RefitEpochChanged) -> dict[str, Any]:
    doc = to_doc(effect)
    doc["type"] = "refit_epoch"
    # ``lost`` came later within protocol 2: optional, sent only when set (a reader that does
    # not know it ignores it, as every update Struct does with a field it does not declare)
    if doc.get("lost") is None:
        doc.pop("lost", None)
    return doc


def transfer_update(effect: TransferChanged) -> dict[str, Any]:
    doc = to_doc(effect)
    doc["type"] = "transfer"
    return doc


def refit_bootstrap_update(effect: RefitBootstrap) -> dict[str, Any]:
    return {
        "offset": effect.offset,
        "type": "refit_bootstrap",
        "refit": effect.refit,
        "epoch": effect.epoch,
        "bootstrap": effect.bootstrap,
    }
