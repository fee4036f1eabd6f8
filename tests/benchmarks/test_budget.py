"""The latency budget's phase arithmetic, fed chosen timestamps."""

from __future__ import annotations

import pytest

from foldplane.benchmarks.budget import budget, log_marks, phases

ORDER = ("sent", "appended", "acked", "ran")


def test_phases_are_the_gaps_between_consecutive_marks_then_the_total() -> None:
    got = phases({"sent": 10.0, "appended": 10.002, "acked": 10.012, "ran": 10.05}, ORDER)
    names = [n for n, _ in got]
    assert names == ["sent -> appended", "appended -> acked", "acked -> ran", "total"]
    assert [round(ms, 6) for _, ms in got] == [2.0, 10.0, 38.0, 50.0]


def test_a_mark_out_of_order_shows_as_a_negative_phase() -> None:
    got = dict(phases({"sent": 1.0, "appended": 0.999, "acked": 1.0, "ran": 1.0}, ORDER))
    assert got["sent -> appended"] == pytest.approx(-1.0)


def test_a_missing_mark_is_named() -> None:
    with pytest.raises(KeyError, match="'acked'"):
        phases({"sent": 1.0, "appended": 1.0, "ran": 1.0}, ORDER)


def test_budget_takes_each_phase_median_over_trials() -> None:
    trials = [
        {"sent": 0.0, "appended": 0.001, "acked": 0.011, "ran": 0.02},
        {"sent": 0.0, "appended": 0.003, "acked": 0.005, "ran": 0.03},
        {"sent": 0.0, "appended": 0.002, "acked": 0.012, "ran": 0.04},
    ]
    rows = {name: med for name, med, _ in budget(trials, ORDER)}
    assert rows["sent -> appended"] == pytest.approx(2.0)
    assert rows["appended -> acked"] == pytest.approx(10.0)
    assert rows["total"] == pytest.approx(30.0)
    with pytest.raises(ValueError, match="at least one trial"):
        budget([], ORDER)


def _event(offset: int, ts_ms: int, kind: str, version: int | None = None) -> dict:
    payload = {} if version is None else {"version": version}
    return {"offset": offset, "ts": ts_ms * 1_000_000, "kind": kind, "payload": payload}


def test_log_marks_take_the_acks_of_the_view_the_trigger_started() -> None:
    events = [
        _event(5, 1000, "ack", 2),  # an older barrier's ACK
        _event(9, 2000, "proposal"),
        _event(10, 2003, "heartbeat"),
        _event(11, 2010, "ack", 3),
        _event(12, 2015, "ack", 2),  # a late ACK of an older version
        _event(13, 2020, "ack", 3),
    ]
    views = [{"version": 2, "offset": 6, "ts": 0}, {"version": 3, "offset": 13, "ts": 2020 * 10**6}]
    version, marks = log_marks(events, views, 9)
    assert version == 3
    assert marks == {
        "trigger": 2.0,
        "first ACK appended": 2.01,
        "last ACK appended": 2.02,
        "view committed": 2.02,
    }


def test_log_marks_name_what_is_missing() -> None:
    with pytest.raises(KeyError, match="offset 4"):
        log_marks([_event(9, 1, "proposal")], [], 4)
    with pytest.raises(KeyError, match="no view committed after offset 9"):
        log_marks([_event(9, 1, "proposal")], [], 9)
