"""The host channel's framing (``wire.websocket``): what a frame is made of, what the reader
makes of bytes however they are cut, and each way a peer can break the framing."""

from __future__ import annotations

import base64
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foldplane.wire import websocket as ws

KEY = b"\x12\x34\x56\x78"


def test_the_accept_key_is_rfc_6455s_example() -> None:
    # RFC 6455, section 1.3
    assert ws.accept_key("dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


@pytest.mark.parametrize(
    ("key", "valid"),
    [
        ("dGhlIHNhbXBsZSBub25jZQ==", True),
        (base64.b64encode(bytes(15)).decode() + "AA", False),  # 24 characters, not 16 bytes
        ("dGhlIHNhbXBsZSBub25jZQ", False),  # unpadded
        ("dGhlIHNhbXBsZSBub25jZQ=!", False),
        ("ｄGhlIHNhbXBsZSBub25jZQ==", False),  # a non-ASCII letter
        ("", False),
    ],
)
def test_a_key_must_be_the_base64_of_16_bytes(key: str, valid: bool) -> None:
    assert ws.valid_key(key) is valid


def test_masking_is_its_own_inverse_and_follows_the_rfc() -> None:
    # RFC 6455, 5.7: a masked "Hello" with key 37 fa 21 3d
    frame = ws.frame(ws.TEXT, b"Hello", mask_key=bytes.fromhex("37fa213d"))
    assert frame == bytes.fromhex("818537fa213d7f9f4d5158")
    assert ws.mask(ws.mask(b"any payload at all", KEY), KEY) == b"any payload at all"
    assert ws.mask(b"", KEY) == b""


@pytest.mark.parametrize(("n", "head"), [(0, 2), (125, 2), (126, 4), (65535, 4), (65536, 10)])
def test_the_length_takes_the_form_its_size_needs(n: int, head: int) -> None:
    assert len(ws.frame(ws.TEXT, bytes(n))) == head + n
    assert len(ws.frame(ws.TEXT, bytes(n), mask_key=KEY)) == head + 4 + n
    assert ws.header_size(n, masked=False) == head
    assert ws.header_size(n, masked=True) == head + 4


def test_a_mask_key_is_four_bytes() -> None:
    with pytest.raises(ValueError, match="4 bytes"):
        ws.frame(ws.TEXT, b"x", mask_key=b"abc")


messages = st.lists(
    st.tuples(st.sampled_from([ws.TEXT, ws.BINARY, ws.PING]), st.binary(max_size=300)),
    max_size=6,
)


@settings(max_examples=300, deadline=None)
@given(sent=messages, cuts=st.lists(st.integers(0, 2000), max_size=8), masked=st.booleans())
def test_messages_come_out_whole_however_the_bytes_are_cut(sent, cuts, masked) -> None:
    sent = [(op, p[:125] if op == ws.PING else p) for op, p in sent]
    data = b"".join(ws.frame(op, p, mask_key=KEY if masked else None) for op, p in sent)
    reader = ws.FrameReader(masked=masked, max_message=1 << 20)
    got: list[ws.Message] = []
    at = 0
    for cut in sorted(c % (len(data) + 1) for c in cuts):
        got += reader.feed(data[at:cut])
        at = max(at, cut)
    got += reader.feed(data[at:])
    assert got == [ws.Message(op, p) for op, p in sent]
    assert reader.pending == 0


def test_fragments_are_joined_and_control_frames_pass_between_them() -> None:
    def part(first: int, payload: bytes, fin: bool) -> bytes:
        return (
            bytes([(0x80 if fin else 0) | first, 0x80 | len(payload)]) + KEY + ws.mask(payload, KEY)
        )

    data = (
        part(ws.TEXT, b'{"id": 1, ', False)
        + ws.frame(ws.PING, b"p", mask_key=KEY)
        + part(ws.CONTINUATION, b'"events": ', False)
        + part(ws.CONTINUATION, b"[]}", True)
    )
    reader = ws.FrameReader(masked=True, max_message=100)
    assert reader.feed(data) == [
        ws.Message(ws.PING, b"p"),
        ws.Message(ws.TEXT, b'{"id": 1, "events": []}'),
    ]


def _raw(b0: int, b1: int, rest: bytes = b"") -> bytes:
    return bytes([b0, b1]) + rest


@pytest.mark.parametrize(
    ("data", "code", "words"),
    [
        (_raw(0xC1, 0x80, KEY), ws.PROTOCOL_ERROR, "reserved bit"),  # RSV1: no extension
        (_raw(0x81, 0x01, b"x"), ws.PROTOCOL_ERROR, "must be masked"),
        (_raw(0x83, 0x80, KEY), ws.PROTOCOL_ERROR, "unknown opcode"),
        (_raw(0x09, 0x80, KEY), ws.PROTOCOL_ERROR, "fragmented"),  # a ping without FIN
        (_raw(0x89, 0xFE, struct.pack("!H", 126) + KEY), ws.PROTOCOL_ERROR, "at most 125"),
        (_raw(0x80, 0x80, KEY), ws.PROTOCOL_ERROR, "without a message"),
        (_raw(0x01, 0x80, KEY) + _raw(0x81, 0x80, KEY), ws.PROTOCOL_ERROR, "before the last"),
        (_raw(0x81, 0xFF, struct.pack("!Q", 2**63) + KEY), ws.TOO_BIG, "over 1000"),
        (_raw(0x81, 0xFE, struct.pack("!H", 1001)), ws.TOO_BIG, "over 1000"),
        # the limit holds for a message in fragments, as soon as a header says it would be over
        (
            _raw(0x01, 0xFE, struct.pack("!H", 600) + KEY)
            + bytes(600)
            + _raw(0x80, 0xFE, struct.pack("!H", 401)),
            ws.TOO_BIG,
            "over 1000",
        ),
    ],
)
def test_a_broken_frame_is_named_with_its_close_code(data: bytes, code: int, words: str) -> None:
    reader = ws.FrameReader(masked=True, max_message=1000)
    with pytest.raises(ws.FrameError, match=words) as caught:
        reader.feed(data)
    assert caught.value.code == code


def test_an_oversized_message_is_refused_from_its_header_before_its_payload() -> None:
    reader = ws.FrameReader(masked=True, max_message=1000)
    with pytest.raises(ws.FrameError) as caught:
        reader.feed(_raw(0x81, 0xFF, struct.pack("!Q", 10**12)))  # no payload sent at all
    assert caught.value.code == ws.TOO_BIG


def test_a_server_frame_must_not_be_masked() -> None:
    reader = ws.FrameReader(masked=False, max_message=1000)
    with pytest.raises(ws.FrameError, match="must not be"):
        reader.feed(ws.frame(ws.TEXT, b"x", mask_key=KEY))


def test_a_half_sent_frame_is_pending_until_it_is_whole() -> None:
    frame = ws.frame(ws.TEXT, b"x" * 300, mask_key=KEY)
    reader = ws.FrameReader(masked=True, max_message=1000)
    assert reader.feed(frame[:3]) == []
    assert reader.pending == 3
    assert reader.feed(frame[3:]) == [ws.Message(ws.TEXT, b"x" * 300)]
    assert reader.pending == 0


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (ws.close_payload(1001, "going away"), (1001, "going away")),
        (b"", (ws.NO_STATUS, "")),
        (ws.close_payload(1000, "é" * 100), (1000, "é" * 61)),  # cut to 123 bytes, whole chars
    ],
)
def test_a_close_payload_carries_a_code_and_a_reason_that_fits(payload, expected) -> None:
    assert len(payload) <= 125
    assert ws.parse_close(payload) == expected


@pytest.mark.parametrize(
    ("code", "sendable"),
    [
        (1000, True),
        (1001, True),
        (1004, False),
        (1005, False),
        (1006, False),
        (1011, True),
        (1015, False),
        (2999, False),
        (3000, True),
        (4999, True),
        (5000, False),
        (999, False),
    ],
)
def test_only_the_close_codes_rfc_6455_lets_a_peer_send_are_sendable(code, sendable) -> None:
    assert ws.sendable_close_code(code) is sendable
