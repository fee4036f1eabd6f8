"""The retention rule, one guard at a time: each test has a twin that differs in that guard
only, so a later change cannot disable one guard without a test failing."""

from __future__ import annotations

from typing import Any

import pytest

from foldplane.coordinator.fold.effects import RankState, Refused
from foldplane.coordinator.fold.registry import all_kinds
from foldplane.coordinator.host.retention import (
    RetainPolicy,
    has_down_evidence,
    heartbeat_class,
    parse_policy,
    removable,
)
from foldplane.eventlog.record import Record


def rec(kind: str, payload: dict[str, Any] | None = None) -> Record:
    return Record(7, 1, 1, kind, "g", 0, payload or {}, 0)


REFUSED = Refused(
    group="g", rank=0, kind="heartbeat", code="stale_incarnation", message="x", offset=7
)
STATE = RankState(
    group="g", rank=1, state="OFFLINE", incarnation="a", rank_epoch=1, reason="timed out", offset=7
)
UP = {"incarnation": "a", "peers": {"1": "up", "2": "up"}, "self_ready": True}


@pytest.mark.parametrize("kind", sorted(heartbeat_class()))
def test_a_heartbeat_class_record_that_decided_nothing_goes(kind: str) -> None:
    assert removable(rec(kind, UP if kind == "links" else {}), [])


@pytest.mark.parametrize("kind", sorted(all_kinds() - heartbeat_class()))
def test_twin_every_other_kind_stays_even_when_its_step_produced_nothing(kind: str) -> None:
    assert not removable(rec(kind), [])


def test_a_refused_heartbeat_goes() -> None:
    assert removable(rec("heartbeat", {"incarnation": "old"}), [REFUSED])


def test_twin_a_heartbeat_class_record_whose_step_had_an_effect_stays() -> None:
    assert not removable(rec("tick"), [STATE])  # a tick that timed a rank out
    assert not removable(rec("links", UP), [REFUSED, STATE])


@pytest.mark.parametrize(
    "payload",
    [
        {"incarnation": "a", "peers": {"1": "up", "2": "down"}, "self_ready": True},
        {"incarnation": "a", "down": [2], "self_ready": True},
        {"incarnation": "a", "peers": {}, "failed_ranks_hint": [3], "self_ready": True},
        {"incarnation": "a", "peers": {}, "self_ready": False},
    ],
    ids=["peers-down", "down-set", "hint", "not-self-ready"],
)
def test_a_report_with_down_evidence_stays_even_with_no_effect(payload: dict[str, Any]) -> None:
    assert has_down_evidence(payload)
    assert not removable(rec("links", payload), [])


@pytest.mark.parametrize(
    "payload",
    [
        {"incarnation": "a", "peers": {"1": "up", "2": "up"}, "self_ready": True},
        {"incarnation": "a", "down": [], "self_ready": True},
        {"incarnation": "a", "peers": {}, "failed_ranks_hint": [], "self_ready": True},
        {"incarnation": "a", "peers": {}, "self_ready": True},
    ],
    ids=["peers-up", "empty-down-set", "empty-hint", "self-ready"],
)
def test_twin_the_same_report_without_down_evidence_goes(payload: dict[str, Any]) -> None:
    assert not has_down_evidence(payload)
    assert removable(rec("links", payload), [])


def test_a_policy_is_a_record_count_or_a_duration() -> None:
    assert parse_policy("1000000") == RetainPolicy(keep_records=1_000_000)
    assert parse_policy("0") == RetainPolicy(keep_records=0)
    assert parse_policy("1h") == RetainPolicy(keep_ns=3600 * 10**9)
    assert parse_policy("1.5m") == RetainPolicy(keep_ns=90 * 10**9)
    assert parse_policy("7d").keep_ns == 7 * 86400 * 10**9
    for bad in ("", "1w", "-5", "h", "10 records"):
        with pytest.raises(ValueError, match="neither a record count"):
            parse_policy(bad)
