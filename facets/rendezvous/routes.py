"""torchrun's rendezvous over HTTP (docs/protocol.md, "torchrun's rendezvous"): what
``agent/rendezvous.py``, the handler torchrun runs in each node, calls.

Every route needs the operator token when auth is on: the node has no rank to hold an agent
token for, and a job's state names the address of each round's store (an open ``TCPStore``).
The writes go through the fold like every input (a refusal is the fold's code and words); the
long poll ``GET /rendezvous/{job}?after=VERSION`` answers once the job moved past ``VERSION``
(woken by the job's notices, ``host.py``), or at its timeout, and only a leader answers it,
so a node moves to the leader after a failover.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, TypeVar

import msgspec
from fastapi import APIRouter, Path, Query, Request
from starlette.responses import Response

from ...api.codec import json_response, read_json
from ...api.deps import host_of, require_operator
from ...api.errors import ApiError
from ...api.openapi import answers, body
from ...api.routes.story import step_page, told
from ...coordinator.host.loop import Appended, Host, Refusal
from ...eventlog import NewRecord
from ...wire.codes import UNKNOWN_RENDEZVOUS
from ...wire.protocol import QUERY
from .host import waiters_of
from .inputs import (
    JOB_PATTERN,
    CloseInput,
    JoinInput,
    KeepaliveInput,
    LeaveInput,
    RendezvousInput,
)
from .models import (
    JoinRequest,
    LeaveRequest,
    NodeRequest,
    OffsetBody,
    RendezvousBody,
    RendezvousList,
    RendezvousStoryBody,
    RoundsBody,
)
from .reads import RendezvousReads
from .story import rendezvous_story_of

router = APIRouter(tags=["torchrun"])
#: the bodies it adds to the OpenAPI document's components
SCHEMA_TYPES = (
    JoinRequest,
    NodeRequest,
    LeaveRequest,
    RendezvousBody,
    RendezvousList,
    OffsetBody,
    RoundsBody,
    RendezvousStoryBody,
)

JobPath = Annotated[str, Path(pattern=JOB_PATTERN, description="torchrun's --rdzv-id")]
#: How often a long poll checks that its coordinator still leads and serves.
LEAD_CHECK_S = 0.5

B = TypeVar("B", bound=msgspec.Struct)


def _facet(host: Host) -> RendezvousReads:
    """The facet's read model of the last cycle (``reads.py``)."""
    return host.reads.facet("rendezvous")  # type: ignore[no-any-return]


def _status(host: Host, job: str) -> dict[str, Any]:
    found = _facet(host).status(job)
    if found is None:
        raise ApiError(UNKNOWN_RENDEZVOUS, f"no rendezvous {job!r}: no node ever joined it")
    return found


async def _submit(host: Host, inp: RendezvousInput) -> int:
    """Submit a typed input (``inputs.py``): the record's payload is the Struct's fields."""
    payload = msgspec.to_builtins(inp)
    outcome = await host.submit(NewRecord(kind=inp.kind, group=None, payload=payload))
    if isinstance(outcome, Refusal):
        raise ApiError(outcome.code, outcome.detail)
    return outcome.offset if isinstance(outcome, Appended) else outcome.id


async def _read(request: Request, doing: str, body: type[B]) -> B:
    """A node's request body, once the operator's token allows ``doing``."""
    require_operator(request, doing)
    return await read_json(request, body)


async def _moved(request: Request, job: str, inp: RendezvousInput) -> Response:
    """Submit a node's input of ``job`` and answer the job as it stands after it, with the
    input's offset."""
    host = host_of(request)
    offset = await _submit(host, inp)
    return json_response({**_status(host, job), "offset": offset})


@router.post(
    "/rendezvous/{job}/join",
    summary="A torchrun node waits for the next round of its job (the answer is the job now; "
    "the round forms when the fold's rule allows it)",
    openapi_extra=body("JoinRequest"),
    responses=answers({200: "RendezvousBody"}, 401, 403, 409, 413, 422, 429),
)
async def join(request: Request, job: JobPath) -> Response:
    req = await _read(request, "joining a rendezvous", JoinRequest)
    return await _moved(request, job, JoinInput(job=job, **msgspec.structs.asdict(req)))


@router.post(
    "/rendezvous/{job}/keepalive",
    summary="A torchrun node is alive (a node silent for the job's keep-alive timeout is lost)",
    openapi_extra=body("NodeRequest"),
    responses=answers({200: "OffsetBody"}, 401, 403, 404, 409, 413, 422),
)
async def keepalive(request: Request, job: JobPath) -> Response:
    req = await _read(request, "keeping a rendezvous node alive", NodeRequest)
    offset = await _submit(host_of(request), KeepaliveInput(job=job, node=req.node))
    return json_response({"offset": offset})


