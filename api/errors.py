"""Every error the HTTP surface answers has one shape: ``{"error": code, "detail": message}``.

Every code has one status, declared with it in ``wire.codes`` (docs/protocol.md). Bad input
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

from ..coordinator.auth import AuthError
from ..coordinator.host.loop import HostUnavailable
from ..wire.codes import (
    BAD_REQUEST,
    BODY_TOO_LARGE,
    FORBIDDEN,
    HTTP_ERROR,
    INTERNAL,
    INVALID_REQUEST,
    METHOD_NOT_ALLOWED,
    NOT_ACCEPTABLE,
    NOT_FOUND,
    TOO_MANY_REQUESTS,
    UNAUTHORIZED,
    UNSUPPORTED_MEDIA_TYPE,
    error_body,
    status_of,
)

log = logging.getLogger("foldplane.api")

#: The code of each status the framework raises on its own (an unknown path, a wrong method).
_FRAMEWORK_CODES = {
    status_of(code): code
    for code in (
        BAD_REQUEST,
        UNAUTHORIZED,
        FORBIDDEN,
        NOT_FOUND,
        METHOD_NOT_ALLOWED,
        NOT_ACCEPTABLE,
        BODY_TOO_LARGE,
        UNSUPPORTED_MEDIA_TYPE,
        INVALID_REQUEST,
        TOO_MANY_REQUESTS,
    )
}


class ApiError(Exception):
    """An error answer with ``code``'s status (``wire.codes``); raise it from a handler."""

    def __init__(self, code: str, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.status = status_of(code)
        self.code = code
        self.detail = detail
        self.extra = extra


class BodyTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"the request body is over the limit of {limit} bytes (--max-body-bytes)")
        self.limit = limit


def answer_of(exc: Exception) -> tuple[int, dict[str, Any]] | None:
    """The status and error body of an error the API raises on purpose; None for anything
    else (a bug). Every surface (the routes, the fast paths, the host channel, a refused
    channel opening) answers through this one function."""
    if isinstance(exc, ApiError):
        return exc.status, error_body(exc.code, exc.detail, **exc.extra)
    if isinstance(exc, AuthError):
        return exc.status, error_body(exc.code, exc.detail)
    if isinstance(exc, HostUnavailable):
        return status_of(exc.code), error_body(exc.code, exc.detail, **exc.extra)
    if isinstance(exc, BodyTooLarge):
        return status_of(BODY_TOO_LARGE), error_body(BODY_TOO_LARGE, str(exc))
    return None


def error_response(
    status: int, code: str, detail: str, *, headers: dict[str, str] | None = None, **extra: Any
) -> Response:
    return body_response(status, error_body(code, detail, **extra), headers=headers)


def body_response(
    status: int, body: dict[str, Any], *, headers: dict[str, str] | None = None
) -> Response:
    """An error body as a response, with the headers its status calls for."""
    if status == 401:
        headers = {**(headers or {}), "WWW-Authenticate": "Bearer"}
    elif status == 426:  # the host channel's WebSocket version (RFC 6455)
        headers = {**(headers or {}), "Sec-WebSocket-Version": "13"}
    return Response(msgspec.json.encode(body), status, headers, media_type="application/json")


def _loc(loc: tuple[Any, ...] | list[Any]) -> str:
    return ".".join(str(p) for p in loc)


def install(app: FastAPI) -> None:
    """Register the handlers that give every error the one shape."""

    async def _raised(request: Request, exc: Exception) -> Response:
        status, body = answer_of(exc)  # type: ignore[misc]
        return body_response(status, body)

    for raised in (ApiError, AuthError, HostUnavailable, BodyTooLarge):
        app.add_exception_handler(raised, _raised)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        problems = [f"{_loc(e.get('loc', ()))}: {e.get('msg', 'invalid')}" for e in exc.errors()]
        return error_response(
            status_of(INVALID_REQUEST), INVALID_REQUEST, "; ".join(problems) or "invalid request"
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        code = _FRAMEWORK_CODES.get(exc.status_code, HTTP_ERROR)
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
        return error_response(status_of(INTERNAL), INTERNAL, f"{type(exc).__name__}: {exc}")


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
