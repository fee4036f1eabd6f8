"""The agents' two hot paths served ahead of the framework.

``POST /agents/events`` carries the heartbeats, nearly all of the traffic (tens of thousands of
events a second); ``GET /agents/updates`` is the long poll every agent host keeps open, and a
view change answers all of them at once (twice: prepare, then commit). The framework's
per-request machinery (its middleware stack, routing, dependency solving, exception wrapping,
request and response objects) costs more than the coordinator's own work for either.
:class:`Service` is the ASGI application the server runs: it answers those paths itself, with
plain ASGI messages, by the same functions the documented routes call
(``api.routes.agents.events_answer`` and ``updates_answer``), so the behaviour and the OpenAPI
document stay those of the routes; everything else goes to the FastAPI app. A long poll whose
query is anything but plainly well formed goes to the framework too, which words the ``422``.
Errors on the fast path are answered here in the same ``{"error", "detail"}`` shape.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any, NamedTuple
from urllib.parse import parse_qsl

from fastapi import FastAPI
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ..coordinator.auth import Authenticator, Principal
from ..coordinator.host.loop import Outcome
from ..wire.codes import INTERNAL, status_of
from ..wire.protocol import QUERY
from .errors import ApiError, BodyTooLarge, answer_of, body_response, error_response
from .limits import BodySizeLimit, JsonBodies, length_problem, media_problem
from .routes.agents import (
    EventsBatch,
    UpdatesQuery,
    events_answer,
    poll_ranks,
    updates_answer,
)

PATH = "/agents/events"
UPDATES = "/agents/updates"

_JSON = (b"content-type", b"application/json")

log = logging.getLogger("foldplane.api")


class Service:
    """The coordinator's ASGI application: the body size limit, the agents' fast paths, FastAPI."""

    def __init__(self, app: FastAPI, *, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self._limited = JsonBodies(BodySizeLimit(app, max_body_bytes))

    @property
    def state(self) -> Any:
        return self.app.state

    def openapi(self) -> dict[str, Any]:
        return self.app.openapi()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path, method = scope["path"], scope["method"]
            if path == PATH and method == "POST":
                await self._answer(scope, receive, send, None)
                return
            if path == UPDATES and method == "GET":
                query = updates_query(scope.get("query_string", b""))
                if query is not None:
                    await self._answer(scope, receive, send, query)
                    return
        await self._limited(scope, receive, send)

    async def _answer(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        query: UpdatesQuery | None,
    ) -> None:
        """Answer one request on a fast path: the events when ``query`` is None, else the long
        poll it names. The body's guards are those of ``api.limits`` (type, then size), checked
        here from one pass over the headers instead of by the middleware."""
        state = self.app.state
        try:
            authorization, content_type, length = _head(scope["headers"])
            if query is None and (problem := media_problem(PATH, content_type)) is not None:
                raise problem
            if (
                length is not None
                and (problem := length_problem(length, self.max_body_bytes)) is not None
            ):
                raise problem
            principal = _principal(state.auth, authorization)
            if query is None:
                body = await _read_body(receive, self.max_body_bytes)
                if body is None:  # the client went away before sending it all
                    return
                answer = await events_answer(state, principal, body)
            else:
                answer = await updates_answer(state, principal, query)
        except Exception as exc:  # noqa: BLE001 - every failure is answered in the one shape
            response = failure_response(exc, scope)
        else:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [_JSON, (b"content-length", b"%d" % len(answer))],
                }
            )
            await send({"type": "http.response.body", "body": answer})
            return
        await response(scope, receive, send)

    def on_connection(self) -> OnConnection:
        """The hot paths for ``api.server``'s connections (see :class:`OnConnection`)."""
        return OnConnection(self)


def failure_response(exc: Exception, scope: Scope) -> Response:
    """A fast path's answer to what its request raised, in the one error shape; anything the
    API does not raise on purpose is a bug, logged and answered ``500``."""
    answer = answer_of(exc)
    if answer is not None:
        return body_response(*answer)
    log.error("internal error on %s %s", scope["method"], scope["path"], exc_info=exc)
    return error_response(status_of(INTERNAL), INTERNAL, f"{type(exc).__name__}: {exc}")


