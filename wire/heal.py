"""The heal protocol, declared once: how a rank behind pulls the last committed step's state
from its peers' heal servers (``agent.heal``).

One TCP connection per source. Every message is length-prefixed (:data:`LENGTH`, 8 bytes,
big-endian). The puller sends requests, each a JSON object whose ``op`` names it:

- :class:`PinRequest` ``{"op": "pin"}``: pin the source's last committed step. The answer is a
  length-prefixed header (``torch.save`` of the steps, the state's structure with each tensor
  replaced by its number, and each tensor's dtype and shape).
- :class:`GetRequest` ``{"op": "get", "pieces": [[tensor, start, end], ...]}``: send these byte
  ranges of the pinned tensors. The answer is :data:`OK` and the raw bytes of each range in
  order, or :data:`REFUSED` and a length-prefixed reason (the source no longer holds the pinned
  step).

This module is pure: it encodes and decodes requests; ``agent.heal`` owns the sockets.
"""

from __future__ import annotations

import struct
from typing import Annotated

import msgspec
from msgspec import Meta, Struct

#: The length prefix of every message.
LENGTH = struct.Struct("!Q")
#: The status byte that answers a ``get``.
OK, REFUSED = b"\x00", b"\x01"

Offset = Annotated[int, Meta(ge=0)]
#: ``(tensor, start, end)``: bytes ``start`` to ``end`` of the pinned state's tensor ``tensor``.
Piece = tuple[Offset, Offset, Offset]


class PinRequest(Struct, tag_field="op", tag="pin", forbid_unknown_fields=True):
    """Pin the last committed step; answered by the state's header."""


class GetRequest(Struct, tag_field="op", tag="get", forbid_unknown_fields=True):
    """Send these byte ranges of the pinned state; answered by OK and the bytes, or REFUSED."""

    pieces: list[Piece]


HealRequest = PinRequest | GetRequest

_DECODER = msgspec.json.Decoder(HealRequest)


class HealProtocolError(ValueError):
    """A request that is not one of the protocol's (the message says what is wrong)."""


def encode_request(request: HealRequest) -> bytes:
    return msgspec.json.encode(request)


def decode_request(body: bytes) -> HealRequest:
    """The request in ``body``; :class:`HealProtocolError` names what is wrong with another."""
    try:
        return _DECODER.decode(body)
    except msgspec.DecodeError as exc:
        raise HealProtocolError(f"not a heal request ({exc}): {bytes(body[:200])!r}") from None
