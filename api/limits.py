"""The server's limits, each declared once, and the two plain ASGI guards that enforce the
ones about a request's body (they cost nothing per request).

:data:`LIMITS` names every limit with its default, its ``serve`` flag and environment
variable, and the answer a request over it gets; ``foldplane.cli`` builds its options from
it and docs/operations.md ("Limits") lists the same table. Where each is enforced: the request
time, header size and connection limits by the HTTP protocol (``api.server.GuardedHttp``), the
nesting depth by the decoder (``api.codec.check_depth``), groups and ranks by the precheck of
``POST /groups`` (``api.routes.operator``), page sizes by the readers (``api.paging``), the
body's type and size here:

- :class:`JsonBodies`: a ``POST`` to an endpoint that takes a body must say
  ``Content-Type: application/json``, else ``415``: before the body is read for the core
  endpoints (:data:`JSON_ENDPOINTS`), and for every other route with a JSON body (a facet's:
  epochs, refits, ...) in ``api.codec.read_json``, which each of them reads its body with. The form and text types a web page may send
  without a CORS preflight are refused, so a page the operator opens cannot write to a loopback
  coordinator with auth off.
- :class:`BodySizeLimit`: a declared ``Content-Length`` over the limit is answered ``413`` before
  the body is read. A body without one (chunked) is counted as it streams; the read that crosses
  the limit raises :class:`BodyTooLarge`, which the error handlers turn into the same ``413``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..wire.codes import BAD_REQUEST, BODY_TOO_LARGE, UNSUPPORTED_MEDIA_TYPE
from .errors import ApiError, BodyTooLarge, error_response

#: The default body limit: 1 MiB, room for a full batch of 4,096 heartbeats.
DEFAULT_MAX_BODY_BYTES = 1 << 20


#: The most ranks one page of ``GET /groups/{group}`` may hold, whatever ``ranks_limit`` asks:
#: a page is encoded in the event loop, so one reader cannot hold it for long.
MAX_RANKS_PAGE = 4096


@dataclass(frozen=True, slots=True)
class Limits:
    """What one coordinator accepts (each field is described in :data:`LIMITS`). The defaults
    suit one coordinator for a cluster's training jobs: the largest group the API allows
    (65,536 ranks) fits once, and many small groups fit beside each other."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_json_depth: int = 32
    max_groups: int = 1024
    max_ranks: int = 65_536
    ranks_page: int = 1000
    max_page_bytes: int = 4 << 20
    request_timeout_s: float = 10.0
    keep_alive_s: float = 5.0
    channel_idle_s: float = 60.0
    max_connections: int = 8192
    max_header_bytes: int = 65_536

    def __post_init__(self) -> None:
        for doc in LIMITS:
            value = getattr(self, doc.field)
            if not doc.low <= value <= doc.high:
                raise ValueError(
                    f"{doc.flag} is {value:g}; it must be within {doc.low:g}..{doc.high:g}"
                )

    @staticmethod
    def describe(field: str) -> str:
        return next(doc.what for doc in LIMITS if doc.field == field)


@dataclass(frozen=True, slots=True)
class LimitDoc:
    """One row of the Limits table: what a limit bounds, where it is set, what it may be set
    to, and what a request over it gets."""

    field: str
    flag: str
    env: str
    what: str
    answer: str
    low: float
    high: float


