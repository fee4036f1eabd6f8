"""A composition of facets is a value (``coordinator.fold.registry.Facets``): two of them live in
one process, each with its own record kinds, update and event readers, log and fold, and
building one (importing and loading a facet) leaves every table of the modules as it was."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from foldplane.coordinator.fold import registry
from foldplane.coordinator.fold.machine import Coordinator
from foldplane.eventlog import InvalidRecord, NewRecord, open_log
from foldplane.eventlog import record as log_record
from foldplane.wire import protocol, updates
from foldplane.wire.codes import INVALID_EVENT

TOY = "tests.facets.toy"
ENVELOPE = {"group": "g", "rank": 0, "incarnation": "i-1"}


def _tables() -> tuple[object, ...]:
    """Every module-level table a facet once changed as it loaded."""
    return (
        log_record.KINDS,
        dict(updates.UPDATE_TYPES),
        updates.PROTOCOL_UPDATES,
        dict(protocol.EVENT_TYPES),
        dict(protocol.EVENT_KINDS),
        protocol.PROTOCOL_READER,
        registry.default(),
    )


def test_two_compositions_in_one_process_each_read_only_their_own_kinds(tmp_path: Path) -> None:
    before = _tables()
    plain = registry.Facets()
    toy = registry.Facets(TOY)
    assert _tables() == before  # loading the toy facet changed nothing outside ``toy``
    assert log_record.KINDS == log_record.MEMBERSHIP_KINDS

    assert [p.name for p in toy.plugins] == [*(p.name for p in plain.plugins), "toy"]
    assert {"toy_bump", "toy_add"} <= toy.all_kinds
    assert not {"toy_bump", "toy_add"} & plain.all_kinds

    # updates: the toy composition's reader decodes the counter, the plain one leaves it out
    # as an update it does not know
    sent = b'[{"type":"toy_counter","offset":5,"group":"g","count":7}]'
    (counter,) = toy.updates.decode_updates(sent)
    assert type(counter).__name__ == "CounterUpdate" and counter.count == 7
    assert plain.updates.decode_updates(sent) == []
    assert updates.decode_updates(sent) == []

    # events: ``POST /agents/events`` of each takes its own
    body = msgspec.json.encode({"events": [{"type": "toy_add", "by": 2, **ENVELOPE}]})
    (add,) = toy.events.decode_events(body)
    assert toy.events.kinds[type(add)] == "toy_add" and add.by == 2
    with pytest.raises(msgspec.ValidationError):
        plain.events.decode_events(body)
    with pytest.raises(msgspec.ValidationError, match="toy_add"):
        plain.events.event_type_of({"type": "toy_add", **ENVELOPE})

    # the fold: each steps its own facets; the plain one refuses the toy's kind
    assert Coordinator(toy).facet("toy").name == "toy"
    plain_fold = Coordinator(plain)
    with pytest.raises(KeyError):
        plain_fold.facet("toy")
    refused = plain_fold.check("toy_bump", "g", None, {"by": 1})
    assert refused is not None and refused.code == INVALID_EVENT
    assert "unknown kind 'toy_bump'" in refused.message

    # the projections and the host parts: each composition's own
    from foldplane.coordinator.fold.projections import rows_for
    from foldplane.coordinator.host.facets import facet_carry, facet_hosts
    from tests.facets.toy.fold import CounterBumped

    bumped = CounterBumped(group="g", count=1, by=1, offset=3)
    assert [r.kind for r in rows_for(bumped, toy)] == ["toy_counter"]
    assert rows_for(bumped, plain) == []
    assert len(facet_hosts(toy)) == len(facet_hosts(plain)) + 1
    assert CounterBumped in facet_carry(toy) and CounterBumped not in facet_carry(plain)

    # the log: each accepts the kinds its opener hands it, and no other
    async def logs() -> None:
        plain_log = await open_log(tmp_path / "plain.db")
        toy_log = await open_log(tmp_path / "toy.db")
        try:
            plain_log.accept(plain.kinds)
            toy_log.accept(toy.kinds)
            bump = NewRecord(kind="toy_bump", group="g", payload={"by": 1})
            assert await toy_log.append([bump]) == [1]
            with pytest.raises(InvalidRecord, match="unknown kind 'toy_bump'"):
                await plain_log.append([bump])
            assert await plain_log.head() == 0
        finally:
            await plain_log.close()
            await toy_log.close()

    asyncio.run(logs())
    assert _tables() == before
