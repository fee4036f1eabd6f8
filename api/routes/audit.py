"""Audit and health endpoints: the raw log, its event stream, ``/healthz`` and ``/metrics``."""

from __future__ import annotations

import re
from typing import Literal

from fastapi import APIRouter, Header, Query, Request
from starlette.responses import Response, StreamingResponse

from ...coordinator.fold.registry import all_kinds
from ...coordinator.host.loop import HostUnavailable
from ...eventlog import LogError, Record
from ...wire.codes import INVALID_REQUEST, NOT_LEADER
from ...wire.protocol import QUERY
from .. import metrics, sse
from ..codec import encode_json, json_response, raw_json_response
from ..deps import host_of, require_operator
from ..errors import ApiError
from ..openapi import answers
from ..paging import read_page

router = APIRouter(tags=["audit"])

#: An offset as text: ASCII digits only (``str.isdigit`` also accepts ``"\u00b2"``).
_OFFSET = re.compile(r"[0-9]{1,19}")


#: The record kinds of the log: membership's and the facets' (``coordinator/fold/registry.py``).
KINDS = all_kinds()

#: One server-sent event as an SSE reader parses it (``api.sse.format_event``).
_SSE_EVENT = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "pattern": "^[0-9]+$"},
        "event": {"type": "string", "enum": sorted(KINDS)},
        "data": {"type": "string", "description": "the record, as in GET /events"},
    },
}

#: The record kinds a reader may filter on (declared in the OpenAPI document).
Kind = Literal[tuple(sorted(KINDS))]  # type: ignore[valid-type]


def _kinds(kind: str | None) -> list[str] | None:
    if kind is None:
        return None
    if kind not in KINDS:
        raise ApiError(INVALID_REQUEST, f"kind {kind!r} is not one of {sorted(KINDS)}")
    return [kind]


@router.get(
    "/events",
    summary="The raw log, for audits (the operator token when auth is on)",
    responses=answers({200: "EventsPage"}, 401, 403, 422),
)
async def events(
    request: Request,
    after: int = Query(0, ge=0, le=QUERY.max_offset),
    limit: int = Query(100, ge=1, le=1000),
    group: str | None = Query(None, max_length=QUERY.group_chars),
    kind: Kind | None = Query(None),
) -> Response:
    require_operator(request, "reading the log")
    host = host_of(request)
    kinds = _kinds(kind)

    async def fetch(start: int, n: int) -> list[Record]:
        return await host.log.read(start, n, group=group, kinds=kinds)

    page = await read_page(
        fetch,
        lambda r: r.offset,
        _encode_record,
        after=after,
        limit=limit,
        budget=request.app.state.limits.max_page_bytes,
    )
    # a page with more after it covers the offsets up to its last record; the last page, the
    # rest of the log: the removed ranges among them are named, so no hole is silent
    removed = await host.log.removed_ranges(after, page.last if page.more else None)
    ranges = encode_json(
        [{"first": r.first, "last": r.last, "removed": r.removed} for r in removed]
    )
    return raw_json_response(
        b'{"events":[%s],"next_after":%d,"removed":%s}' % (b",".join(page.items), page.last, ranges)
    )


def _encode_record(r: Record) -> bytes:
    return encode_json(
        {
            "offset": r.offset,
            "ts": r.ts,
            "term": r.term,
            "kind": r.kind,
            "group": r.group,
            "rank": r.rank,
            "payload": r.payload,
        }
    )


@router.get(
    "/events/stream",
    summary="Server-sent events, one per record; resume with Last-Event-ID or ?after= "
    "(the operator token when auth is on)",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "One server-sent event per record (and comment lines)",
            "content": {"text/event-stream": {"schema": _SSE_EVENT}},
        },
        **answers({}, 401, 403, 422),
    },
)
async def event_stream(
    request: Request,
    after: int = Query(0, ge=0, le=QUERY.max_offset),
    group: str | None = Query(None, max_length=QUERY.group_chars),
    kind: Kind | None = Query(None),
    last_event_id: str | None = Header(None, pattern=r"^[0-9]{1,19}$"),
) -> Response:
    require_operator(request, "reading the log")
    if last_event_id is not None:
        if not _OFFSET.fullmatch(last_event_id.strip()):
            raise ApiError(INVALID_REQUEST, f"Last-Event-ID {last_event_id!r} is not an offset")
        after = int(last_event_id)
    host = host_of(request)
    return StreamingResponse(
        sse.stream(host.log, after, group=group, kinds=_kinds(kind)),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.get("/healthz", summary="Liveness, role and offsets", responses=answers({200: "Health"}))
async def healthz(request: Request) -> Response:
    host = host_of(request)
    down = host.available()
    role = host.role.name  # a Replica (coordinator/host/replica.py) may follow
    if role == "standby" and isinstance(down, HostUnavailable) and down.code == NOT_LEADER:
        down = None  # a standby that follows the log is healthy; writes go to the leader
    try:
        head = await host.log.head() if not host.log.closed else host.applied_offset
    except LogError as exc:
        head, down = host.applied_offset, down or exc
    body = {
        "status": "ok" if down is None else "unavailable",
        "role": role,
        "term": host.log.term,
        "head": head,
        "fold_offset": host.reads.offset,
    }
    if role == "standby":
        body["leader"] = host.role.leader
    if down is not None:
        body["detail"] = str(down)
    return json_response(body, 200 if down is None else 503)


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
)
async def prometheus(request: Request) -> Response:
    exposition: metrics.Exposition = request.app.state.metrics
    return Response(await exposition.render(), media_type=metrics.CONTENT_TYPE)
