"""torchft's lighthouse messages as bytes (``facets/lighthouse/messages.py``): what
torchft's own client writes is read, what we write torchft reads (tests/lighthouse/
test_service.py checks both against its real client), and every way a message can be wrong is a
:class:`MessageError` that names the message and the field, never another exception."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foldplane.facets.lighthouse import messages as m

#: A request torchft-nightly's manager sent (captured from its ``ManagerServer``): replica
#: ``r0:uuid`` at step 3, world size 2, its two ranks' reconfigure handles ``H0`` and ``H1``.
TORCHFT_REQUEST = bytes.fromhex(
    "0a3a0a0772303a757569641216687474703a2f2f3132372e302e302e313a34303332371a0b3132372e302e30"
    "2e313a31200328024a0248304a024831"
)


def test_a_request_torchft_sent_is_read_field_by_field() -> None:
    member = m.decode_quorum_request(TORCHFT_REQUEST)
    assert member == m.QuorumMember(
        replica_id="r0:uuid",
        address="http://127.0.0.1:40327",
        store_address="127.0.0.1:1",
        step=3,
        world_size=2,
        reconfigure_handles=("H0", "H1"),
    )
    assert m.encode_quorum_request(member) == TORCHFT_REQUEST


members = st.builds(
    m.QuorumMember,
    replica_id=st.text(min_size=1, max_size=40),
    address=st.text(max_size=40),
    store_address=st.text(max_size=40),
    step=st.integers(-(2**63), 2**63 - 1),
    world_size=st.integers(0, m.MAX_WORLD_SIZE),
    shrink_only=st.booleans(),
    data=st.text(max_size=40),
    commit_failures=st.integers(-(2**63), 2**63 - 1),
    reconfigure_handles=st.lists(st.text(max_size=20), max_size=4).map(tuple),
)


@given(members)
def test_a_member_round_trips(member: m.QuorumMember) -> None:
    assert m.decode_quorum_request(m.encode_quorum_request(member)) == member


@given(st.lists(members, max_size=4), st.integers(0, 2**62), st.integers(0, 2**62))
def test_a_quorum_round_trips(participants: list[m.QuorumMember], qid: int, created: int) -> None:
    quorum = m.Quorum(quorum_id=qid, participants=tuple(participants), created_ns=created)
    assert m.decode_quorum_response(m.encode_quorum_response(quorum)) == quorum


@settings(max_examples=500)
@given(st.binary(max_size=200))
def test_any_bytes_are_a_request_or_a_message_error(buf: bytes) -> None:
    for decode in (m.decode_quorum_request, m.decode_heartbeat_request):
        try:
            decode(buf)
        except m.MessageError as exc:
            assert str(exc)


@settings(max_examples=300)
@given(st.binary(min_size=1, max_size=60), st.integers(0, len(TORCHFT_REQUEST) - 1))
def test_a_mangled_request_is_read_or_refused_never_crashes(junk: bytes, at: int) -> None:
    buf = TORCHFT_REQUEST[:at] + junk + TORCHFT_REQUEST[at + len(junk) :]
    try:
        m.decode_quorum_request(buf)
    except m.MessageError as exc:
        assert "LighthouseQuorumRequest" in str(exc)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _key(number: int, wire: int) -> bytes:
    return bytes([(number << 3) | wire])


def _len(number: int, payload: bytes) -> bytes:
    return _key(number, 2) + _varint(len(payload)) + payload


@pytest.mark.parametrize(
    ("buf", "says"),
    [
        (b"", "missing requester"),
        (_len(1, b""), "replica_id is empty"),
        (_len(1, _len(1, b"\xff\xfe")), "replica_id is not UTF-8"),
        (_len(1, _key(1, 0) + b"\x01"), "replica_id (field 1) must be length-delimited"),
        (_len(1, _len(1, b"a") + _len(4, b"x")), "step (field 4) must be varint"),
        (_len(1, _len(1, b"a") + _key(4, 0) + b"\xff" * 11), "longer than 10 bytes"),
        (_len(1, _len(1, b"a") + _key(4, 0) + b"\xff"), "ends inside a varint"),
        (_key(1, 2) + b"\x7f" + b"\x00", "a length of 127 bytes, but 1 bytes are left"),
        (_key(1, 2) + b"\xff\xff\xff\xff\x0f", "but 0 bytes are left"),
        (_len(1, _len(1, b"a") + _key(5, 0) + b"\xff\xff\xff\xff\x7f"), "world_size is"),
        (_len(1, _len(1, b"a") + _key(7, 3)), "wire type 3"),
        (b"\x00", "field number 0"),
        (_len(1, _key(2, 1) + b"\x00" * 3), "ends inside a 64-bit value"),
        (_len(1, _len(1, b"y" * 600)), "replica_id has 600 bytes, more than the 512 allowed"),
    ],
)
def test_each_malformed_request_is_refused_naming_what_is_wrong(buf: bytes, says: str) -> None:
    with pytest.raises(m.MessageError) as raised:
        m.decode_quorum_request(buf)
    assert says in str(raised.value), str(raised.value)


def test_a_field_over_its_bound_is_refused() -> None:
    long = _len(9, b"h" * (m.MAX_HANDLE_BYTES + 1))
    with pytest.raises(m.MessageError, match="reconfigure_handles has"):
        m.decode_member(_len(1, b"a") + long)
    many = (_len(9, b"h")) * (m.MAX_HANDLES + 1)
    with pytest.raises(m.MessageError, match="more than the 4096 allowed"):
        m.decode_member(_len(1, b"a") + many)


def test_unknown_fields_are_skipped_as_proto3_skips_them() -> None:
    extra = _len(15, b"future") + _key(14, 0) + b"\x05" + _key(13, 5) + b"\x00" * 4
    member = m.decode_member(_len(1, b"a") + extra + _key(6, 0) + b"\x01")
    assert member.replica_id == "a" and member.shrink_only


def test_a_heartbeat_names_its_replica() -> None:
    assert m.decode_heartbeat_request(m.encode_heartbeat_request("r:1")) == "r:1"
    with pytest.raises(m.MessageError, match="a heartbeat names its replica"):
        m.decode_heartbeat_request(b"")
