"""The agents' two hot paths served ahead of the framework.

``POST /agents/events`` carries the heartbeats, nearly all of the traffic (tens of thousands of
events a second); ``GET /agents/updates`` is the long poll every agent host keeps open, and a
view change answers all of them at once (twice: prepare, then commit). The framework's
per-request machinery (its middleware stack, routing, dependency solving, exception wrapping)
costs more than the coordinator's own work for either. :class:`Service` is the ASGI application
the server runs: it answers those paths directly with the same handlers as the documented
routes (``api.routes.agents``), so the behaviour and the OpenAPI document stay those of the
routes, and hands everything else to the FastAPI app. A long poll whose query is anything but
plainly well formed goes to the framework too, which words the ``422``. Errors on the fast path
are answered here in the same ``{"error", "detail"}`` shape.
"""

from __future__ import annotations

import re
from functools import partial
from typing import Any
from urllib.parse import parse_qsl

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from api.errors import ApiError, BodyTooLarge, error_response
from api.limits import BodySizeLimit
from api.routes.agents import MAX_POLL_S, answer_updates, post_events
from coordinator.auth import AuthError
from coordinator.host import HostUnavailable

PATH = "/agents/events"
UPDATES = "/agents/updates"


class Service:
    """The coordinator's ASGI application: the body size limit, the events fast path, FastAPI."""

    def __init__(self, app: FastAPI, *, max_body_bytes: int) -> None:
        self.app = app
        self._limited = BodySizeLimit(self._dispatch, max_body_bytes)

    @property
    def state(self) -> Any:
        return self.app.state

    def openapi(self) -> dict[str, Any]:
        return self.app.openapi()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._limited(scope, receive, send)

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler: Any = None
        if scope["type"] == "http":
            if scope["path"] == PATH and scope["method"] == "POST":
                handler = post_events
            elif scope["path"] == UPDATES and scope["method"] == "GET":
                query = updates_query(scope.get("query_string", b""))
                if query is not None:
                    handler = partial(_updates, query=query)
        if handler is None:
            await self.app(scope, receive, send)
            return
        scope["app"] = self.app
        try:
            response = await handler(Request(scope, receive))
        except ApiError as exc:
            response = error_response(exc.status, exc.code, exc.detail, **exc.extra)
        except AuthError as exc:
            response = error_response(exc.status, exc.code, exc.detail)
        except HostUnavailable as exc:
            response = error_response(503, exc.code, exc.detail, **_leader(exc))
        except BodyTooLarge as exc:
            response = error_response(413, "body_too_large", str(exc))
        await response(scope, receive, send)


async def _updates(request: Request, *, query: tuple[str, int, int, float]) -> Response:
    return await answer_updates(request, *query)


_DIGITS = re.compile(r"[0-9]{1,19}")
_SECONDS = re.compile(r"[0-9]{1,6}(\.[0-9]{1,9})?")


def updates_query(raw: bytes) -> tuple[str, int, int, float] | None:
    """``(group, rank, after, timeout)`` when the query is plainly within the route's bounds
    (``api.routes.agents.get_updates``); None for anything else, which the framework answers."""
    try:
        pairs = parse_qsl(raw.decode("ascii"), keep_blank_values=True, strict_parsing=True)
    except (UnicodeDecodeError, ValueError):
        return None
    fields = dict(pairs)
    if len(fields) != len(pairs) or not fields.keys() <= _UPDATE_FIELDS or "group" not in fields:
        return None
    group = fields["group"]
    rank = fields.get("rank", "")
    after = fields.get("after", "0")
    timeout = fields.get("timeout", "25")
    if not (
        0 < len(group) <= 64
        and _DIGITS.fullmatch(rank)
        and _DIGITS.fullmatch(after)
        and _SECONDS.fullmatch(timeout)
    ):
        return None
    query = (group, int(rank), int(after), float(timeout))
    if query[1] > 65_535 or query[2] > 2**62 or query[3] > MAX_POLL_S:
        return None
    return query


_UPDATE_FIELDS = frozenset({"group", "rank", "after", "timeout"})


def _leader(exc: HostUnavailable) -> dict[str, str | None]:
    return {"leader": getattr(exc, "leader", None)} if exc.code == "not_leader" else {}
