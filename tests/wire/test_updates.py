"""Typed updates (wire.updates): on the wire they are exactly what protocol 2 always sent.

The oracle is ``tests/wire/v2_dicts.py``, the dict builders as protocol 2 wrote them; the fold
outputs are real: a script drives the real fold through formation, a death, an epoch (its plan,
a decision's moves, a replacement's part, its end), a failure budget's shutdown and a refit
(its epochs, bootstrap and transfer)."""

from __future__ import annotations

import json
import typing
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from foldplane.agent import facets as worker_facets
from foldplane.coordinator.fold import projections
from foldplane.coordinator.fold.effects import (
    Effect,
    RankState,
    ShutdownWithSave,
    View,
    ViewCommitted,
    ViewPrepare,
)
from foldplane.coordinator.host.ready import HostState, ReadyBuilder
from foldplane.facets.epochs import protocol as epochs_protocol
from foldplane.facets.epochs import updates as epoch_updates
from foldplane.facets.epochs.effects import (
    AssignmentChanged,
    EpochCompleted,
    EpochPlanned,
    PartSent,
)
from foldplane.facets.epochs.inputs import complete_plan
from foldplane.facets.refits import updates as refit_updates
from foldplane.facets.refits.effects import (
    RefitBootstrap,
    RefitEpochChanged,
    TransferChanged,
)
from foldplane.wire import protocol, reference
from foldplane.wire import updates as wire_updates
from foldplane.wire.updates import AgentUpdate, UpdateError
from tests.fold.script import Script, of, one
from tests.fold.test_refits import event, join_all, refit_spec
from tests.wire import v2_dicts as v2

#: What a worker reads: the protocol's updates and those the facets of foldplane declare.
UPDATE_TYPES = worker_facets.UPDATES.types
decode_updates = worker_facets.UPDATES.decode_updates

QUIET = {"heartbeat_timeout_s": 3600.0}


def fold_outputs(s: Script | None = None) -> list[Effect]:
    """Every kind of effect that becomes an agent update, from the real fold."""
    s = s or Script()
    out = s.form("train", world_size=2, **QUIET)
    out += s.form("gen", world_size=4, **QUIET)
    # a refit between them: its epoch waits, every slot joins, the bootstrap, a transfer
    out += s.record("refit_created", None, None, refit_spec())
    out += join_all(s)
    out += event(s, "refit_bootstrap", "train", 0, bootstrap={"store": "h:1", "prefix": "e1"})
    started = event(s, "transfer", "train", 0, key="step-1")
    out += started
    transfer = one(started, TransferChanged)
    for group, size in (("train", 2), ("gen", 4)):
        for r in range(size):
            out += event(
                s,
                "transfer_status",
                group,
                r,
                transfer=transfer.transfer,
                attempt=transfer.attempt,
                status="done",
            )
    # an epoch of "gen": the plan, rank 2 reads some of its part and dies (a view change and
    # its moves, which also move the refit's epoch), its replacement is sent its part whole
    out += s.record("epoch_plan", "gen", None, complete_plan({"epoch": 0, "dataset_size": 1000}))
    out += progress(s, "gen", 2, 100)
    out += progress(s, "gen", 0, 20)
    out += s.at(1).death(2, "gen")
    out += s.at(2).tick()
    out += s.ack_all("gen")
    out += s.join(2, incarnation="gen-2-b", group="gen")
    # a small epoch read to its end
    out += s.form("e", world_size=2, **QUIET)
    out += s.record("epoch_plan", "e", None, complete_plan({"epoch": 0, "dataset_size": 8}))
    out += progress(s, "e", 0, 4) + progress(s, "e", 1, 4)
    # a failure budget of one: the death of a rank ends the group
    out += s.form("s", world_size=3, max_failure=1, **QUIET)
    out += s.at(3).death(2, "s")
    out += s.at(4).tick()
    return out


