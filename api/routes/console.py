"""The operator's console: ``GET /ui`` (one self-contained page) and the data it reads.

The page (``api/console.html``, package data: HTML, CSS and JS inline, nothing fetched from
elsewhere, with each facet's panel put in its place) reads ``/ui/api/*`` for the fold's
picture of each group and follows ``/events/stream`` to know when to read it again. The page itself holds nothing of a group, so
it is served to anyone; everything it reads needs the operator token when auth is on, sent as
an ``Authorization`` header (never in a URL). See docs/console.md.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from ...coordinator.fold.overview import ranks_brief
from ...coordinator.fold.registry import FacetPlugin, console_fragment, plugins
from ...coordinator.host.loop import HostUnavailable
from ...coordinator.host.views import read_views
from ...eventlog import LogError
from ...wire.codes import NOT_LEADER
from ..codec import json_response
from ..deps import host_of, require_group, require_operator
from ..openapi import answers

router = APIRouter(tags=["console"])

#: the page as assembled for the facets it was assembled for
_page: tuple[tuple[FacetPlugin, ...], bytes] | None = None

#: where the facets' panels go in the page, in the order of the registry
PANELS = b"<!-- facet panels -->"


def page(facets: tuple[FacetPlugin, ...] | None = None) -> bytes:
    """The console page with the panel (``FacetPlugin.console``) of each of ``facets`` (a
    host's; the command line's when None) in its place."""
    global _page
    facets = plugins() if facets is None else facets
    if _page is None or _page[0] != facets:
        core = resources.files("foldplane.api").joinpath("console.html").read_bytes()
        panels = [f for f in map(console_fragment, facets) if f is not None]
        _page = facets, core.replace(PANELS, b"\n".join(panels))
    return _page[1]


@router.get("/ui", summary="The operator's console (an HTML page)", response_class=Response)
async def console_page(request: Request) -> Response:
    return Response(
        page(host_of(request).facets.plugins),
        media_type="text/html; charset=utf-8",
        headers={
            "Cache-Control": "no-cache",
            # everything the page needs is inline or on this origin
            "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; "
            "style-src 'unsafe-inline'; img-src data:; connect-src 'self'; frame-ancestors 'none'",
            "Referrer-Policy": "no-referrer",
        },
    )


async def _coordinator(request: Request) -> dict[str, Any]:
    """Term, role, leader and fold lag, as ``/healthz`` and ``/metrics`` report them."""
    host = host_of(request)
    down = host.available()
    role = host.role.name
    if role == "standby" and isinstance(down, HostUnavailable) and down.code == NOT_LEADER:
        down = None
    try:
        head = await host.log.head() if not host.log.closed else host.applied_offset
    except LogError as exc:
        head, down = host.applied_offset, down or exc
    fold = host.reads.offset
    return {
        "status": "ok" if down is None else "unavailable",
        "detail": None if down is None else str(down),
        "role": role,
        "term": host.log.term,
        "leader": host.role.leader if role == "standby" else "this coordinator",
        "head": head,
        "fold_offset": fold,
        "fold_lag": max(0, head - fold),
        "queue_depth": host.queue_depth,
    }


@router.get(
    "/ui/api/overview",
    summary="The console's overview: the coordinator and a line per group",
    responses=answers({}, 401, 403),
)
async def overview(request: Request) -> Response:
    require_operator(request, "reading the console")
    host = host_of(request)
    return json_response(
        {"coordinator": await _coordinator(request), "groups": host.reads.group_list()}
    )


@router.get(
    "/ui/api/groups/{group}",
    summary="The console's picture of a group: every rank's state and membership, the view, "
    "the change in flight, proposals and the failure budget",
    responses=answers({}, 401, 403, 404),
)
async def group_picture(request: Request, group: str) -> Response:
    require_operator(request, "reading the console")
    host = host_of(request)
    require_group(host, group)
    body = host.reads.group_overview(group)
    return json_response({**body, "coordinator": await _coordinator(request)})  # type: ignore[dict-item]


@router.get(
    "/ui/api/groups/{group}/timeline",
    summary="The latest committed views of a group, each with the ranks that left and joined",
    responses=answers({}, 401, 403, 404, 422),
)
async def timeline(request: Request, group: str, limit: int = Query(30, ge=1, le=200)) -> Response:
    require_operator(request, "reading the console")
    host = host_of(request)
    require_group(host, group)
    view = host.reads.current_view(group)
    latest = 0 if view is None else view.version
    first = max(1, latest - limit + 1)
    stored = await read_views(
        host.log, group, after_version=max(0, first - 2), limit=latest - first + 2
    )
    docs = [view.doc for view in stored if view.version <= latest]
    out = []
    previous: set[int] | None = set() if docs and docs[0]["version"] == 1 else None
    for doc in docs:
        active = set(doc["active_ranks"])
        if previous is not None:
            out.append(
                {
                    "version": doc["version"],
                    "offset": doc["offset"],
                    "ts": doc["ts"],
                    "cause": doc["cause"],
                    "active_ranks": len(active),
                    "left": ranks_brief(previous - active),
                    "joined": ranks_brief(active - previous),
                    "dropped": ranks_brief(doc["dropped_ranks"]),
                }
            )
        previous = active
    out.reverse()
    return json_response({"group": group, "latest": latest, "views": out})