LIMITS: tuple[LimitDoc, ...] = (
    LimitDoc(
        "max_body_bytes",
        "--max-body-bytes",
        "FOLDPLANE_MAX_BODY_BYTES",
        "bytes of one request body",
        "413 body_too_large",
        1024,
        1 << 30,
    ),
    # Above 256 levels a body could reach the interpreter's recursion limit in the decoder.
    LimitDoc(
        "max_json_depth",
        "--max-json-depth",
        "FOLDPLANE_MAX_JSON_DEPTH",
        "levels of JSON arrays and objects nested in a request body",
        "400 nesting_too_deep",
        4,
        256,
    ),
    LimitDoc(
        "max_groups",
        "--max-groups",
        "FOLDPLANE_MAX_GROUPS",
        "groups one coordinator holds",
        "429 too_many_groups",
        1,
        1_000_000,
    ),
    LimitDoc(
        "max_ranks",
        "--max-ranks",
        "FOLDPLANE_MAX_RANKS",
        "ranks of all groups together (the sum of their world_size)",
        "429 too_many_ranks",
        1,
        1 << 30,
    ),
    LimitDoc(
        "ranks_page",
        "--ranks-page",
        "FOLDPLANE_RANKS_PAGE",
        "ranks in one page of GET /groups/{group} (and the group in POST /groups' answer) "
        "when ranks_limit is not given (ranks_limit may ask for up to 4,096)",
        "the next page from ranks_after",
        1,
        MAX_RANKS_PAGE,
    ),
    LimitDoc(
        "max_page_bytes",
        "--max-page-bytes",
        "FOLDPLANE_MAX_PAGE_BYTES",
        "bytes of one page of GET /views/history or GET /events (at least one item a page)",
        "a shorter page",
        1024,
        1 << 30,
    ),
    LimitDoc(
        "request_timeout_s",
        "--request-timeout-s",
        "FOLDPLANE_REQUEST_TIMEOUT_S",
        "seconds a client has to send a whole request, from connecting or from the request's "
        "first byte to the end of its body",
        "408 request_timeout and closed (closed if stuck in the body)",
        0.05,
        3600,
    ),
    LimitDoc(
        "keep_alive_s",
        "--keep-alive-s",
        "FOLDPLANE_KEEP_ALIVE_S",
        "seconds an idle keep-alive connection stays open between two requests",
        "closed",
        0.05,
        3600,
    ),
    LimitDoc(
        "channel_idle_s",
        "--channel-idle-s",
        "FOLDPLANE_CHANNEL_IDLE_S",
        "seconds an agent host channel (GET /agents/channel) stays open without receiving a "
        "frame; the agents' hosts ping after a third of it",
        "closed (1001)",
        1,
        3600,
    ),
    LimitDoc(
        "max_connections",
        "--max-connections",
        "FOLDPLANE_MAX_CONNECTIONS",
        "open HTTP connections",
        "503 too_many_connections and closed",
        1,
        1_000_000,
    ),
    LimitDoc(
        "max_header_bytes",
        "--max-header-bytes",
        "FOLDPLANE_MAX_HEADER_BYTES",
        "bytes of a request's line and headers",
        "431 headers_too_large and closed",
        1024,
        1 << 24,
    ),
)

#: The endpoints that take a JSON body (all of them ``POST``).
JSON_ENDPOINTS = frozenset({"/groups", "/proposals", "/agents/events", "/agents/deaths"})

_LENGTH = re.compile(rb"[0-9]{1,19}")


def is_json(content_type: bytes) -> bool:
    """``application/json``, with or without parameters (``; charset=utf-8``)."""
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json"


def media_problem(path: str, declared: bytes) -> ApiError | None:
    """The ``415`` for a ``POST`` to ``path`` whose ``Content-Type`` is ``declared`` (``b""``:
    none), or None when the body may be read."""
    if path not in JSON_ENDPOINTS:
        return None
    return media_refusal(path, declared)


def media_refusal(path: str, declared: bytes) -> ApiError | None:
    """The ``415`` for a JSON body posted to ``path`` with ``Content-Type`` ``declared``
    (``b""``: none), or None when it says JSON."""
    if is_json(declared):
        return None
    said = repr(declared.decode("latin-1")) if declared else "none"
    return ApiError(
        UNSUPPORTED_MEDIA_TYPE,
        f"POST {path} takes Content-Type: application/json; the request declared {said}",
    )


def length_problem(value: bytes, max_bytes: int) -> ApiError | None:
    """The ``400`` or ``413`` for a declared ``Content-Length`` of ``value``, or None."""
    if not _LENGTH.fullmatch(value):
        return ApiError(
            BAD_REQUEST, f"Content-Length {value.decode(errors='replace')!r} is not a number"
        )
    declared = int(value)
    if declared > max_bytes:
        return ApiError(
            BODY_TOO_LARGE,
            f"the request body is {declared} bytes; the limit is {max_bytes} bytes "
            "(--max-body-bytes)",
        )
    return None


async def _refuse(problem: ApiError, scope: Scope, receive: Receive, send: Send) -> None:
    await error_response(problem.status, problem.code, problem.detail)(scope, receive, send)


class JsonBodies:
    """``415 unsupported_media_type`` for a ``POST`` whose body is not declared JSON."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and scope["path"] in JSON_ENDPOINTS
        ):
            declared = b""
            for name, value in scope["headers"]:
                if name == b"content-type":
                    declared = value
                    break
            if (problem := media_problem(scope["path"], declared)) is not None:
                await _refuse(problem, scope, receive, send)
                return
        await self.app(scope, receive, send)


class BodySizeLimit:
    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length":
                if (problem := length_problem(value, self.max_bytes)) is not None:
                    await _refuse(problem, scope, receive, send)
                    return
                break
        limit = self.max_bytes
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
            return message

        await self.app(scope, counted, send)