def progress(s: Script, group: str, rank: int, processed: int) -> list[Effect]:
    e = s.m.facet("epochs").epoch(group)
    assert e is not None
    payload = {
        "incarnation": s.inc(rank, group),
        "epoch": e.number,
        "assignment": e.holdings[rank].assignment,
        "processed": processed,
    }
    return s.record("progress", group, rank, payload)


def _walk(effects: list[Effect], b: Any) -> list[Any]:
    """The updates the builders of ``b`` (a module or namespace with one builder per update,
    named as ``tests/wire/v2_dicts.py`` names them) give for ``effects``; each view also in
    full (``base: 0``, as a resync sends it)."""
    views: dict[str, View] = {}
    out: list[Any] = []
    for e in effects:
        if isinstance(e, ViewPrepare):
            out.append(
                b.prepare_update(
                    group=e.group,
                    version=e.version,
                    base=views.get(e.group),
                    active_ranks=e.active_ranks,
                    participants=e.participants,
                    ack_deadline_ts=e.ack_deadline_ts,
                    offset=e.offset,
                )
            )
        elif isinstance(e, ViewCommitted):
            out.append(b.view_update(views.get(e.view.group), e.view))
            out.append(b.view_update(None, e.view))
            views[e.view.group] = e.view
        elif isinstance(e, RankState):
            out.append(b.rank_state_update(e))
        elif isinstance(e, ShutdownWithSave):
            out.append(b.shutdown_update(e))
        elif isinstance(e, EpochPlanned):
            out.append(b.epoch_plan_update(e))
            out.extend(b.data_assignment_updates(e))
        elif isinstance(e, AssignmentChanged):
            out.append(b.data_moves_update(e))
        elif isinstance(e, PartSent):
            out.append(b.part_sent_update(e))
        elif isinstance(e, EpochCompleted):
            out.append(b.epoch_complete_update(e))
        elif isinstance(e, RefitEpochChanged):
            out.append(b.refit_epoch_update(e))
        elif isinstance(e, TransferChanged):
            out.append(b.transfer_update(e))
        elif isinstance(e, RefitBootstrap):
            out.append(b.refit_bootstrap_update(e))
    return out


#: today's builders, under the names of protocol 2's dict builders
TYPED = SimpleNamespace(
    prepare_update=protocol.prepare_update,
    view_update=protocol.view_update,
    rank_state_update=projections.rank_state_update,
    shutdown_update=projections.shutdown_update,
    epoch_plan_update=epoch_updates.epoch_plan_update,
    data_assignment_updates=epoch_updates.data_assignment_updates,
    data_moves_update=epoch_updates.data_moves_update,
    part_sent_update=epoch_updates.part_sent_update,
    epoch_complete_update=epoch_updates.epoch_complete_update,
    refit_epoch_update=refit_updates.refit_epoch_update,
    transfer_update=refit_updates.transfer_update,
    refit_bootstrap_update=refit_updates.refit_bootstrap_update,
)


def oracle(effects: list[Effect]) -> list[dict[str, Any]]:
    """The updates protocol 2's dict builders gave for ``effects``."""
    return _walk(effects, v2)


def typed(effects: list[Effect]) -> list[AgentUpdate]:
    """The updates the builders give for ``effects``, in the order of :func:`oracle`."""
    return _walk(effects, TYPED)


@pytest.fixture(scope="module")
def effects() -> list[Effect]:
    return fold_outputs()


def as_json(value: Any) -> Any:
    """A value as a reader of its JSON sees it."""
    return json.loads(msgspec.json.encode(value))


