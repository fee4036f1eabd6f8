"""Decoding request bodies into the Structs of ``api.models`` and encoding answers.

A body that is not JSON, or not of the expected shape, is ``422 invalid_request`` with a detail
that names the path of the offending field (``$.events[3].rank``), as msgspec reports it.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from api.errors import ApiError

T = TypeVar("T")

_encoder = msgspec.json.Encoder()


async def read_json(request: Request, type_: type[T]) -> T:
    return decode_json(await request.body(), type_)


def decode_json(body: bytes, type_: type[T]) -> T:
    """A request body as ``type_``, or ``422 invalid_request`` naming what is wrong."""
    if not body:
        raise ApiError(422, "invalid_request", "the request needs a JSON body")
    try:
        return msgspec.json.decode(body, type=type_)
    except msgspec.ValidationError as exc:
        raise ApiError(422, "invalid_request", str(exc)) from None
    except msgspec.DecodeError as exc:
        raise ApiError(422, "invalid_request", f"the body is not valid JSON: {exc}") from None


def convert(value: Any, type_: type[T]) -> T:
    """Validate an already decoded JSON value (strictly: no string-to-number coercion)."""
    return msgspec.convert(value, type_)


def encode_json(value: Any) -> bytes:
    return _encoder.encode(value)


def raw_json_response(body: bytes, status: int = 200) -> Response:
    """An answer whose JSON is already encoded."""
    return Response(body, status, media_type="application/json")


def json_response(value: Any, status: int = 200) -> Response:
    return Response(_encoder.encode(value), status, media_type="application/json")
