"""Every error the HTTP surface answers has one shape: ``{"error": code, "detail": message}``.

Status codes (docs/protocol.md): 400/422 malformed, 401 missing or malformed token, 403 wrong
token, 404 unknown, 405 wrong method (with ``Allow``), 409 fenced or conflicting, 413 too
large, 415 not JSON, 429 over a server limit, 503 not the leader or shutting down. Bad input
never reaches a 500: request bodies are decoded and validated before anything else looks at
them, and the handlers below turn framework errors into the same shape.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import msgspec
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from foldplane.coordinator.auth import AuthError
from foldplane.coordinator.host.loop import HostUnavailable

log = logging.getLogger("foldplane.api")

#: The HTTP status for each refusal code the host or the fold gives.
REFUSAL_STATUS: dict[str, int] = {
    "unknown_group": 404,
    "unknown_proposal": 404,
    "rank_out_of_range": 404,
    "unknown_epoch": 404,
    "unknown_refit": 404,
    "unknown_transfer": 404,
    "invalid_event": 422,
    "invalid_request": 422,
    "forbidden": 403,
    "too_many_groups": 429,
    "too_many_ranks": 429,
}

_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    413: "body_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "too_many_requests",
}


class ApiError(Exception):
    """An error answer; raise it from a handler."""

    def __init__(self, status: int, code: str, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.extra = extra


class BodyTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"the request body is over the limit of {limit} bytes (--max-body-bytes)")
        self.limit = limit


def refusal_error(code: str, detail: str) -> ApiError:
    return ApiError(REFUSAL_STATUS.get(code, 409), code, detail)


def error_response(
    status: int, code: str, detail: str, *, headers: dict[str, str] | None = None, **extra: Any
) -> Response:
    body = {"error": code, "detail": detail, **extra}
    if status == 401:
        headers = {**(headers or {}), "WWW-Authenticate": "Bearer"}
    elif status == 426:  # the host channel's WebSocket version (RFC 6455)
        headers = {**(headers or {}), "Sec-WebSocket-Version": "13"}
    return Response(msgspec.json.encode(body), status, headers, media_type="application/json")


def _loc(loc: tuple[Any, ...] | list[Any]) -> str:
    return ".".join(str(p) for p in loc)


def install(app: FastAPI) -> None:
    """Register the handlers that give every error the one shape."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> Response:
        return error_response(exc.status, exc.code, exc.detail, **exc.extra)

    @app.exception_handler(AuthError)
    async def _auth_error(request: Request, exc: AuthError) -> Response:
        return error_response(exc.status, exc.code, exc.detail)

    @app.exception_handler(HostUnavailable)
    async def _unavailable(request: Request, exc: HostUnavailable) -> Response:
        if exc.code == "not_leader":  # docs/protocol.md, "Failover": name the leader
            return error_response(503, exc.code, exc.detail, leader=getattr(exc, "leader", None))
        return error_response(503, exc.code, exc.detail)

    @app.exception_handler(BodyTooLarge)
    async def _too_large(request: Request, exc: BodyTooLarge) -> Response:
        return error_response(413, "body_too_large", str(exc))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        problems = [f"{_loc(e.get('loc', ()))}: {e.get('msg', 'invalid')}" for e in exc.errors()]
        return error_response(422, "invalid_request", "; ".join(problems) or "invalid request")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        code = _HTTP_CODES.get(exc.status_code, "http_error")
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404 and detail == "Not Found":
            detail = f"no endpoint {request.method} {request.url.path}"
        headers = dict(exc.headers or {})
        if exc.status_code == 405 and "Allow" in headers:
            # Starlette names only the first route of the path; a path served by several
            # routes (GET and POST /refits) allows what all of them allow
            headers["Allow"] = _allowed(request, headers["Allow"])
            detail = f"{request.method} is not allowed on {request.url.path}; allowed: {headers['Allow']}"
        return error_response(exc.status_code, code, detail, headers=headers)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> Response:
        log.exception("internal error on %s %s", request.method, request.url.path)
        return error_response(500, "internal", f"{type(exc).__name__}: {exc}")


def _allowed(request: Request, first: str) -> str:
    """Every method the app documents on the request's path (its OpenAPI document lists each
    route's; Starlette's ``Allow`` names only the first route that matched the path)."""
    methods = {m.strip() for m in first.split(",") if m.strip()}
    path = request.url.path
    for template, operations in request.app.openapi().get("paths", {}).items():
        if re.fullmatch(re.sub(r"\\{[^/]+?\\}", "[^/]+", re.escape(template)), path):
            methods.update(m.upper() for m in operations if m.upper() in _METHODS)
    return ", ".join(sorted(methods))


_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
