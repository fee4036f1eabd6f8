"""Decoding request bodies into the Structs of ``api.models`` and encoding answers.

A body that is not JSON, or not of the expected shape, is ``422 invalid_request`` with a detail
that names the path of the offending field (``$.events[3].rank``), as msgspec reports it.
Validation is strict (no string-to-number coercion), with one exception that JSON Schema makes:
an integral float such as ``3.0`` is an integer (:func:`_integral`).

A body nested deeper than the server's limit (``api.limits.Limits.max_json_depth``) is
``400 nesting_too_deep`` before it is decoded: the decoder recurses once per level, also
inside fields it ignores, so about a thousand levels (a 2 kB body) would otherwise reach the
interpreter's recursion limit. :func:`check_depth` measures the depth without a Python loop
over the bytes: strings are cut out, then the innermost ``[]`` and ``{}`` pairs are removed
level by level, at most ``limit`` times, so the cost is the body's length times its depth.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from ..wire.codes import INVALID_REQUEST, NESTING_TOO_DEEP
from .errors import ApiError
from .limits import media_refusal

T = TypeVar("T")

_encoder = msgspec.json.Encoder()


#: An escape inside a JSON string; read from the left, what remains holds no escaped quote.
_ESCAPE = re.compile(rb"\\.", re.DOTALL)
#: Keep only the brackets and the quotes, and count an object's as an array's.
_NOT_BRACKETS_OR_QUOTES = bytes(set(range(256)) - set(b'[]{}"'))
_ONE_KIND = bytes.maketrans(b"{}", b"[]")


def check_depth(body: bytes, limit: int) -> None:
    """``400 nesting_too_deep`` when the body's arrays and objects may nest more than ``limit``
    levels. A body with no more than ``limit`` brackets cannot, and costs two counts.

    Each pass removes the innermost pairs; pairs nested in each other go in successive passes,
    so after ``p`` passes the deepest point a decoder reaches is at most ``p`` plus the opening
    brackets left unmatched (a body cut short, which the decoder would still descend into)."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return
    if b"\\" in body:
        body = _ESCAPE.sub(b"", body)
    # Without escapes a quote always opens or closes a string. Dropping two adjacent quotes keeps
    # every other bracket on its side of the quotes and leaves only the strings that hold
    # brackets; what lies outside them is every other piece between the quotes left.
    kept = body.translate(_ONE_KIND, _NOT_BRACKETS_OR_QUOTES).replace(b'""', b"")
    brackets = b"".join(kept.split(b'"')[::2]) if b'"' in kept else kept
    too_deep = b"[" * (limit + 1)
    passes = 0
    while brackets and passes <= limit and too_deep not in brackets:
        inner = brackets.replace(b"[]", b"")
        if len(inner) == len(brackets):
            break
        brackets, passes = inner, passes + 1
    if passes + brackets.count(b"[") > limit:
        raise ApiError(
            NESTING_TOO_DEEP,
            f"the body nests arrays and objects more than {limit} levels deep, the limit "
            "(--max-json-depth)",
        )


async def read_json(request: Request, type_: type[T]) -> T:
    """A ``POST``'s JSON body as ``type_``: ``415`` unless it says ``Content-Type:
    application/json`` (as every route with a body requires), ``422`` naming what is wrong."""
    declared = request.headers.get("content-type", "").encode("latin-1")
    if (problem := media_refusal(request.url.path, declared)) is not None:
        raise problem
    body = await request.body()
    check_depth(body, request.app.state.limits.max_json_depth)
    return decode_json(body, type_)


def decode_json(body: bytes, type_: type[T]) -> T:
    """A request body as ``type_``, or ``422 invalid_request`` naming what is wrong. The caller
    has checked its depth (:func:`check_depth`)."""
    if not body:
        raise ApiError(INVALID_REQUEST, "the request needs a JSON body")
    try:
        try:
            return msgspec.json.decode(body, type=type_)
        except msgspec.ValidationError as exc:
            if _FLOAT_FOR_INT not in str(exc):
                raise
        # an integral float where an integer belongs: decode, make it an int, validate again
        # (the strict decode may have stopped before a part that is not JSON at all)
        return msgspec.convert(_integral(msgspec.json.decode(body)), type_)
    except msgspec.ValidationError as exc:  # a subclass of DecodeError: first
        raise ApiError(INVALID_REQUEST, str(exc)) from None
    except msgspec.DecodeError as exc:
        raise ApiError(INVALID_REQUEST, f"the body is not valid JSON: {exc}") from None
    except RecursionError:  # only reachable with a depth limit near the interpreter's own
        raise ApiError(NESTING_TOO_DEEP, "the body nests too deeply to decode") from None


def convert(value: Any, type_: type[T]) -> T:
    """Validate an already decoded JSON value (strictly: no string-to-number coercion, but an
    integral float is an integer)."""
    try:
        return msgspec.convert(value, type_)
    except msgspec.ValidationError as exc:
        if _FLOAT_FOR_INT not in str(exc):
            raise
    return msgspec.convert(_integral(value), type_)


#: How msgspec words a float where an integer was expected (``3.0`` or ``3.5``).
_FLOAT_FOR_INT = "Expected `int"


def _integral(value: Any) -> Any:
    """``value`` with every integral float made an int. JSON Schema's ``integer`` admits
    ``3.0``; msgspec, strict, does not; a field declared ``float`` takes the int as well. Only
    bodies that failed the strict decode come here, so valid ones pay nothing."""
    if isinstance(value, float):
        return int(value) if value.is_integer() else value  # inf and nan are not integers
    if isinstance(value, list):
        return [_integral(v) for v in value]
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    return value


def encode_json(value: Any) -> bytes:
    return _encoder.encode(value)


def raw_json_response(body: bytes, status: int = 200) -> Response:
    """An answer whose JSON is already encoded."""
    return Response(body, status, media_type="application/json")


def json_response(value: Any, status: int = 200) -> Response:
    return Response(_encoder.encode(value), status, media_type="application/json")
