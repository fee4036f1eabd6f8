"""``POST /agents/events`` served ahead of the framework.

Heartbeats are nearly all of the traffic (tens of thousands of events a second), and the
framework's per-request machinery (its middleware stack, routing, dependency solving, exception
wrapping) costs more than the coordinator's own work for a batch. :class:`Service` is the ASGI
application the server runs: it answers that one path directly with the same handler as the
documented route (``api.routes.agents.post_events``), so the behaviour and the OpenAPI document
stay those of the route, and hands everything else to the FastAPI app. Errors on the fast path
are answered here in the same ``{"error", "detail"}`` shape.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from api.errors import ApiError, BodyTooLarge, error_response
from api.limits import BodySizeLimit
from api.routes.agents import post_events
from coordinator.auth import AuthError
from coordinator.host import HostUnavailable

PATH = "/agents/events"


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
        if scope["type"] != "http" or scope["path"] != PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        scope["app"] = self.app
        try:
            response = await post_events(Request(scope, receive))
        except ApiError as exc:
            response = error_response(exc.status, exc.code, exc.detail, **exc.extra)
        except AuthError as exc:
            response = error_response(exc.status, exc.code, exc.detail)
        except HostUnavailable as exc:
            response = error_response(503, exc.code, exc.detail, **_leader(exc))
        except BodyTooLarge as exc:
            response = error_response(413, "body_too_large", str(exc))
        await response(scope, receive, send)


def _leader(exc: HostUnavailable) -> dict[str, str | None]:
    return {"leader": getattr(exc, "leader", None)} if exc.code == "not_leader" else {}
