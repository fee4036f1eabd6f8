"""The toy facet's routes: ``POST /groups/{group}/toy`` bumps the counter, ``GET`` reads it."""

from __future__ import annotations

from fastapi import APIRouter, Request
from msgspec import Struct
from starlette.responses import Response

from foldplane.api.codec import json_response, read_json
from foldplane.api.deps import host_of, principal_of, require_group
from foldplane.api.errors import ApiError
from foldplane.api.openapi import answers, body
from foldplane.coordinator.host.loop import Refusal
from foldplane.eventlog import NewRecord
from foldplane.wire.codes import FORBIDDEN
from foldplane.wire.protocol import request_body
from tests.facets.toy.inputs import BumpInput

BumpRequest = request_body(
    BumpInput,
    "BumpRequest",
    doc="``POST /groups/{group}/toy``: what to add (the fold checks the bound).",
)


class CounterBody(Struct, kw_only=True):
    group: str
    count: int


router = APIRouter(tags=["toy"])
SCHEMA_TYPES = (BumpRequest, CounterBody)


@router.post(
    "/groups/{group}/toy",
    summary="Bump the group's toy counter",
    openapi_extra=body("BumpRequest"),
    responses=answers({201: "CounterBody"}, 401, 403, 404, 422),
)
async def bump(request: Request, group: str) -> Response:
    principal = principal_of(request)
    if not principal.may_propose_in(group):
        raise ApiError(FORBIDDEN, f"{principal.describe()} may not bump group {group!r}")
    req = await read_json(request, BumpRequest)
    host = host_of(request)
    require_group(host, group)
    outcome = await host.submit(NewRecord(kind="toy_bump", group=group, payload={"by": req.by}))
    if isinstance(outcome, Refusal):
        raise ApiError(outcome.code, outcome.detail)
    count = host.reads.facet("toy").count(group)
    return json_response({"group": group, "count": count}, 201)


@router.get(
    "/groups/{group}/toy",
    summary="The group's toy counter",
    responses=answers({200: "CounterBody"}, 404),
)
async def read(request: Request, group: str) -> Response:
    host = host_of(request)
    require_group(host, group)
    return json_response({"group": group, "count": host.reads.facet("toy").count(group)})
