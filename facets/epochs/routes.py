"""Epoch plans: declare one, read the open one (docs/data.md, docs/protocol.md).

An agent declares its group's epochs too (``ElasticSampler.set_epoch``, the worker part's): every rank
posts the same plan, the first one is appended and the others are answered with it (the fold's
``repeat_of``), so no rank waits for another to go first.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from fastapi import APIRouter, Path, Query, Request
from starlette.responses import Response

from ...api.codec import json_response, read_json
from ...api.deps import host_of, principal_of, require_group, require_operator
from ...api.errors import ApiError
from ...api.limits import MAX_RANKS_PAGE
from ...api.openapi import answers, body
from ...coordinator.fold.projections import to_doc
from ...coordinator.host.loop import Appended, Host, Refusal
from ...eventlog import NewRecord
from ...wire.codes import FORBIDDEN, UNKNOWN_EPOCH
from ...wire.protocol import QUERY
from .inputs import complete_plan
from .models import EpochBody, EpochPlanRequest

# each route names its tag: the console reads the decisions
router = APIRouter()
#: the bodies it adds to the OpenAPI document's components
SCHEMA_TYPES = (EpochPlanRequest, EpochBody)

GroupPath = Annotated[str, Path(max_length=QUERY.group_chars)]


@router.post(
    "/groups/{group}/epochs",
    summary="Declare an epoch plan (idempotent for the same plan); each active rank gets a part",
    openapi_extra=body("EpochPlanRequest"),
    responses=answers({201: "EpochBody", 200: "EpochBody"}, 401, 403, 404, 409, 413, 422),
    tags=["epochs"],
)
async def plan_epoch(request: Request, group: GroupPath) -> Response:
    principal = principal_of(request)
    if not principal.may_propose_in(group):
        raise ApiError(FORBIDDEN, f"{principal.describe()} may not plan epochs of group {group!r}")
    req = await read_json(request, EpochPlanRequest)
    payload = complete_plan(msgspec.to_builtins(req))
    host = host_of(request)
    require_group(host, group)
    outcome = await host.submit(
        NewRecord(kind="epoch_plan", group=group, payload=payload),
        key=("epoch_plan", group, req.epoch),
    )
    if isinstance(outcome, Refusal):
        raise ApiError(outcome.code, outcome.detail)
    limit = request.app.state.limits.ranks_page
    return json_response(
        _epoch_body(host, group, None, limit), 201 if isinstance(outcome, Appended) else 200
    )


@router.get(
    "/groups/{group}/epochs",
    summary="The open (or last) epoch: its plan, and one page of the ranks' parts and progress",
    responses=answers({200: "EpochBody"}, 404, 422),
    tags=["epochs"],
)
async def get_epoch(
    request: Request,
    group: GroupPath,
    ranks_after: int | None = Query(
        None, ge=0, le=QUERY.max_rank, description="the last rank of the previous page"
    ),
    ranks_limit: int | None = Query(
        None, ge=1, le=MAX_RANKS_PAGE, description="ranks in the page (default --ranks-page)"
    ),
) -> Response:
    host = host_of(request)
    require_group(host, group)
    limit = ranks_limit or request.app.state.limits.ranks_page
    return json_response(_epoch_body(host, group, ranks_after, limit))


def _epoch_body(host: Host, group: str, after: int | None, limit: int) -> dict:
    status = host.reads.facet("epochs").status(group)
    if status is None:
        raise ApiError(UNKNOWN_EPOCH, f"group {group!r} has no epoch plan")
    ranks = [r for r in status["ranks"] if after is None or r["rank"] > after]
    status["ranks"] = ranks[:limit]
    status["next_ranks_after"] = ranks[limit - 1]["rank"] if len(ranks) > limit else None
    return to_doc(status)


#: Moves listed per decision; the rest are counted (a view change at scale moves thousands).
MOVES_SHOWN = 32


@router.get(
    "/ui/api/groups/{group}/epochs/changes",
    summary="The latest decisions about a group's epochs (plans and moves), newest first",
    responses=answers({}, 401, 403, 404, 422),
    tags=["console"],
)
async def epoch_changes(
    request: Request, group: str, limit: int = Query(20, ge=1, le=200)
) -> Response:
    """The group's ``assignment`` rows (docs/data.md): each epoch's first split and every
    committed move, with its cause and the fold's reason; the moves of one decision are
    grouped per pair of ranks."""
    require_operator(request, "reading the console")
    host = host_of(request)
    require_group(host, group)
    latest = host.reads.facet("epochs").changes(group)
    rows = await host.log.read_projections(
        "assignment", group, after_seq=max(0, latest - limit), limit=limit
    )
    out = []
    for row in reversed(rows):
        doc = row.doc
        pairs: dict[tuple[int, int], list[int]] = {}
        for giver, taker, start, length in doc.get("moves", []):
            pair = pairs.setdefault((giver, taker), [0, start])
            pair[0] += length
        moves = [
            {"from_rank": a, "to_rank": b, "positions": n, "first": first}
            for (a, b), (n, first) in pairs.items()
        ]
        out.append(
            {
                "change": doc["change"],
                "type": doc["type"],
                "epoch": doc["epoch"],
                "assignment": doc["assignment"],
                "version": doc["version"],
                "offset": doc["offset"],
                "cause": doc.get("cause", "planned"),
                "detail": doc.get("detail", ""),
                "ranks": len(doc.get("ranges", [])),
                "moves": moves[:MOVES_SHOWN],
                "moves_count": len(moves),
            }
        )
    return json_response({"group": group, "latest": latest, "changes": out})
