"""The epochs facet's request and answer bodies (docs/protocol.md); its routes add them to
the OpenAPI document's components (``SCHEMA_TYPES`` in ``routes.py``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import UNSET, Meta, Struct, UnsetType

from .inputs import MAX_DATASET


class EpochPlanRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /groups/{group}/epochs``: one pass over a dataset (docs/data.md). Fields left
    out take their defaults (``facets.epochs.fold.PLAN_DEFAULTS``; ``reclaim`` is on
    for a throughput split)."""

    epoch: Annotated[int, Meta(ge=0, le=MAX_DATASET)]
    dataset_size: Annotated[int, Meta(ge=1, le=MAX_DATASET)]
    seed: Annotated[int, Meta(ge=0, le=2**63 - 1)] | UnsetType = UNSET
    shuffle: bool | UnsetType = UNSET
    split: Literal["equal", "ratios", "throughput"] | UnsetType = UNSET
    partition_ratios: (
        Annotated[list[Annotated[float, Meta(ge=0, le=1e9)]], Meta(min_length=1, max_length=65_536)]
        | None
        | UnsetType
    ) = UNSET
    grain: Annotated[int, Meta(ge=1, le=MAX_DATASET)] | UnsetType = UNSET
    lookahead: Annotated[int, Meta(ge=0, le=MAX_DATASET)] | UnsetType = UNSET
    reclaim: bool | UnsetType = UNSET


class EpochRankBody(Struct, kw_only=True):
    rank: int
    #: positions it was given in the epoch (its sequence), and reported processed
    held: int
    processed: int
    #: what it still holds: ``[start, length]`` segments of the permutation, in reading order
    remaining: list[list[int]]
    assignment: int
    fence: int
    rate: float | None


class EpochBody(Struct, kw_only=True):
    """``GET /groups/{group}/epochs``: the open (or last) epoch, one page of its ranks."""

    group: str
    epoch: int
    plan: dict[str, Any]
    offset: int
    version: int
    assignment: int
    status: Literal["open", "complete"]
    completed_offset: int | None
    dataset_size: int
    unprocessed: int
    ranks: list[EpochRankBody]
    next_ranks_after: int | None