def test_the_scenario_sends_every_kind_of_update_with_its_optional_fields(effects) -> None:
    sent = oracle(effects)
    assert {u["type"] for u in sent} == set(UPDATE_TYPES)
    assert any(u.get("cause") == "death_reported" for u in sent if u["type"] == "rank_state")
    assert any("checkpoint_rank" in u for u in sent if u["type"] == "view_committed")
    assert any(u["absent"] for u in sent if u["type"] == "view_prepare")
    assert any(u["moves"] and u["reported"] for u in sent if u["type"] == "data_moves")
    assert {u["status"] for u in sent if u["type"] == "refit_epoch"} >= {"waiting", "admitted"}
    assert {u["status"] for u in sent if u["type"] == "transfer"} >= {"running", "completed"}


def test_every_update_of_protocol_2_decodes_into_its_struct_and_encodes_back_the_same(
    effects,
) -> None:
    """What today's coordinator sends, an agent of this install reads into the Struct of its
    ``type``, and the Struct's JSON is that update again, field for field."""
    sent = oracle(effects)
    typed = decode_updates(msgspec.json.encode(sent))
    assert [type(u) for u in typed] == [UPDATE_TYPES[u["type"]] for u in sent]
    for update, doc in zip(typed, sent, strict=True):
        assert as_json(update) == as_json(doc), doc["type"]
        assert update.type == doc["type"] and update.offset == doc["offset"]
    # decoded JSON (as an HTTP client holds it) gives the same values
    assert decode_updates(as_json(sent)) == typed


def test_an_update_of_a_type_this_reader_does_not_know_is_left_out() -> None:
    known = {"offset": 3, "type": "epoch_complete", "group": "g", "epoch": 0}
    newer = {"offset": 4, "type": "from_a_newer_revision", "group": "g"}
    assert decode_updates([known, newer]) == [
        epochs_protocol.EpochCompleteUpdate(offset=3, group="g", epoch=0)
    ]


@pytest.mark.parametrize(
    ("item", "words"),
    [
        ({"offset": 3, "type": "epoch_complete", "group": "g"}, ["epoch_complete", "epoch"]),
        ({"offset": "x", "type": "rank_state"}, ["rank_state"]),
        ({"offset": 3}, ["without a type"]),
    ],
)
def test_a_malformed_update_is_an_error_that_names_it(item: dict, words: list[str]) -> None:
    with pytest.raises(UpdateError) as raised:
        decode_updates([item])
    for word in words:
        assert word in str(raised.value)


def test_the_updates_that_name_their_reader() -> None:
    """``rank_state`` and ``data_assignment`` go to one rank's journal and name it; every other
    update is the group's (``refit_bootstrap`` goes to the members' journals but names none)."""
    named = {tag for tag, cls in UPDATE_TYPES.items() if "rank" in cls.__struct_fields__}
    assert named == {"rank_state", "data_assignment"}
    s = wire_updates.RankStateUpdate(
        offset=1, group="g", rank=3, state="HEALTHY", incarnation="i", rank_epoch=1, reason=""
    )
    assert wire_updates.addressed_rank(s) == 3
    assert (
        wire_updates.addressed_rank(
            epochs_protocol.EpochCompleteUpdate(offset=1, group="g", epoch=0)
        )
        is None
    )


def test_no_effect_that_becomes_an_update_is_left_out_of_the_scenario(effects) -> None:
    kinds = {type(e) for e in effects}
    for cls in (
        ViewPrepare,
        ViewCommitted,
        RankState,
        ShutdownWithSave,
        EpochPlanned,
        AssignmentChanged,
        PartSent,
        EpochCompleted,
        RefitEpochChanged,
        TransferChanged,
        RefitBootstrap,
    ):
        assert cls in kinds, cls.__name__
    assert of(effects, ShutdownWithSave)[0].reason == "max_failure_exceeded"


def test_each_builder_gives_the_struct_whose_json_is_what_protocol_2_sent(effects) -> None:
    """The coordinator of this install and an agent of the one before understand each other:
    every update built from the same fold outputs encodes to the same JSON, field for field."""
    built, sent = typed(effects), oracle(effects)
    assert [u.type for u in built] == [d["type"] for d in sent]
    for update, doc in zip(built, sent, strict=True):
        assert as_json(update) == as_json(doc), doc["type"]
        # and its wire form decodes to the same value
        assert decode_updates(msgspec.json.encode([update])) == decode_updates([as_json(doc)])