#: What :meth:`OnConnection.plan` answers for an events batch it serves.
EVENTS = "events"

#: A response as the connection writes it: status, headers, body.
Answer = tuple[int, list[tuple[bytes, bytes]], bytes]


class OnConnection:
    """The agents' two hot paths answered by the connection itself, without an ASGI request.

    Nearly every request a coordinator serves is an agent host's batch of heartbeats or its
    long poll, and the ASGI cycle (its messages, the response's header checks, two socket
    writes; for a batch, a task too) costs as much as the coordinator's own work for either.
    ``api.server.GuardedHttp`` asks :meth:`plan` about each request's head and serves the plain
    ones here:

    - ``POST /agents/events`` with a JSON body of a declared length that fits one read:
      :meth:`submit` queues its records by the same ``EventsBatch`` the route uses, without a
      task, and :meth:`answer` is written when the host's future is done. A batch that fails
      before its records are queued (bad JSON, a bad token, the host unavailable) is handed
      back to the ASGI application, which answers it as it does any request; nothing has been
      queued by then, so nothing is submitted twice.
    - ``GET /agents/updates`` without a body (none, or a ``Content-Length`` of 0), whose
      query :func:`updates_query` parses:
      :meth:`poll` is the answer of ``updates_answer``, errors in the one shape.

    Everything else goes to the ASGI application.
    """

    def __init__(self, service: Service) -> None:
        self.state = service.app.state
        self.max_body_bytes = service.max_body_bytes

    def plan(self, scope: Scope, most: int) -> str | UpdatesQuery | None:
        """:data:`EVENTS` for a plain batch (a JSON ``Content-Type`` and a ``Content-Length``
        of at most ``most`` bytes, within the body limit; not chunked, no ``Expect``), the
        query of a plain long poll, or None."""
        path, method = scope["path"], scope["method"]
        if path == UPDATES and method == "GET":
            for name, value in scope["headers"]:  # no body (some clients say so: length 0)
                if name == b"transfer-encoding" or (name == b"content-length" and value != b"0"):
                    return None
            return updates_query(scope["query_string"])
        if path != PATH or method != "POST":
            return None
        length: bytes | None = None
        content_type = b""
        for name, value in scope["headers"]:
            if name == b"content-length":
                if length is not None:
                    return None
                length = value
            elif name == b"content-type":
                if content_type:
                    return None
                content_type = value
            elif name in (b"transfer-encoding", b"expect"):
                return None
        if (
            length is not None
            and length.isdigit()
            and len(length) < 10
            and int(length) <= min(most, self.max_body_bytes)
            and media_problem(PATH, content_type) is None
        ):
            return EVENTS
        return None

    def submit(self, scope: Scope, body: bytes) -> Submitted | None:
        """Queue the body's records; None if the request is left to the ASGI application."""
        state = self.state
        try:
            authorization, _, _ = _head(scope["headers"])
            batch = EventsBatch.read(state, _principal(state.auth, authorization), body)
            return Submitted(batch, state.host.enqueue_many(batch.records, normalized=True))
        except Exception:  # noqa: BLE001 - the ASGI path reads it again and answers (or logs)
            return None

    def answer(self, scope: Scope, submitted: Submitted) -> Answer:
        """The response once the submitted batch's future is done."""
        try:
            body = submitted.batch.answer(submitted.outcomes.result(), self.state.host.log.term)
        except Exception as exc:  # noqa: BLE001 - the host failed it (closed, deposed, ...)
            return _failure(exc, scope)
        return 200, [_JSON, (b"content-length", b"%d" % len(body))], body

    async def poll(self, scope: Scope, query: UpdatesQuery) -> Answer:
        """The long poll's response."""
        state = self.state
        try:
            authorization, _, _ = _head(scope["headers"])
            body = await updates_answer(state, _principal(state.auth, authorization), query)
        except Exception as exc:  # noqa: BLE001 - every failure is answered in the one shape
            return _failure(exc, scope)
        return 200, [_JSON, (b"content-length", b"%d" % len(body))], body


