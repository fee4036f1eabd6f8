"""torchft's lighthouse messages, as the bytes on the wire: a proto3 codec for exactly the
messages of ``torchft.LighthouseService`` (``proto/torchft.proto`` in the torchft repository).

Speaking torchft's protocol means the same service and method names, the same messages and the
same field numbers; nothing else of torchft is used. The codec is written here, by hand, for
the six messages the service carries, so that every way a message can be wrong is refused with
a reason that names the message, the field and what was wrong (a truncated varint, a length
past the end, a string that is not UTF-8, a value over its bound), before anything reaches the
fold. It is pure: bytes in, values out.

Two revisions of the protocol share these messages: torchft 0.2 and the torchft-nightly
protocol (0.3), which adds ``QuorumMember.reconfigure_handles`` (field 9, repeated): a
replica group's manager sends its ranks' process-group reconfigure handles with its quorum
request, in group-rank order, and the quorum carries every participant's, so group rank ``g``
of each member builds torch's reconfigure options from the ``g``-th handle of every
participant, in replica-rank order. A 0.2 member sends none; a 0.2 client skips the field in
the answer, as proto3 skips every field it does not know. So one codec answers both.

Field numbers (proto3; ``string`` fields are UTF-8, ``int64``/``uint64`` varints):

==========================  ======================================================
``QuorumMember``            1 replica_id, 2 address, 3 store_address, 4 step (int64),
                            5 world_size (uint64), 6 shrink_only (bool), 7 data,
                            8 commit_failures (int64), 9 reconfigure_handles
                            (repeated)
``Quorum``                  1 quorum_id (int64), 2 participants (repeated
                            QuorumMember), 3 created (google.protobuf.Timestamp:
                            1 seconds, 2 nanos)
``LighthouseQuorumRequest``   1 requester (QuorumMember)
``LighthouseQuorumResponse``  1 quorum (Quorum)
``LighthouseHeartbeatRequest``  1 replica_id
``LighthouseHeartbeatResponse`` (no fields)
==========================  ======================================================
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

import msgspec
from msgspec import Meta

#: The service and its methods, as gRPC names them (``/torchft.LighthouseService/Quorum``).
SERVICE = "torchft.LighthouseService"
QUORUM_METHOD = f"/{SERVICE}/Quorum"
HEARTBEAT_METHOD = f"/{SERVICE}/Heartbeat"

#: The bounds a member's fields must keep (bytes of UTF-8, or values). torchft sets none; these
#: are far above what its manager sends (a replica id is a name and a UUID, an address a URL, a
#: reconfigure handle a short JSON document) and keep one member's record small.
MAX_ID_BYTES = 512
MAX_ADDRESS_BYTES = 1024
MAX_DATA_BYTES = 64 * 1024
MAX_HANDLE_BYTES = 16 * 1024
MAX_HANDLES = 4096
MAX_WORLD_SIZE = 1 << 31
#: The most bytes one request may have: the gRPC server refuses a larger one before it is read
#: (``RESOURCE_EXHAUSTED``), and :func:`decode_quorum_request` never sees it.
MAX_MESSAGE_BYTES = 256 * 1024

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1

VARINT, I64, LEN, I32 = 0, 1, 2, 5
_WIRE_NAMES = {VARINT: "varint", I64: "64-bit", LEN: "length-delimited", 3: "group start",
               4: "group end", I32: "32-bit"}  # fmt: skip


class MessageError(ValueError):
    """A message that cannot be read; the text names the message, the field and why."""


_Int64 = Annotated[int, Meta(ge=_INT64_MIN, le=_INT64_MAX)]


class QuorumMember(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One replica group, as it asks for a quorum and as a quorum names it (its bounds are
    the wire's: characters here, bytes of UTF-8 on the wire, whichever is read)."""

    replica_id: Annotated[str, Meta(min_length=1, max_length=MAX_ID_BYTES)]
    address: Annotated[str, Meta(max_length=MAX_ADDRESS_BYTES)] = ""
    store_address: Annotated[str, Meta(max_length=MAX_ADDRESS_BYTES)] = ""
    step: _Int64 = 0
    world_size: Annotated[int, Meta(ge=0, le=MAX_WORLD_SIZE)] = 0
    shrink_only: bool = False
    data: Annotated[str, Meta(max_length=MAX_DATA_BYTES)] = ""
    commit_failures: _Int64 = 0
    #: its ranks' process-group reconfigure handles, in group-rank order (torchft-nightly);
    #: none from a 0.2 member
    reconfigure_handles: Annotated[
        tuple[Annotated[str, Meta(max_length=MAX_HANDLE_BYTES)], ...], Meta(max_length=MAX_HANDLES)
    ] = ()


class Quorum(msgspec.Struct, frozen=True, kw_only=True):
    """A decided quorum: its id, the participants in replica-rank order, and when (ns)."""

    quorum_id: int
    participants: tuple[QuorumMember, ...]
    created_ns: int


