"""The epochs facet's request and answer bodies (docs/protocol.md); its routes add them to
the OpenAPI document's components (``SCHEMA_TYPES`` in ``routes.py``)."""

from __future__ import annotations

from typing import Any, Literal

from msgspec import Struct

from ...wire.protocol import request_body
from .inputs import EpochPlan

EpochPlanRequest = request_body(
    EpochPlan,
    "EpochPlanRequest",
    doc="""``POST /groups/{group}/epochs``: one pass over a dataset (docs/data.md). Fields left
    out take their defaults (``facets.epochs.inputs.PLAN_DEFAULTS``; ``reclaim`` is on
    for a throughput split).""",
    forbid_unknown_fields=True,
)


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