def _failure(exc: Exception, scope: Scope) -> Answer:
    response = failure_response(exc, scope)
    return response.status_code, response.raw_headers, bytes(response.body)


class Submitted(NamedTuple):
    batch: EventsBatch
    outcomes: asyncio.Future[list[Outcome]]


def _head(headers: list[tuple[bytes, bytes]]) -> tuple[bytes | None, bytes, bytes | None]:
    """The ``Authorization``, ``Content-Type`` (``b""`` when absent) and ``Content-Length``
    headers: the first of each, as the framework and the middleware read them."""
    authorization: bytes | None = None
    content_type: bytes | None = None
    length: bytes | None = None
    for name, value in headers:
        if name == b"authorization":
            if authorization is None:
                authorization = value
        elif name == b"content-type":
            if content_type is None:
                content_type = value
        elif name == b"content-length" and length is None:
            length = value
    return authorization, content_type or b"", length


def _principal(auth: Authenticator, authorization: bytes | None) -> Principal:
    """Who the request's ``Authorization`` header speaks for (what ``api.deps.principal_of``
    does for a framework request)."""
    if not auth.enabled or authorization is None:
        return auth.authenticate(None)
    return auth.authenticate(authorization.decode("latin-1"))


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole request body, or None if the client disconnected first; a body over
    ``limit`` bytes raises :class:`BodyTooLarge` (one sent without a ``Content-Length``)."""
    chunks: list[bytes] = []
    seen = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        seen += len(chunk)
        if seen > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


_DIGITS = re.compile(r"[0-9]{1,19}")
_SECONDS = re.compile(r"[0-9]{1,6}(\.[0-9]{1,9})?")


def updates_query(raw: bytes) -> UpdatesQuery | None:
    """The long poll's query when it is plainly within the bounds the route declares
    (``api.routes.agents.get_updates``, both from ``wire.protocol.QUERY``); None for anything
    else, which the framework answers."""
    try:
        text = raw.decode("ascii")
        if "%" in text or "+" in text:  # escapes: the standard parser decodes them
            pairs = parse_qsl(text, keep_blank_values=True, strict_parsing=True)
        else:  # what it gives for a query without any (each field must have its "=")
            pairs = [_pair(field) for field in text.split("&")]
    except (UnicodeDecodeError, ValueError):
        return None
    fields = dict(pairs)
    if len(fields) != len(pairs) or not fields.keys() <= _UPDATE_FIELDS or "group" not in fields:
        return None
    group = fields["group"]
    after = fields.get("after", "0")
    timeout = fields.get("timeout")
    protocol = fields.get("protocol", "")
    view = fields.get("view")
    if not (
        len(fields.get("features", "")) <= 200
        and 0 < len(group) <= QUERY.group_chars
        and _DIGITS.fullmatch(after)
        and (timeout is None or _SECONDS.fullmatch(timeout))
        and _DIGITS.fullmatch(protocol)
        and (view is None or _DIGITS.fullmatch(view))
    ):
        return None
    try:
        ranks = poll_ranks(
            int(fields["rank"]) if _DIGITS.fullmatch(fields.get("rank", "")) else None,
            fields.get("ranks"),
        )
    except ApiError:
        return None
    if "rank" in fields and not _DIGITS.fullmatch(fields["rank"]):
        return None
    query = UpdatesQuery(
        group,
        ranks,
        int(after),
        QUERY.poll_timeout_s if timeout is None else float(timeout),
        int(protocol),
        None if view is None else int(view),
        fields.get("features"),
    )
    if (
        ranks[-1] > QUERY.max_rank
        or query.after > QUERY.max_offset
        or query.timeout > QUERY.max_poll_s
    ):
        return None
    return query


def _pair(field: str) -> tuple[str, str]:
    name, eq, value = field.partition("=")
    if not eq:
        raise ValueError(f"bad query field: {field!r}")
    return name, value


_UPDATE_FIELDS = frozenset(
    {"group", "rank", "ranks", "after", "timeout", "protocol", "view", "features"}
)
