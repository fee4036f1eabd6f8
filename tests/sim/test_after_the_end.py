"""A run that is over stays as it was: any schedule of late, stray and duplicate arrivals after
its end (finished, ended by the operator, or deleted) leaves its history byte-identical.

The history is everything replay derives for the group: its projection rows (views,
proposals, rank states, its creation and its ending), ``GET /groups/{group}``'s document, the
fold's snapshot of the group and the snapshots of the facets that keep state per group. Each arrival goes the way the host
sends it (the fold's pre-check, then ``repeat_of``, then the step), or, drawn as *raced*,
straight into the step as if it had been checked before the end and appended after it: either
way it is refused with ``group_ended`` and changes nothing. Records at chosen times, no sleep.
"""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from foldplane.coordinator.fold.effects import Effect, Refused
from foldplane.coordinator.fold.projections import rows_for
from foldplane.facets.epochs.inputs import complete_plan
from foldplane.wire.codes import GROUP_ENDED
from tests.fold.script import Script

WS = 3
KINDS = (
    "join",
    "heartbeat",
    "links",
    "ack",
    "exit",
    "death_reported",
    "proposal",
    "group_created",
    "group_ended",
    "epoch_plan",
    "progress",
    "tick",
)
#: the run's own incarnations (late arrivals), a replacement's, and strangers (strays)
INCARNATIONS = ("g-0-a", "g-1-a", "g-2-a", "g-2-b", "stray-1", "stray-2")

arrival = st.tuples(
    st.sampled_from(KINDS),
    st.integers(-1, WS),  # a rank, out of range at both ends too
    st.sampled_from(INCARNATIONS),
    st.integers(0, 3),  # a version, an epoch, a variant
    st.integers(0, 400),  # seconds after the end
    st.booleans(),  # raced: stepped without the host's pre-check
)
#: an arrival, or ("dup", i): the i-th earlier arrival again
schedule = st.lists(st.one_of(arrival, st.tuples(st.just("dup"), st.integers(0, 40))), max_size=40)


def payload_of(kind: str, rank: int, inc: str, n: int) -> dict[str, Any]:
    if kind in ("join", "exit"):
        return {"incarnation": inc}
    if kind == "heartbeat":
        return {"incarnation": inc} if n % 2 else {"incarnation": inc, "version": n}
    if kind == "links":
        return {"incarnation": inc, "peers": {str((rank + 1) % WS): "down"}, "self_ready": n > 0}
    if kind == "ack":
        return {"incarnation": inc, "version": n}
    if kind == "death_reported":
        return {"incarnation": inc, "reporter": "launcher"} if n % 2 else {}
    if kind == "proposal":
        body: dict[str, Any] = {"op": ("activate", "deactivate")[n % 2], "ranks": [rank]}
        return {**body, "idempotency_key": f"k{n}"} if n > 1 else body
    if kind == "group_created":
        return {"world_size": WS if n < 2 else WS + 1, "config": {}}
    if kind == "group_ended":
        return {} if n % 2 else {"reason": f"again {n}"}
    if kind == "epoch_plan":
        return complete_plan({"epoch": n, "dataset_size": 90})
    if kind == "progress":
        return {"incarnation": inc, "epoch": 0, "assignment": 1 + n, "processed": 5 * n}
    return {}


def run_to_its_end(how: str, replaced: bool, planned: bool) -> tuple[Script, list[Effect]]:
    """A run of group ``g`` (3 ranks) to its end: ``finished`` (every rank exits), ``ended``
    (by the operator), ``deleted`` (ended and deleted) or ``finished+deleted``; with a death
    and a replacement before it, and an open epoch, when drawn."""
    s = Script()
    effects = s.form(world_size=WS)
    if planned:
        effects += s.at(1).record(
            "epoch_plan", "g", None, complete_plan({"epoch": 0, "dataset_size": 90})
        )
    if replaced:
        effects += s.at(2).death(2, reporter="launcher")
        effects += s.join(2, incarnation="g-2-b")
        effects += s.links(2)
        for r in range(WS):
            effects += s.links(r)
        status = s.m.group_status("g")
        if status["change_in_flight"] is not None:
            effects += s.ack_all()
    s.at(5)
    if how.startswith("finished"):
        for r in range(WS):
            effects += s.exit(r)
    else:
        effects += s.record("group_ended", "g", None, {"reason": "operator"})
    if how.endswith("deleted"):
        effects += s.record("group_ended", "g", None, {"delete": True})
    assert s.m.group_status("g")["ended"] is not None, how
    return s, effects


def history(s: Script, effects: list[Effect]) -> bytes:
    """What replay derives for ``g``: its rows (the last write of each key), its status, the
    fold's and the facets' snapshots, in one byte string."""
    rows: dict[tuple[str, int], Any] = {}
    for effect in effects:
        for row in rows_for(effect):
            if row.group == "g":
                rows[(row.kind, row.seq)] = row.doc
    snapshot = s.m.snapshot()
    return msgspec.json.encode(
        [
            sorted(rows.items(), key=lambda item: item[0]),
            s.m.group_status("g"),
            snapshot["groups"],
            snapshot["proposals"],
            # the facets that keep state per group (torchft's and torchrun's name none)
            {name: snapshot["facets"][name] for name in ("epochs", "refits")},
        ]
    )


@settings(max_examples=150, deadline=None)
@given(
    how=st.sampled_from(("finished", "ended", "deleted", "finished+deleted")),
    replaced=st.booleans(),
    planned=st.booleans(),
    arrivals=schedule,
)
def test_nothing_after_the_end_changes_the_run(how, replaced, planned, arrivals):
    s, effects = run_to_its_end(how, replaced, planned)
    before = history(s, effects)
    t0 = 5.0
    seen: list[tuple] = []
    for item in arrivals:
        if item[0] == "dup":
            if not seen:
                continue
            item = seen[item[1] % len(seen)]
        seen.append(item)
        kind, rank, inc, n, after_s, raced = item
        raced = raced and kind != "group_ended"  # the operator's ending is checked serially
        payload = payload_of(kind, rank, inc, n)
        group = None if kind == "tick" else "g"
        named = (
            rank
            if kind in ("join", "heartbeat", "links", "ack", "exit", "death_reported", "progress")
            else None
        )
        s.at(t0 + after_s)
        if kind not in ("tick", "group_ended"):
            refused = s.m.check(kind, group, named, payload)
            assert refused is not None and refused.code == GROUP_ENDED, (item, refused)
            assert "another group name" in refused.message
        if not raced and (
            s.m.check(kind, group, named, payload) is not None
            or s.m.repeat_of(kind, group, named, payload) is not None
        ):
            continue  # the host answers it without appending anything
        assert kind != "group_ended", "ending it again is answered with the ending"
        stepped = s.record(kind, group, named, payload)
        for effect in stepped:
            assert isinstance(effect, Refused) and effect.code == GROUP_ENDED, (item, effect)
        effects += stepped
    assert history(s, effects) == before


def test_twin_a_running_group_is_changed_by_the_same_arrivals():
    """The same kinds of arrival change a run that is not over, so the property above is not
    true of every group by construction."""
    s = Script()
    effects = s.form(world_size=WS)
    before = history(s, effects)
    s.at(5)
    effects += s.exit(0)
    effects += s.join(0, incarnation="stray-1")
    assert history(s, effects) != before
