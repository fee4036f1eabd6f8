"""``fencing.current_beat`` and ``fencing.current_ack``, the fast paths of ``refusal`` for
heartbeats and ACKs: each accepts only what the full checks (``checked_refusal``) accept, in
every state a group passes through, and each does accept the ordinary input, so the fast path
is the one taken. ``beats_not_current`` gives ``current_beat``'s verdicts for many beats."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from foldplane.coordinator.fold.fencing import (
    beats_not_current,
    checked_refusal,
    current_ack,
    current_beat,
    refusal,
)
from tests.fold.script import Script

WS = 3
INCARNATIONS = ["g-0-a", "g-1-a", "g-2-a", "g-1-b", "g-0-b", "", "x" * 300]


def _states() -> list[tuple[str, Script]]:
    """A group through joins, a view, exits, a replacement, a death, a timeout and rejoins,
    and one whose formation failed; each state is a fresh Script replayed up to that step."""
    steps: list[tuple[str, Any]] = [
        ("create", lambda s: s.create("g", WS, heartbeat_timeout_s=1.0)),
        *[(f"join {r}", lambda s, r=r: s.join(r)) for r in range(WS)],
        *[(f"links {r}", lambda s, r=r: s.links(r)) for r in range(WS)],
        ("ack 0", lambda s: s.ack(0, 1)),
        ("ack all", lambda s: s.ack_all()),
        ("links 1 down 2", lambda s: s.links(1, down=(2,))),
        ("window passes", lambda s: (s.at(0.5), s.tick())),
        ("ack 1 of the change", lambda s: s.ack(1, s.m._groups["g"].change.version)),
        ("exit 2", lambda s: s.exit(2)),
        ("rejoin 2", lambda s: s.join(2)),
        ("replace 1", lambda s: s.join(1, incarnation="g-1-b")),
        ("death 0", lambda s: s.death(0)),
        ("timeout", lambda s: (s.at(30.0), s.tick())),
        ("rejoin 0 anew", lambda s: s.join(0, incarnation="g-0-b")),
    ]
    states = []
    for upto in range(len(steps) + 1):
        script = Script()
        for _, step in steps[:upto]:
            step(script)
        states.append((steps[upto - 1][0] if upto else "nothing", script))
    failed = Script()
    failed.create("g", WS, formation_timeout_s=1.0)
    failed.join(0)
    failed.at(5.0)
    failed.tick()
    states.append(("formation failed", failed))
    return states


STATES = _states()

versions = st.one_of(
    st.none(), st.integers(-3, 3), st.integers(0, 2**63), st.booleans(), st.floats(), st.text()
)
others = st.one_of(
    st.dictionaries(st.text(max_size=12), st.one_of(st.none(), st.integers(), st.text())),
    st.one_of(st.none(), st.integers(), st.text(), st.lists(st.integers())),
)


@st.composite
def inputs(draw: st.DrawFn) -> tuple[str, Script, str | None, Any, Any]:
    """A state, and a heartbeat's group, rank and payload, mostly near the ordinary beat: a
    rank in range naming an incarnation the group knows (its own, another rank's, an old one),
    with a version of any JSON type; sometimes anything at all."""
    name, script = draw(st.sampled_from(STATES))
    g = script.m._groups.get("g")
    known = [r.incarnation for r in g.ranks if r.incarnation] if g is not None else []
    group = draw(st.sampled_from(["g", "g", "g", "h", None]))
    rank = (
        draw(st.integers(0, WS - 1))
        if draw(st.integers(0, 3))
        else draw(st.one_of(st.integers(-2, WS + 1), st.none(), st.booleans()))
    )
    if draw(st.booleans()):
        payload: Any = draw(others)
    else:
        pick = known if known and draw(st.booleans()) else known + INCARNATIONS
        payload = {"incarnation": draw(st.sampled_from(pick))}
        if draw(st.booleans()):
            payload["version"] = draw(versions)
        if draw(st.integers(0, 9)) == 0:
            payload["ranks"] = draw(st.one_of(st.text(), st.lists(st.integers(0, 5))))
    return name, script, group, rank, payload


@settings(max_examples=4000, deadline=None)
@given(case=inputs())
def test_the_fast_path_accepts_only_what_the_checks_accept(case) -> None:
    name, script, group, rank, payload = case
    m = script.m
    args = (m._groups, m._proposals, m._now, "heartbeat", group, rank, payload)
    checked = checked_refusal(*args)
    fast = current_beat(m._groups, group, rank, payload)
    if fast:
        assert checked is None, (name, group, rank, payload, checked)
    assert refusal(*args) == checked
    if group is not None:  # the verdict for many beats at once is the same, beat by beat
        many = beats_not_current(m._groups, group, [rank, rank], [payload, payload])
        assert many == ([] if fast else [0, 1])


@settings(max_examples=4000, deadline=None)
@given(case=inputs())
def test_the_ack_fast_path_accepts_only_what_the_checks_accept(case) -> None:
    name, script, group, rank, payload = case
    m = script.m
    g = m._groups.get("g")
    has_version = isinstance(payload, dict) and "version" in payload
    if has_version and g is not None and g.change and payload["version"] == 1:
        payload = {**payload, "version": g.change.version}  # often the version being prepared
    args = (m._groups, m._proposals, m._now, "ack", group, rank, payload)
    checked = checked_refusal(*args)
    if current_ack(m._groups, group, rank, payload):
        assert checked is None, (name, group, rank, payload, checked)
    assert refusal(*args) == checked


def test_an_ordinary_beat_takes_the_fast_path() -> None:
    """In every state, each rank's beat as its current incarnation, with and without the
    view version, is accepted by the fast path exactly when the checks accept it; and that
    happens in most states (the fast path is not a dead branch)."""
    taken = 0
    for name, script in STATES:
        m = script.m
        g = m._groups.get("g")
        if g is None:
            continue
        for rank in range(WS):
            inc = g.ranks[rank].incarnation
            for payload in ({"incarnation": inc}, {"incarnation": inc, "version": 1}):
                fast = current_beat(m._groups, "g", rank, payload)
                checked = checked_refusal(
                    m._groups, m._proposals, m._now, "heartbeat", "g", rank, payload
                )
                assert fast == (checked is None), (name, rank, payload, checked)
                taken += fast
    assert taken >= 30


def test_an_ordinary_ack_takes_the_fast_path() -> None:
    """In every state with a change in flight, each rank's ACK of the version being prepared,
    as its current incarnation, is accepted by the fast path exactly when the checks accept
    it; and that happens in several states."""
    taken = 0
    for name, script in STATES:
        m = script.m
        g = m._groups.get("g")
        if g is None or g.change is None:
            continue
        for rank in range(WS):
            payload = {"incarnation": g.ranks[rank].incarnation, "version": g.change.version}
            fast = current_ack(m._groups, "g", rank, payload)
            checked = checked_refusal(m._groups, m._proposals, m._now, "ack", "g", rank, payload)
            assert fast == (checked is None), (name, rank, payload, checked)
            taken += fast
    assert taken >= 6
