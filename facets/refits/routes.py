"""Weight refits between two groups: declare one, read it, start a transfer, restart an epoch
(docs/refit.md, docs/protocol.md).

Workers take part through the agent events (``refit_join``, ``refit_bootstrap``, ``transfer``,
``transfer_status``: ``POST /agents/events``, each authenticated for its own rank); the
routes here are the operator's. No answer here carries a bootstrap: only the admitted
members receive it, in their own update journals.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from fastapi import APIRouter, Path, Query, Request
from starlette.responses import Response

from ...api.codec import json_response, read_json
from ...api.deps import host_of, principal_of, require_operator
from ...api.errors import ApiError
from ...api.openapi import answers, body
from ...api.routes.story import step_page, told
from ...coordinator.fold.projections import to_doc
from ...coordinator.host.loop import Appended, Host, Refusal
from ...eventlog import NewRecord
from ...wire.codes import FORBIDDEN, UNKNOWN_REFIT
from ...wire.protocol import QUERY
from .inputs import complete_spec
from .models import (
    RefitBody,
    RefitList,
    RefitRequest,
    RefitRestartRequest,
    RefitStoryBody,
    TransferRequest,
)
from .story import refit_story_of

# each route names its tag: the story is the console's
router = APIRouter()
#: the bodies it adds to the OpenAPI document's components
SCHEMA_TYPES = (
    RefitRequest,
    TransferRequest,
    RefitRestartRequest,
    RefitBody,
    RefitList,
    RefitStoryBody,
)

RefitPath = Annotated[str, Path(max_length=64)]


def _operator(request: Request, what: str) -> None:
    principal = principal_of(request)
    if not principal.is_operator:
        raise ApiError(FORBIDDEN, f"{principal.describe()} may not {what}")


@router.post(
    "/refits",
    summary="Declare a weight refit from a publisher group to a subscriber group (idempotent)",
    openapi_extra=body("RefitRequest"),
    responses=answers({201: "RefitBody", 200: "RefitBody"}, 401, 403, 404, 409, 413, 422),
    tags=["refits"],
)
async def create_refit(request: Request) -> Response:
    _operator(request, "create refits")
    req = await read_json(request, RefitRequest)
    payload = complete_spec(msgspec.to_builtins(req))
    host = host_of(request)
    outcome = await host.submit(
        NewRecord(kind="refit_created", group=None, payload=payload),
        key=("refit_created", req.refit),
    )
    if isinstance(outcome, Refusal):
        raise ApiError(outcome.code, outcome.detail)
    return json_response(
        _refit_body(host, req.refit), 201 if isinstance(outcome, Appended) else 200
    )


@router.get(
    "/refits",
    summary="Every refit's name and where it stands",
    responses=answers({200: "RefitList"}),
    tags=["refits"],
)
async def list_refits(request: Request) -> Response:
    refits = host_of(request).reads.facet("refits")
    items = []
    for name in refits.names():
        status = refits.status(name)
        assert status is not None
        items.append({k: status[k] for k in ("refit", "epoch", "status", "cause")})
    return json_response({"refits": items})


@router.get(
    "/refits/{refit}",
    summary="A refit: its definition, its epoch (who joined, who is missing) and its transfers",
    responses=answers({200: "RefitBody"}, 404, 422),
    tags=["refits"],
)
async def get_refit(request: Request, refit: RefitPath) -> Response:
    return json_response(_refit_body(host_of(request), refit))


@router.post(
    "/refits/{refit}/transfers",
    summary="Start a transfer in the admitted epoch (idempotent by key; a failed one retries)",
    openapi_extra=body("TransferRequest"),
    responses=answers({201: "RefitBody", 200: "RefitBody"}, 401, 403, 404, 409, 413, 422),
    tags=["refits"],
)
async def start_transfer(request: Request, refit: RefitPath) -> Response:
    _operator(request, "start transfers")
    req = await read_json(request, TransferRequest)
    host = host_of(request)
    outcome = await host.submit(
        NewRecord(kind="transfer", group=None, payload={"refit": refit, "key": req.key}),
        key=("transfer", refit, req.key),
    )
    if isinstance(outcome, Refusal):
        raise ApiError(outcome.code, outcome.detail)
    return json_response(_refit_body(host, refit), 201 if isinstance(outcome, Appended) else 200)


@router.post(
    "/refits/{refit}/restart",
    summary="Open a new epoch (after a readiness timeout): every worker joins again",
    openapi_extra=body("RefitRestartRequest"),
    responses=answers({201: "RefitBody"}, 401, 403, 404, 409, 413, 422),
    tags=["refits"],
)
async def restart_refit(request: Request, refit: RefitPath) -> Response:
    _operator(request, "restart refits")
    req = await read_json(request, RefitRestartRequest)
    host = host_of(request)
    payload = {"refit": refit, **({"reason": req.reason} if req.reason else {})}
    outcome = await host.submit(NewRecord(kind="refit_restart", group=None, payload=payload))
    if isinstance(outcome, Refusal):
        raise ApiError(outcome.code, outcome.detail)
    return json_response(_refit_body(host, refit), 201)


def _refit_body(host: Host, name: str) -> dict:
    status = host.reads.facet("refits").status(name)
    if status is None:
        raise ApiError(UNKNOWN_REFIT, f"no refit named {name!r}")
    return to_doc(status)


@router.get(
    "/refits/{refit}/story",
    summary="What happened to a refit: its creation, each epoch (why it began, its admission), "
    "each join and each transfer attempt and report, with offset, time and the fold's reason",
    responses=answers({200: "RefitStoryBody"}, 401, 403, 404, 422),
    tags=["console"],
)
async def refit_story(
    request: Request,
    refit: str = Path(..., max_length=64),
    until: int | None = Query(
        None, ge=1, le=QUERY.max_offset, description="fold only up to this offset"
    ),
) -> Response:
    require_operator(request, "reading a refit's story")
    host = host_of(request)
    if not host.reads.facet("refits").exists(refit):
        raise ApiError(UNKNOWN_REFIT, f"no refit named {refit!r}")
    return await told(
        host, until, lambda stop: refit_story_of(host.log, refit, until=stop, fold_page=step_page)
    )
