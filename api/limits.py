"""The request body size limit, as a plain ASGI middleware (it costs nothing per request).

A declared ``Content-Length`` over the limit is answered ``413`` before the body is read. A body
without one (chunked) is counted as it streams; the read that crosses the limit raises
:class:`BodyTooLarge`, which the error handlers turn into the same ``413``.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import BodyTooLarge, error_response

#: The default limit: 1 MiB, room for a full batch of 4,096 heartbeats.
DEFAULT_MAX_BODY_BYTES = 1 << 20


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
                try:
                    declared = int(value)
                except ValueError:
                    await error_response(
                        400,
                        "bad_request",
                        f"Content-Length {value.decode(errors='replace')!r} is not a number",
                    )(scope, receive, send)
                    return
                if declared > self.max_bytes:
                    await error_response(
                        413,
                        "body_too_large",
                        f"the request body is {declared} bytes; the limit is {self.max_bytes} bytes",
                    )(scope, receive, send)
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
