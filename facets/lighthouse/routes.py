"""The lighthouse's HTTP routes (docs/torchft.md): what it decides now, the quorums it decided,
a launcher's death report, and torchft's two calls as JSON, which a standby carries its
callers' calls to the leader with. torchft's managers speak gRPC (``service.py``).

Every route that writes needs the operator token; the reads are open like ``GET /groups``.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from fastapi import APIRouter, Path, Query, Request
from starlette.responses import Response

from ...api.codec import json_response, read_json
from ...api.deps import host_of, require_operator
from ...api.errors import ApiError
from ...api.openapi import answers, body
from ...wire.codes import LOG_UNAVAILABLE, QUORUM_TIMEOUT
from .host import (
    LighthouseRefused,
    LighthouseUnavailable,
    lighthouse_of,
)
from .messages import MAX_ID_BYTES, Quorum
from .models import (
    HeartbeatBody,
    HeartbeatCall,
    LastQuorumBody,
    LighthouseBody,
    LostBody,
    LostRequest,
    PendingRequestBody,
    QuorumCall,
    QuorumList,
)
from .reads import LighthouseReads
from .rows import ROWS_GROUP

router = APIRouter(tags=["lighthouse"])
#: the bodies it adds to the OpenAPI document's components
SCHEMA_TYPES = (
    QuorumCall,
    HeartbeatCall,
    LostRequest,
    LostBody,
    HeartbeatBody,
    LighthouseBody,
    QuorumList,
    Quorum,
)

ReplicaPath = Annotated[str, Path(min_length=1, max_length=MAX_ID_BYTES)]


@router.get(
    "/lighthouse",
    summary="The lighthouse: its settings, what its quorum rule says now and why",
    responses=answers({200: "LighthouseBody"}),
)
async def status(request: Request) -> Response:
    read: LighthouseReads = host_of(request).reads.facet("lighthouse")
    body_ = LighthouseBody(
        settings=read.settings,
        quorum_id=read.quorum_id,
        status=read.status,
        verdicts=list(read.verdicts),
        last=None
        if read.last is None
        else LastQuorumBody(
            quorum_id=read.last.quorum_id,
            replica_ids=list(read.last.replica_ids),
            offset=read.last.offset,
            ts=read.last.ts,
        ),
        requests=[
            PendingRequestBody(
                replica_id=r.replica_id, step=r.step, offset=r.offset, joined_ts=r.joined_ts
            )
            for r in read.requests
        ],
        heartbeats=dict(read.heartbeats),
        lost=dict(read.lost),
    )
    return json_response(msgspec.to_builtins(body_))


@router.get(
    "/lighthouse/quorums",
    summary="The quorums the lighthouse decided, each as first decided under its id",
    responses=answers({200: "QuorumList"}, 422),
)
async def quorums(
    request: Request,
    after: Annotated[int, Query(ge=0, le=2**62)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> Response:
    rows = await host_of(request).log.read_projections(
        "lighthouse_quorum", ROWS_GROUP, after_seq=after, limit=limit
    )
    return json_response(
        {
            "quorums": [row.doc for row in rows],
            "next_after": rows[-1].seq if len(rows) == limit else None,
        }
    )


@router.post(
    "/lighthouse/replicas/{replica}/lost",
    summary="A launcher saw a replica group die: out of every quorum now, no heartbeat timeout",
    openapi_extra=body("LostRequest"),
    responses=answers({201: "LostBody"}, 401, 403, 413, 422),
)
async def lost(request: Request, replica: ReplicaPath) -> Response:
    require_operator(request, "reporting a replica group lost")
    req = await read_json(request, LostRequest)
    try:
        offset = await lighthouse_of(host_of(request)).lost(replica, req.reason)
    except LighthouseRefused as exc:
        raise ApiError(exc.code, exc.detail) from None
    return json_response({"replica": replica, "offset": offset}, 201)


@router.post(
    "/lighthouse/quorum",
    summary="torchft's Quorum call as JSON: wait for the quorum that takes the member in",
    openapi_extra=body("QuorumCall"),
    responses=answers({200: "Quorum"}, 401, 403, 409, 413, 422, 504),
)
async def quorum(request: Request) -> Response:
    require_operator(request, "asking for a lighthouse quorum")
    req = await read_json(request, QuorumCall)
    lighthouse = lighthouse_of(host_of(request))
    try:
        answer = await lighthouse.quorum(req.member, req.timeout_s)
    except LighthouseRefused as exc:
        raise ApiError(exc.code, exc.detail) from None
    except LighthouseUnavailable as exc:
        raise ApiError(LOG_UNAVAILABLE, str(exc)) from None
    except TimeoutError as exc:
        raise ApiError(QUORUM_TIMEOUT, str(exc) or "no quorum before the deadline") from None
    return json_response(msgspec.to_builtins(answer))


@router.post(
    "/lighthouse/heartbeats",
    summary="torchft's Heartbeat call as JSON, for several replica groups at once",
    openapi_extra=body("HeartbeatCall"),
    responses=answers({200: "HeartbeatBody"}, 401, 403, 409, 413, 422),
)
async def heartbeats(request: Request) -> Response:
    require_operator(request, "heartbeating for replica groups")
    req = await read_json(request, HeartbeatCall)
    lighthouse = lighthouse_of(host_of(request))
    try:
        await lighthouse.heartbeat(req.replicas)
    except LighthouseRefused as exc:
        raise ApiError(exc.code, exc.detail) from None
    except LighthouseUnavailable as exc:
        raise ApiError(LOG_UNAVAILABLE, str(exc)) from None
    return json_response({"replicas": len(req.replicas)})
