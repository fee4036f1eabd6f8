"""WebSocket framing (RFC 6455), sans I/O: the bytes of the agent host channel.

The host channel (``GET /agents/channel``, docs/protocol.md) is a WebSocket connection that
carries JSON text messages both ways. This module is the part of WebSocket both ends need and
nothing else: the opening handshake's accept key, a frame's bytes, and a reader that turns
received bytes into whole messages and control frames. It holds no socket, no clock and no
randomness: a client passes the masking key it drew (RFC 6455 requires a fresh, unpredictable
key per frame from the client, and none from the server).

What it refuses, each with the close code RFC 6455 names for it (:class:`FrameError`): a
reserved bit set (no extension is negotiated), an unknown opcode, a fragmented or oversized
control frame, a continuation without a message to continue, a new message in the middle of
another, a frame masked the wrong way for its direction, and a message over the reader's
limit (``1009``, decided from the frame's header, before its payload is buffered).
"""

from __future__ import annotations

import base64
import hashlib
import struct
from typing import NamedTuple

#: RFC 6455's GUID for the accept key.
_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

CONTINUATION = 0x0
TEXT = 0x1
BINARY = 0x2
CLOSE = 0x8
PING = 0x9
PONG = 0xA
_DATA = (TEXT, BINARY)
_CONTROL = (CLOSE, PING, PONG)

# Close codes (RFC 6455, 7.4.1) used by the channel.
NORMAL = 1000
GOING_AWAY = 1001
PROTOCOL_ERROR = 1002
UNSUPPORTED_DATA = 1003
NO_STATUS = 1005
INVALID_DATA = 1007
POLICY_VIOLATION = 1008
TOO_BIG = 1009
INTERNAL_ERROR = 1011
TRY_AGAIN_LATER = 1013

#: The WebSocket version both ends speak (``Sec-WebSocket-Version``).
VERSION = "13"


class FrameError(Exception):
    """The peer broke the framing: the connection is closed with ``code``, ``reason`` saying why."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


class Message(NamedTuple):
    """A whole message (``TEXT`` or ``BINARY``, fragments joined) or a control frame."""

    opcode: int
    payload: bytes


def accept_key(key: str) -> str:
    """``Sec-WebSocket-Accept`` for a client's ``Sec-WebSocket-Key``."""
    digest = hashlib.sha1(key.encode("ascii") + _GUID).digest()  # noqa: S324 - RFC 6455 says SHA-1
    return base64.b64encode(digest).decode("ascii")


def valid_key(key: str) -> bool:
    """Whether ``Sec-WebSocket-Key`` is what RFC 6455 asks: the base64 of 16 bytes."""
    if len(key) != 24 or not key.isascii():
        return False
    try:
        return len(base64.b64decode(key, validate=True)) == 16
    except ValueError:
        return False


def mask(payload: bytes, key: bytes) -> bytes:
    """``payload`` XOR the repeated 4-byte ``key`` (masking and unmasking are the same)."""
    n = len(payload)
    if not n:
        return b""
    stream = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "little") ^ int.from_bytes(stream, "little")).to_bytes(
        n, "little"
    )


def header_size(n: int, *, masked: bool) -> int:
    """The bytes of the header of a frame of ``n`` payload bytes."""
    return (2 if n < 126 else 4 if n < 1 << 16 else 10) + (4 if masked else 0)


def frame(opcode: int, payload: bytes, *, mask_key: bytes | None = None) -> bytes:
    """One final frame: unmasked (the server's) or masked with ``mask_key`` (a client's)."""
    n = len(payload)
    head = bytearray([0x80 | opcode])
    bit = 0x80 if mask_key is not None else 0
    if n < 126:
        head.append(bit | n)
    elif n < 1 << 16:
        head.append(bit | 126)
        head += struct.pack("!H", n)
    else:
        head.append(bit | 127)
        head += struct.pack("!Q", n)
    if mask_key is None:
        return bytes(head) + payload
    if len(mask_key) != 4:
        raise ValueError(f"a masking key is 4 bytes, got {len(mask_key)}")
    return bytes(head) + mask_key + mask(payload, mask_key)


def close_payload(code: int, reason: str = "") -> bytes:
    """A close frame's payload: the code, then the reason cut to fit a control frame."""
    data = reason.encode("utf-8")[:123]
    while data:  # never cut inside a character
        try:
            data.decode("utf-8")
            break
        except UnicodeDecodeError:
            data = data[:-1]
    return struct.pack("!H", code) + data