# -- reading ----------------------------------------------------------------------------------


def _varint(buf: bytes, at: int, where: str) -> tuple[int, int]:
    """The varint at ``at`` and the offset after it."""
    value = shift = 0
    end = len(buf)
    while True:
        if at >= end:
            raise MessageError(f"{where}: the message ends inside a varint")
        byte = buf[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
        if shift >= 70:
            raise MessageError(f"{where}: a varint longer than 10 bytes")


def _fields(buf: bytes, message: str) -> Iterator[tuple[int, int, int | bytes]]:
    """Each field of ``buf`` in order: ``(number, wire type, value)``; a varint's value is its
    unsigned 64-bit integer, a length-delimited one's its bytes. Fixed-width fields are read
    and skipped by the caller like any field it does not know."""
    at, end = 0, len(buf)
    while at < end:
        key, at = _varint(buf, at, message)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise MessageError(f"{message}: field number 0 (key {key}) is not a field")
        where = f"{message} field {number}"
        if wire == VARINT:
            value, at = _varint(buf, at, where)
            if value >> 64:
                raise MessageError(f"{where}: a varint over 64 bits")
            yield number, wire, value
        elif wire == LEN:
            length, at = _varint(buf, at, where)
            if length > end - at:
                raise MessageError(
                    f"{where}: a length of {length} bytes, but {end - at} bytes are left"
                )
            yield number, wire, buf[at : at + length]
            at += length
        elif wire == I64:
            if end - at < 8:
                raise MessageError(f"{where}: the message ends inside a 64-bit value")
            yield number, wire, buf[at : at + 8]
            at += 8
        elif wire == I32:
            if end - at < 4:
                raise MessageError(f"{where}: the message ends inside a 32-bit value")
            yield number, wire, buf[at : at + 4]
            at += 4
        else:
            raise MessageError(f"{where}: wire type {wire} ({_WIRE_NAMES.get(wire, 'unknown')}) "
                               "is not one proto3 writes")  # fmt: skip


def _expect(number: int, wire: int, want: int, message: str, name: str) -> None:
    if wire != want:
        raise MessageError(
            f"{message}.{name} (field {number}) must be {_WIRE_NAMES[want]}, "
            f"got {_WIRE_NAMES.get(wire, wire)}"
        )


def _string(value: bytes, message: str, name: str, limit: int) -> str:
    if len(value) > limit:
        raise MessageError(
            f"{message}.{name} has {len(value)} bytes, more than the {limit} allowed"
        )
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MessageError(
            f"{message}.{name} is not UTF-8 ({exc.reason} at byte {exc.start})"
        ) from None


def _int64(value: int) -> int:
    """A varint read as proto3 reads an ``int64``: two's complement over 64 bits."""
    return value - (1 << 64) if value >> 63 else value


_MEMBER_STRINGS = {
    1: ("replica_id", MAX_ID_BYTES),
    2: ("address", MAX_ADDRESS_BYTES),
    3: ("store_address", MAX_ADDRESS_BYTES),
    7: ("data", MAX_DATA_BYTES),
}


def decode_member(buf: bytes, message: str = "QuorumMember") -> QuorumMember:
    """A ``QuorumMember``; the last occurrence of a field wins, as in proto3. Raises
    :class:`MessageError`."""
    fields: dict[str, object] = {}
    handles: list[str] = []
    for number, wire, value in _fields(buf, message):
        if number == 9:
            _expect(number, wire, LEN, message, "reconfigure_handles")
            if len(handles) == MAX_HANDLES:
                raise MessageError(
                    f"{message}.reconfigure_handles has more than the {MAX_HANDLES} allowed"
                )
            handles.append(_string(value, message, "reconfigure_handles", MAX_HANDLE_BYTES))  # type: ignore[arg-type]
        elif number in _MEMBER_STRINGS:
            name, limit = _MEMBER_STRINGS[number]
            _expect(number, wire, LEN, message, name)
            fields[name] = _string(value, message, name, limit)  # type: ignore[arg-type]
        elif number in (4, 8):
            name = "step" if number == 4 else "commit_failures"
            _expect(number, wire, VARINT, message, name)
            fields[name] = _int64(value)  # type: ignore[arg-type]
        elif number == 5:
            _expect(number, wire, VARINT, message, "world_size")
            if value > MAX_WORLD_SIZE:  # type: ignore[operator]
                raise MessageError(
                    f"{message}.world_size is {value}, more than the {MAX_WORLD_SIZE} allowed"
                )
            fields["world_size"] = value
        elif number == 6:
            _expect(number, wire, VARINT, message, "shrink_only")
            fields["shrink_only"] = value != 0
    if not fields.get("replica_id"):
        raise MessageError(f"{message}.replica_id is empty: a member needs a replica id")
    if handles:
        fields["reconfigure_handles"] = tuple(handles)
    return QuorumMember(**fields)  # type: ignore[arg-type]


def decode_quorum_request(buf: bytes) -> QuorumMember:
    """A ``LighthouseQuorumRequest``: its requester. Raises :class:`MessageError` (also when
    the requester is missing, as torchft's lighthouse does)."""
    requester = None
    for number, wire, value in _fields(buf, "LighthouseQuorumRequest"):
        if number == 1:
            _expect(number, wire, LEN, "LighthouseQuorumRequest", "requester")
            requester = decode_member(value, "LighthouseQuorumRequest.requester")  # type: ignore[arg-type]
    if requester is None:
        raise MessageError("LighthouseQuorumRequest: missing requester")
    return requester


def decode_heartbeat_request(buf: bytes) -> str:
    """A ``LighthouseHeartbeatRequest``: its replica id. Raises :class:`MessageError`."""
    message = "LighthouseHeartbeatRequest"
    replica_id = ""
    for number, wire, value in _fields(buf, message):
        if number == 1:
            _expect(number, wire, LEN, message, "replica_id")
            replica_id = _string(value, message, "replica_id", MAX_ID_BYTES)  # type: ignore[arg-type]
    if not replica_id:
        raise MessageError(f"{message}.replica_id is empty: a heartbeat names its replica")
    return replica_id


def decode_quorum_response(buf: bytes) -> Quorum:
    """A ``LighthouseQuorumResponse`` (what a client reads; the tests read ours with it)."""
    quorum_id, created_ns, participants = 0, 0, []
    for number, wire, value in _fields(buf, "LighthouseQuorumResponse"):
        if number != 1 or wire != LEN:
            continue
        for n, w, v in _fields(value, "Quorum"):  # type: ignore[arg-type]
            if n == 1 and w == VARINT:
                quorum_id = _int64(v)  # type: ignore[arg-type]
            elif n == 2 and w == LEN:
                participants.append(decode_member(v, "Quorum.participants"))  # type: ignore[arg-type]
            elif n == 3 and w == LEN:
                seconds = nanos = 0
                for tn, tw, tv in _fields(v, "Timestamp"):  # type: ignore[arg-type]
                    if tn == 1 and tw == VARINT:
                        seconds = _int64(tv)  # type: ignore[arg-type]
                    elif tn == 2 and tw == VARINT:
                        nanos = _int64(tv)  # type: ignore[arg-type]
                created_ns = seconds * 1_000_000_000 + nanos
    return Quorum(quorum_id=quorum_id, participants=tuple(participants), created_ns=created_ns)


# -- writing ----------------------------------------------------------------------------------


def _put_varint(out: bytearray, value: int) -> None:
    value &= (1 << 64) - 1  # an int64 is written as its two's complement
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _put_key(out: bytearray, number: int, wire: int) -> None:
    _put_varint(out, (number << 3) | wire)


def _put_bytes(out: bytearray, number: int, value: bytes) -> None:
    _put_key(out, number, LEN)
    _put_varint(out, len(value))
    out += value


def _put_string(out: bytearray, number: int, value: str) -> None:
    if value:  # proto3 leaves a default out
        _put_bytes(out, number, value.encode("utf-8"))


def _put_int(out: bytearray, number: int, value: int) -> None:
    if value:
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise MessageError(f"field {number}: {value} does not fit in 64 bits")
        _put_key(out, number, VARINT)
        _put_varint(out, value)


def encode_member(member: QuorumMember) -> bytes:
    out = bytearray()
    _put_string(out, 1, member.replica_id)
    _put_string(out, 2, member.address)
    _put_string(out, 3, member.store_address)
    _put_int(out, 4, member.step)
    _put_int(out, 5, member.world_size)
    _put_int(out, 6, int(member.shrink_only))
    _put_string(out, 7, member.data)
    _put_int(out, 8, member.commit_failures)
    for handle in member.reconfigure_handles:
        _put_bytes(out, 9, handle.encode("utf-8"))  # repeated: an empty handle is kept
    return bytes(out)


def encode_quorum_request(member: QuorumMember) -> bytes:
    out = bytearray()
    _put_bytes(out, 1, encode_member(member))
    return bytes(out)


def encode_heartbeat_request(replica_id: str) -> bytes:
    out = bytearray()
    _put_string(out, 1, replica_id)
    return bytes(out)


def encode_quorum_response(quorum: Quorum) -> bytes:
    """A ``LighthouseQuorumResponse`` carrying ``quorum``."""
    body = bytearray()
    _put_int(body, 1, quorum.quorum_id)
    for member in quorum.participants:
        _put_bytes(body, 2, encode_member(member))
    stamp = bytearray()
    seconds, nanos = divmod(quorum.created_ns, 1_000_000_000)
    _put_int(stamp, 1, seconds)
    _put_int(stamp, 2, nanos)
    _put_bytes(body, 3, bytes(stamp))
    out = bytearray()
    _put_bytes(out, 1, bytes(body))
    return bytes(out)


#: ``LighthouseHeartbeatResponse`` has no fields.
HEARTBEAT_RESPONSE = b""
