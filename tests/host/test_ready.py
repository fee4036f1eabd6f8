"""The Ready value of a batch's effects (coordinator/host/ready.py), from the real fold's effects."""

from __future__ import annotations

import msgspec

from foldplane.coordinator.fold.effects import ProposalResolved, Refused, ViewCommitted, ViewPrepare
from foldplane.coordinator.host.journal import UpdateJournals, decoded
from foldplane.coordinator.host.ready import HostState, ReadyBuilder, publish
from foldplane.facets.epochs.protocol import DataAssignmentUpdate, DataMovesUpdate
from tests.fold.script import Script, of


def formed(world_size: int = 2) -> tuple[Script, list]:
    script = Script()
    effects = script.form("g", world_size)
    return script, effects


def test_a_formed_group_asks_for_its_rows_size_updates_and_one_commit() -> None:
    script, effects = formed()
    builder = ReadyBuilder(HostState(), {})
    ready = builder.ready(script.offset, effects, projected=0)
    assert ready.offset == script.offset
    assert ready.world_sizes == {"g": 2}
    assert ready.committed == ["g"]
    assert ("group", "g", 0) in ready.rows and ("view", "g", 1) in ready.rows
    assert {("rank_state", "g", 0), ("rank_state", "g", 1)} <= set(ready.rows)
    # the prepare, then the commit, on the group's journal, in offset order
    group_updates = [u for g, rank, u in ready.updates if rank is None]
    assert [u.offset for u in group_updates] == sorted(u.offset for u in group_updates)
    assert len(group_updates) == 2
    prepare = one_of(effects, ViewPrepare)
    commit = one_of(effects, ViewCommitted)
    assert [u.offset for u in group_updates] == [prepare.offset, commit.offset]
    # each rank's own state on its own journal
    assert {rank for _, rank, _ in ready.updates if rank is not None} == {0, 1}
    assert ready.resolved == [] and ready.refused == {}
    # the state the next updates are built on: view 1 is the base, nothing is in flight
    assert builder.views["g"].version == 1
    assert builder.state.in_flight == {}
    assert builder.state.world_sizes == {"g": 2}
    assert set(builder.state.rank_states["g"]) == {"0", "1"}


def test_no_rows_for_what_the_log_already_holds() -> None:
    script, effects = formed()
    ready = ReadyBuilder(HostState(), {}).ready(script.offset, effects, projected=script.offset)
    assert ready.rows == {}
    assert ready.updates  # the updates do not depend on the rows


def test_a_change_in_flight_is_named_until_it_commits() -> None:
    script, effects = formed(world_size=3)
    builder = ReadyBuilder.for_machine(script.m, HostState())
    assert builder.views["g"].version == 1  # a restored builder starts from the fold's view
    proposed = script.propose("deactivate", [2])
    prepared = builder.ready(script.offset, proposed, projected=0)
    [prepare] = of(proposed, ViewPrepare)
    assert builder.state.in_flight["g"].version == prepare.version == 2
    # a resync names the view and the change in flight, in offset order
    resync = builder.state.resync(script.m, "g", [0], view=None)
    assert [u.offset for u in resync] == sorted(u.offset for u in resync)
    assert builder.state.in_flight["g"] in resync
    # ... and leaves out the full view a reader already holds
    held = builder.state.resync(script.m, "g", [0], view=1)
    assert [u for u in resync if u not in held] == [resync[0]]  # the view, first by offset
    assert len(held) == len(resync) - 1
    assert prepared.resolved == []
    acked = script.ack_all("g")
    done = builder.ready(script.offset, acked, projected=0)
    assert builder.state.in_flight == {}
    assert done.committed == ["g"]
    [resolved] = of(acked, ProposalResolved)
    assert done.resolved == [resolved.proposal]
    assert resolved.proposal.status in {"applied", "applied_with_dropped_ranks"}


def test_an_input_fenced_while_stepping_is_refused_at_its_offset() -> None:
    script, _ = formed()
    # a new incarnation of rank 0 while the current one is healthy
    fenced = script.join(0, incarnation="g-0-b")
    [refused] = of(fenced, Refused)
    ready = ReadyBuilder.for_machine(script.m, HostState()).ready(
        script.offset, fenced, projected=0
    )
    assert ready.refused == {script.offset: refused}
    assert refused.code == "rank_busy"
    assert ready.updates == [] and ready.rows == {}


def test_publish_hands_the_updates_to_the_journals_visible_at_the_wake() -> None:
    script, effects = formed()
    ready = ReadyBuilder(HostState(), {}).ready(script.offset, effects, projected=0)
    journals = UpdateJournals()
    publish(journals, ready)
    assert journals.entries_since("g", [0], 0) == []  # nothing visible before the wake
    journals.wake()
    got = journals.entries_since("g", [0], 0)
    assert got
    mine = [(g, u) for g, rank, u in ready.updates if rank in (None, 0)]
    assert [bytes(raw) for _, raw in got] == [msgspec.json.encode(u) for _, u in mine]
    assert [msgspec.to_builtins(decoded(raw)) for _, raw in got] == [
        msgspec.to_builtins(u) for _, u in mine
    ]


def one_of(effects: list, cls: type):
    [found] = of(effects, cls)
    return found


def test_a_view_change_sends_its_moves_once_and_a_resync_each_rank_its_whole_part() -> None:
    from foldplane.facets.epochs.inputs import complete_plan

    script, effects = formed(world_size=4)
    builder = ReadyBuilder(HostState(), {})
    builder.ready(script.offset, effects, projected=0)
    plan = {"epoch": 0, "dataset_size": 1000, "lookahead": 0}
    planned = builder.ready(
        script.offset, script.record("epoch_plan", "g", None, complete_plan(plan)), projected=0
    )
    # the first split: each rank's part on its own journal
    assert sorted(r for _, r, u in planned.updates if u.type == "data_assignment") == [
        0,
        1,
        2,
        3,
    ]
    payload = {"incarnation": script.inc(2), "epoch": 0, "assignment": 1, "processed": 100}
    builder.ready(script.offset, script.record("progress", "g", 2, payload), projected=0)
    out = script.death(2)
    out += script.at(1).tick()
    out += script.ack_all()
    ready = builder.ready(script.offset, out, projected=0)
    data = [(rank, u) for _, rank, u in ready.updates if u.type.startswith("data_")]
    [(rank, update)] = data  # one update, on the group's journal: the moves, not the parts
    assert rank is None and isinstance(update, DataMovesUpdate) and update.reported == (2,)
    assert update.moves == ((2, 0, 600, 50), (2, 1, 650, 50), (2, 3, 700, 50))
    row = next(r for k, r in ready.rows.items() if k[0] == "assignment")
    assert "ranges" not in row.doc and row.doc["moves"] == [list(m) for m in update.moves]
    # a resync: each rank's whole part, as the fold holds it, as of the latest decision
    e = script.m.facet("epochs").epoch("g")
    parts = {
        u.rank: u
        for u in builder.state.resync(script.m, "g", [0, 2], view=None)
        if isinstance(u, DataAssignmentUpdate)
    }
    assert parts[0].assignment == parts[2].assignment == e.assignment == 2
    assert parts[0].processed == 0 and parts[0].remaining == ((0, 250), (600, 50))
    assert parts[2].processed == 100 and parts[2].remaining == ()
    assert parts[0].offset == e.decided
