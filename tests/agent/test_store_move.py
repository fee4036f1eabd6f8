"""End to end: the coordinator restarts with a new rendezvous store; the agents move with it.

A real SQLite coordinator process and real gloo workers. The store lives in the coordinator
process, so a restart brings a new one (``--store-port 0``: another port). The agents keep the
control plane across the restart; this checks that their data planes follow the store too, so
the next view's process group can be built.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.agent.conftest import Workers, start_coordinator, stop_coordinator
from tests.conftest import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ALL = [0, 1, 2]


def _store(coordinator) -> tuple[str, int]:
    """The store a coordinator advertises to agents (from the updates answer of rank 0)."""
    answer = coordinator.client.updates("moved", 0, 0, 0.1)
    assert answer.store is not None, "the coordinator advertises no store"
    return answer.store


def test_after_a_restart_with_a_new_store_the_survivors_build_the_next_view_there(
    tmp_path: Path,
) -> None:
    first = start_coordinator(tmp_path)
    first.create_group("moved", 3)
    w = Workers(first, "moved", 3)
    coordinators = [first]
    try:
        w.start()
        for r in ALL:
            w.expect(r, "started")
        assert {v["version"] for v in w.ask(ALL, "wait_view", "view", active=ALL).values()} == {1}
        before = w.ask(ALL, "all_reduce", "all_reduce")
        assert all(res["ok"] and res["value"] == 6.0 for res in before.values()), before
        old_store = _store(first)

        stop_coordinator(first)
        coordinators.remove(first)
        second = start_coordinator(tmp_path, port=urlsplit(first.url).port)
        coordinators.append(second)
        w.coordinator = second
        new_store = _store(second)
        assert new_store != old_store, "the restarted coordinator reused the store's address"

        # A view change through the ACK barrier, then a collective over the new view's group,
        # which can only rendezvous on the new store: the old one died with its process.
        outcome = w.ask([0], "deactivate", "proposal", ranks=[2])[0]
        assert outcome["status"] == "applied" and outcome["version"] == 2, outcome
        w.ask([0, 1], "wait_view", "view", active=[0, 1], min_version=2)
        after = w.ask([0, 1], "all_reduce", "all_reduce")
        for r, res in after.items():
            assert res["ok"] and res["value"] == 3.0 and res["version"] == 2, (r, res)
            assert res["hint"] == [0, 0, 0], (r, res)
        history = [(v["version"], v["active_ranks"]) for v in second.history("moved")]
        assert history == [(1, ALL), (2, [0, 1])]
    finally:
        w.stop()
        for c in coordinators:
            stop_coordinator(c)


def test_after_a_restart_on_the_same_store_port_the_agents_move_to_the_new_store(
    tmp_path: Path,
) -> None:
    """A fixed ``--store-port``: the restarted coordinator's store has the old address but none
    of the old keys. Its id is new, so every agent re-establishes its data plane's store before
    the next view, which builds there."""
    store_port = free_port()
    first = start_coordinator(tmp_path, store_port=store_port)
    first.create_group("moved", 3)
    w = Workers(first, "moved", 3)
    coordinators = [first]
    try:
        w.start()
        for r in ALL:
            w.expect(r, "started")
        assert {v["version"] for v in w.ask(ALL, "wait_view", "view", active=ALL).values()} == {1}
        old_store = _store(first)

        stop_coordinator(first)
        coordinators.remove(first)
        second = start_coordinator(tmp_path, port=urlsplit(first.url).port, store_port=store_port)
        coordinators.append(second)
        w.coordinator = second
        new_store = _store(second)
        assert new_store[:2] == old_store[:2], "the store came back at the same address"
        assert new_store[2] != old_store[2], "but it is another store: its id is new"

        outcome = w.ask([0], "deactivate", "proposal", ranks=[2])[0]
        assert outcome["status"] == "applied" and outcome["version"] == 2, outcome
        w.ask([0, 1], "wait_view", "view", active=[0, 1], min_version=2)
        after = w.ask([0, 1], "all_reduce", "all_reduce")
        for r, res in after.items():
            assert res["ok"] and res["value"] == 3.0 and res["version"] == 2, (r, res)
    finally:
        w.stop()
        for c in coordinators:
            stop_coordinator(c)