def sendable_close_code(code: int) -> bool:
    """Whether a close frame may carry ``code`` (RFC 6455, 7.4): 1000-1014 but 1004 (reserved)
    and 1005, 1006 (for reporting only, as 1015 is), or a registered or private 3000-4999."""
    return (1000 <= code <= 1014 and code not in (1004, 1005, 1006)) or 3000 <= code <= 4999


def parse_close(payload: bytes) -> tuple[int, str]:
    """The code and reason of a close frame (``NO_STATUS`` when it has none)."""
    if len(payload) < 2:
        return NO_STATUS, ""
    (code,) = struct.unpack("!H", payload[:2])
    return code, payload[2:].decode("utf-8", "replace")


class FrameReader:
    """Bytes in, messages out. ``masked``: the frames must be masked (a server reading a
    client) or must not be (a client reading the server); ``max_message``: the most bytes
    one message may have once its fragments are joined."""

    __slots__ = ("_buffer", "_masked", "_max", "_parts", "_parts_size", "_opcode")

    def __init__(self, *, masked: bool, max_message: int) -> None:
        self._buffer = bytearray()
        self._masked = masked
        self._max = max_message
        self._parts: list[bytes] = []
        self._parts_size = 0
        self._opcode: int | None = None  # of the message whose fragments are arriving

    @property
    def pending(self) -> int:
        """Bytes received that are not yet part of a whole message (a frame half-sent)."""
        return len(self._buffer) + self._parts_size

    def feed(self, data: bytes) -> list[Message]:
        """The messages and control frames that ``data`` completes, in order; raises
        :class:`FrameError` when the peer broke the framing (nothing after it is read)."""
        buffer = self._buffer
        buffer += data
        out: list[Message] = []
        at = 0
        size = len(buffer)
        while size - at >= 2:
            b0, b1 = buffer[at], buffer[at + 1]
            n = b1 & 0x7F
            head = 2
            if n == 126:
                if size - at < 4:
                    break
                (n,) = struct.unpack_from("!H", buffer, at + 2)
                head = 4
            elif n == 127:
                if size - at < 10:
                    break
                (n,) = struct.unpack_from("!Q", buffer, at + 2)
                head = 10
            opcode = b0 & 0x0F
            self._check(b0, b1, opcode, n)
            masked = b1 & 0x80
            if masked:
                head += 4
            if size - at < head + n:
                break
            payload = bytes(buffer[at + head : at + head + n])
            if masked:
                payload = mask(payload, bytes(buffer[at + head - 4 : at + head]))
            at += head + n
            message = self._complete(b0 & 0x80, opcode, payload)
            if message is not None:
                out.append(message)
        if at:
            del buffer[:at]
        return out

    def _check(self, b0: int, b1: int, opcode: int, n: int) -> None:
        """A frame's header against the rules, before its payload is waited for."""
        if b0 & 0x70:
            raise FrameError(PROTOCOL_ERROR, "a reserved bit is set; no extension was agreed")
        if bool(b1 & 0x80) != self._masked:
            raise FrameError(
                PROTOCOL_ERROR,
                "a client's frames must be masked" if self._masked else "a server's must not be",
            )
        if opcode in _CONTROL:
            if not b0 & 0x80:
                raise FrameError(PROTOCOL_ERROR, "a control frame must not be fragmented")
            if n > 125:
                raise FrameError(PROTOCOL_ERROR, f"a control frame of {n} bytes; at most 125")
            return
        if opcode == CONTINUATION:
            if self._opcode is None:
                raise FrameError(PROTOCOL_ERROR, "a continuation frame without a message")
        elif opcode in _DATA:
            if self._opcode is not None:
                raise FrameError(PROTOCOL_ERROR, "a new message before the last one ended")
        else:
            raise FrameError(PROTOCOL_ERROR, f"unknown opcode {opcode:#x}")
        if self._parts_size + n > self._max:
            raise FrameError(TOO_BIG, f"a message over {self._max} bytes")

    def _complete(self, fin: int, opcode: int, payload: bytes) -> Message | None:
        if opcode in _CONTROL:
            return Message(opcode, payload)
        if fin and opcode != CONTINUATION:
            return Message(opcode, payload)
        if opcode != CONTINUATION:
            self._opcode = opcode
        self._parts.append(payload)
        self._parts_size += len(payload)
        if not fin:
            return None
        whole = Message(self._opcode or TEXT, b"".join(self._parts))
        self._parts = []
        self._parts_size = 0
        self._opcode = None
        return whole
