"""The one driver core of the agent machine (``agent.driver``): every host's actions go
through it, and what a host answers at once is stepped in order; no I/O, no sleeps."""

from __future__ import annotations

import pytest

from foldplane.agent.driver import CARRY_OUT, Driver
from foldplane.agent.machine import (
    Action,
    AgentConfig,
    AgentMachine,
    ConnectDataPlane,
    DataPlaneReady,
    EventsAnswered,
    PollUpdates,
    SendEvents,
    Start,
    StoreAddress,
    UpdatesReceived,
)
from foldplane.wire.protocol import JoinEvent, LinksEvent

STORE = StoreAddress("127.0.0.1", 29500)


class Recorder(Driver):
    """A host that writes down each action it is handed and answers a data plane at once."""

    def __init__(self, machine: AgentMachine) -> None:
        super().__init__(machine)
        self.done: list[Action] = []

    def send_events(self, action: SendEvents) -> None:
        self.done.append(action)

    def poll_updates(self, action: PollUpdates) -> None:
        self.done.append(action)

    def connect_data_plane(self, action: ConnectDataPlane) -> DataPlaneReady:
        self.done.append(action)
        return DataPlaneReady(0.3)


def machine() -> AgentMachine:
    return AgentMachine(AgentConfig(group="g", rank=1, incarnation="a", heartbeat_interval_s=1.0))


def test_every_action_of_the_machine_has_a_method_of_the_driver() -> None:
    from typing import get_args

    from foldplane.agent import machine as m

    assert set(CARRY_OUT) == set(get_args(m.Action))
    assert all(callable(getattr(Driver, name)) for name in CARRY_OUT.values())


def test_the_driver_carries_out_the_actions_in_order_and_returns_the_next_deadline() -> None:
    d = Recorder(machine())
    assert d.feed(Start(0.0)) is None  # the join in flight: nothing timed
    assert d.done == [PollUpdates(0), SendEvents((JoinEvent(group="g", rank=1, incarnation="a"),))]
    assert d.feed(EventsAnswered(0.1, ({"offset": 10},))) == pytest.approx(1.1)  # the first beat


def test_an_input_a_host_answers_at_once_is_stepped_after_the_actions_before_it() -> None:
    d = Recorder(machine())
    d.feed(Start(0.0))
    d.feed(EventsAnswered(0.1, ({"offset": 10},)))
    d.done.clear()
    d.feed(UpdatesReceived(0.2, (), 10, STORE))
    # the store's answer: connect, then the poll that followed it; then the data plane's
    # answer (DataPlaneReady) is stepped, and its links report sent
    assert d.done[:2] == [ConnectDataPlane(STORE), PollUpdates(10)]
    [report] = d.done[2:]
    assert isinstance(report, SendEvents) and type(report.events[0]) is LinksEvent
    assert report.events[0].self_ready is True


def test_a_failed_action_raises_unless_the_host_says_otherwise() -> None:
    class Broken(Driver):
        def poll_updates(self, action: PollUpdates) -> None:
            raise RuntimeError("no network")

    with pytest.raises(RuntimeError, match="no network"):
        Broken(machine()).feed(Start(0.0))

    class Logged(Broken):
        def __init__(self, machine: AgentMachine) -> None:
            super().__init__(machine)
            self.failures: list[tuple[Action, str]] = []

        def failed(self, action: Action, exc: Exception) -> None:
            self.failures.append((action, str(exc)))

    logged = Logged(machine())
    logged.feed(Start(0.0))  # the join is still handed on after the poll failed
    assert logged.failures == [(PollUpdates(0), "no network")]