@router.post(
    "/rendezvous/{job}/leave",
    summary="A torchrun node leaves its job's rendezvous (the others go on)",
    openapi_extra=body("LeaveRequest"),
    responses=answers({200: "RendezvousBody"}, 401, 403, 404, 409, 413, 422),
)
async def leave(request: Request, job: JobPath) -> Response:
    req = await _read(request, "leaving a rendezvous", LeaveRequest)
    return await _moved(request, job, LeaveInput(job=job, node=req.node, reason=req.reason))


@router.post(
    "/rendezvous/{job}/close",
    summary="Close a job's rendezvous for every node (torchrun's shutdown: the run ended); "
    "closing a closed one answers its closing",
    openapi_extra=body("LeaveRequest"),
    responses=answers({200: "RendezvousBody"}, 401, 403, 404, 409, 413, 422),
)
async def close(request: Request, job: JobPath) -> Response:
    req = await _read(request, "closing a rendezvous", LeaveRequest)
    return await _moved(request, job, CloseInput(job=job, node=req.node, reason=req.reason))


@router.get(
    "/rendezvous",
    summary="Every torchrun job's rendezvous: its round, its nodes and whether it is closed",
    responses=answers({200: "RendezvousList"}, 401, 403),
)
async def list_rendezvous(request: Request) -> Response:
    require_operator(request, "reading the rendezvous")
    return json_response({"rendezvous": _facet(host_of(request)).lines()})


@router.get(
    "/rendezvous/{job}",
    summary="A job's rendezvous; with after=VERSION a long poll that answers once the job moved "
    "past VERSION, or at the timeout",
    responses=answers({200: "RendezvousBody"}, 401, 403, 404, 422),
)
async def get_rendezvous(
    request: Request,
    job: JobPath,
    after: int | None = Query(
        None, ge=0, le=QUERY.max_offset, description="wait until the job's version is past this"
    ),
    timeout: float = Query(
        QUERY.poll_timeout_s, ge=0, le=QUERY.max_poll_s, description="seconds to wait, at most"
    ),
) -> Response:
    require_operator(request, "reading a rendezvous")
    host = host_of(request)
    status = _status(host, job)
    if after is None or status["version"] > after or timeout <= 0:
        return json_response(status)
    host.role.check_polls("not leading")
    # nothing is awaited between reading the version above and taking the waiter, so no move
    # of the job falls between the two (``host.JobWaiters.waiter``)
    waiters = waiters_of(host)
    moved = waiters.waiter(job)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        while not moved.done() and host.available() is None and not host.draining:
            left = deadline - loop.time()
            if left <= 0:
                break
            # a coordinator that stops leading or shuts down answers within LEAD_CHECK_S
            await asyncio.wait({moved}, timeout=min(left, LEAD_CHECK_S))
            host.role.check_polls("stepped down")
    finally:
        waiters.forget(job, moved)
    return json_response(_status(host, job))


@router.get(
    "/rendezvous/{job}/rounds",
    summary="A job's formed rounds in order: each with its nodes in rank order, its store and "
    "the fold's reason",
    responses=answers({200: "RoundsBody"}, 401, 403, 404, 422),
)
async def rounds(
    request: Request,
    job: JobPath,
    after_round: int = Query(0, ge=0, le=QUERY.max_offset),
    limit: int = Query(100, ge=1, le=1000),
) -> Response:
    require_operator(request, "reading a rendezvous")
    host = host_of(request)
    _status(host, job)
    rows = await host.log.read_projections(
        "rdzv_round", job, after_seq=after_round, limit=limit + 1
    )
    more = len(rows) > limit
    rows = rows[:limit]
    return json_response(
        {
            "job": job,
            "rounds": [row.doc for row in rows],
            "next_after_round": rows[-1].seq if more else None,
        }
    )


@router.get(
    "/rendezvous/{job}/story",
    summary="What happened to a job's rendezvous: every join, round, leave, refusal and the "
    "closing, with offset, time and the fold's reason",
    responses=answers({200: "RendezvousStoryBody"}, 401, 403, 404, 422),
)
async def story(
    request: Request,
    job: JobPath,
    until: int | None = Query(
        None, ge=1, le=QUERY.max_offset, description="fold only up to this offset"
    ),
) -> Response:
    require_operator(request, "reading a rendezvous's story")
    host = host_of(request)
    _status(host, job)
    return await told(
        host,
        until,
        lambda stop: rendezvous_story_of(host.log, job, until=stop, fold_page=step_page),
    )
