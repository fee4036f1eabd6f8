"""The one driver of the agent machine: step it, carry out each action, feed back what answers
at once. Every host of an agent drives its machine through this core, as etcd's ``node.run``
and its tests both drive one ``RawNode``: the real agent's thread (``agent.host``), the
simulated hosts of the tests and benchmarks (``agent.simhost``) and the deterministic
simulator (``sim.world``). So the simulator runs the code the real agent runs.

A host subclasses :class:`Driver` and says what it does with each action, one method per
action (``send_events``, ``poll_updates``, ...: each a no-op until overridden). A method may
return an input that answers the action at once (a data plane that is ready as soon as it is
asked for, say): the core steps the machine with it and carries out what that gives after the
actions already waiting, in order. :meth:`Driver.feed` returns the machine's next deadline:
when the host must ``Tick`` it next.

Like the machine, this module touches no clock, socket or thread: the host brings those.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .machine import (
    Action,
    AgentMachine,
    ConnectDataPlane,
    EventAnswered,
    FacetUpdate,
    Input,
    InstallView,
    MoveDataPlane,
    PollUpdates,
    RankStateChanged,
    SendEvents,
    ShutdownWithSave,
    Stopped,
)


class Driver:
    """One rank's machine and what its host does with each of its actions."""

    def __init__(self, machine: AgentMachine) -> None:
        self.machine = machine
        #: each action's class -> this host's method for it (bound once: hosts carry thousands
        #: of actions a second)
        self._carry_out: dict[type, Callable[[Any], Input | None]] = {
            cls: getattr(self, name) for cls, name in CARRY_OUT.items()
        }

    def feed(self, event: Input) -> float | None:
        """Step the machine with ``event``, carry out every action (and those of the inputs the
        actions answered at once, after them); return the machine's next deadline."""
        machine, carry_out = self.machine, self._carry_out
        actions = machine.step(event)
        while actions:
            follow: list[Action] = []
            for action in actions:
                try:
                    answer = carry_out[type(action)](action)
                except Exception as exc:  # a host decides whether one bad action ends it
                    self.failed(action, exc)
                    continue
                if answer is not None:
                    follow.extend(machine.step(answer))
            actions = follow
        return machine.next_deadline()

    def failed(self, action: Action, exc: Exception) -> None:
        """Carrying out ``action`` raised ``exc``: raise it (a host that must outlive one bad
        action logs it instead)."""
        raise exc

    # -- what the host does with each action (nothing, until it says) ---------------------------

    def send_events(self, action: SendEvents) -> Input | None:
        """POST the batch in its lane; feed back ``EventsAnswered`` or ``EventsFailed``."""
        return None

    def poll_updates(self, action: PollUpdates) -> Input | None:
        """Long-poll the updates; feed back ``UpdatesReceived`` or ``PollFailed``."""
        return None

    def connect_data_plane(self, action: ConnectDataPlane) -> Input | None:
        """Build the data plane on the store; feed back ``DataPlaneReady`` when it is."""
        return None

    def move_data_plane(self, action: MoveDataPlane) -> Input | None:
        """Move the data plane to another store; feed back ``DataPlaneReady`` when it is."""
        return None

    def install_view(self, action: InstallView) -> Input | None:
        """Build the view's group; feed back the ``LinkEvidence`` the data plane finds."""
        return None

    def rank_state_changed(self, action: RankStateChanged) -> Input | None:
        return None

    def shutdown_with_save(self, action: ShutdownWithSave) -> Input | None:
        return None

    def facet_update(self, action: FacetUpdate) -> Input | None:
        return None

    def event_answered(self, action: EventAnswered) -> Input | None:
        return None

    def stopped(self, action: Stopped) -> Input | None:
        return None


#: Which method of a :class:`Driver` carries out each action, by the action's exact class.
CARRY_OUT: dict[type, str] = {
    SendEvents: "send_events",
    PollUpdates: "poll_updates",
    ConnectDataPlane: "connect_data_plane",
    MoveDataPlane: "move_data_plane",
    InstallView: "install_view",
    RankStateChanged: "rank_state_changed",
    ShutdownWithSave: "shutdown_with_save",
    FacetUpdate: "facet_update",
    EventAnswered: "event_answered",
    Stopped: "stopped",
}

__all__ = ["CARRY_OUT", "Driver"]