def test_what_the_host_publishes_and_a_resync_sends_is_typed_and_protocol_2s_json() -> None:
    """The real path: the host's ReadyBuilder over the fold's effects, and a resync of every
    group's ranks after them; no update is a dict, and each is JSON protocol 2 sent."""
    s = Script()
    effects = fold_outputs(s)
    builder = ReadyBuilder(HostState(), {})
    ready = builder.ready(s.offset, effects, projected=0)
    published = [u for _, _, u in ready.updates]
    resynced = [
        u
        for group, size in (("train", 2), ("gen", 4), ("e", 2), ("s", 3))
        for u in builder.state.resync(s.m, group, list(range(size)), None)
    ]
    # a resync sends each rank's part as the fold holds it now (protocol 2's data_assignment)
    parts = []
    for group in ("gen", "e"):
        e = s.m.facet("epochs").epoch(group)
        assert e is not None
        for rank, h in e.holdings.items():
            parts.append(
                v2.data_assignment_update(
                    group=group,
                    rank=rank,
                    epoch=e.number,
                    assignment=e.assignment,
                    processed=h.processed,
                    remaining=h.remaining_segments(),
                    offset=e.decided,
                )
            )
    sent = {json.dumps(as_json(d), sort_keys=True) for d in [*oracle(effects), *parts]}
    for update in published + resynced:
        assert isinstance(update, tuple(UPDATE_TYPES.values())), update
        assert json.dumps(as_json(update), sort_keys=True) in sent, update
    assert {u.type for u in published} == set(UPDATE_TYPES)
    assert {u.type for u in resynced} >= {"view_committed", "rank_state", "data_assignment"}


def _builders() -> dict[str, Any]:
    """Every function that builds an agent update: ``wire.protocol``'s, the fold's and the
    facets'."""
    found = {
        f"protocol.{name}": getattr(protocol, name) for name in ("view_update", "prepare_update")
    }
    for module in (projections, epoch_updates, refit_updates):
        for name, value in vars(module).items():
            defined_here = getattr(value, "__module__", None) == module.__name__
            if name.endswith(("_update", "_updates")) and callable(value) and defined_here:
                found[f"{module.__name__}.{name}"] = value
    return found


def test_every_builder_returns_a_declared_update_and_every_update_has_a_builder() -> None:
    declared = set(UPDATE_TYPES.values())
    built: set[type] = set()
    for name, builder in _builders().items():
        returns = typing.get_type_hints(builder)["return"]
        if typing.get_origin(returns) is list:
            (returns,) = typing.get_args(returns)
        assert returns in declared, f"{name} returns {returns!r}, not a wire.updates Struct"
        built.add(returns)
    assert built == declared


def test_the_union_is_every_update_struct_of_the_module() -> None:
    """A Struct added to wire.updates and left out of the union would not decode."""
    structs = {
        cls
        for cls in vars(wire_updates).values()
        if isinstance(cls, type)
        and issubclass(cls, wire_updates.Update)
        and cls is not wire_updates.Update
    }
    assert structs == set(typing.get_args(AgentUpdate)) == set(wire_updates.UPDATE_TYPES.values())
    # a worker reads those and the facets' of foldplane, each declared in its folder
    assert set(UPDATE_TYPES.values()) == structs | set(worker_facets.FACET_UPDATES)


def test_the_protocol_reference_lists_every_update_from_its_type() -> None:
    block = reference.updates_reference()
    for kind, cls in UPDATE_TYPES.items():
        [row] = [line for line in block.splitlines() if line.startswith(f"| `{kind}` |")]
        assert cls.audience in row
        for field in cls.__struct_fields__:
            if field != "offset":
                assert f"`{field}`" in row, (kind, field)
