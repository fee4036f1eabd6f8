"""Poison notices: the bytes every member of a failed view reads from the store."""

from __future__ import annotations

import pytest

from foldplane.agent.dataplane.poison import PoisonNotice


def test_a_notice_round_trips() -> None:
    notice = PoisonNotice(7, by=2, named=(3,), reason="all_reduce failed: connection reset")
    assert PoisonNotice.decode(notice.encode()) == notice


def test_both_ends_of_a_link_blame_each_other_and_bystanders_adopt_the_senders_names() -> None:
    notice = PoisonNotice(7, by=0, named=(2,), reason="injected")
    assert notice.blamed_by(2) == (0,)  # the named peer blames the sender
    assert notice.blamed_by(1) == (2,)  # a bystander adopts the sender's names
    assert PoisonNotice(7, by=0, named=(), reason="timeout").blamed_by(1) == ()


@pytest.mark.parametrize(
    "raw",
    [b"", b"not json", b'{"version": 1}', b'{"version": "x", "by": 0, "named": [], "reason": ""}'],
)
def test_a_damaged_notice_is_refused_with_its_bytes(raw: bytes) -> None:
    with pytest.raises(ValueError, match="malformed poison notice"):
        PoisonNotice.decode(raw)


def test_a_watcher_reads_a_damaged_notice_as_a_failure_blaming_nobody() -> None:
    notice = PoisonNotice.read(3, b"not json")
    assert (notice.version, notice.by, notice.named) == (3, -1, ())
    assert notice.reason.startswith("unreadable poison notice (malformed poison notice b'not json'")
    good = PoisonNotice(3, by=1, named=(2,), reason="timeout")
    assert PoisonNotice.read(3, good.encode()) == good
