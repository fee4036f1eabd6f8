"""The toy facet's part of the agent protocol: the update its workers receive and the event they
send (made from its input, ``inputs.py``). Pure over ``wire`` and its inputs, so the worker
side may import it: a relay reads its ``UPDATES`` when
``FOLDPLANE_FACETS`` names the facet (``agent/facets.py``), and a worker follows them through
the facet's worker part (``worker.py``, named here), which its agent loads when
``FOLDPLANE_FACETS`` names the facet in the worker's environment, or by naming the Struct
(``Agent.on_update(CounterUpdate, ...)``) where it does not."""

from __future__ import annotations

from foldplane.wire.facets import WorkerPart
from foldplane.wire.protocol import agent_event
from foldplane.wire.updates import Update
from tests.facets.toy.inputs import AddInput

#: A rank adds ``by`` to its group's counter (``Agent.send_event(AddEvent, by=...)``): made from
#: its input, which declares its fields.
AddEvent = agent_event(AddInput, forbid_unknown_fields=True)


class CounterUpdate(Update, frozen=True, kw_only=True, tag="toy_counter"):
    """The agents' update: ``group``'s counter is ``count`` now."""

    group: str
    count: int


#: The updates the facet's workers receive.
UPDATES = (CounterUpdate,)
#: The events they send.
EVENTS = (AddEvent,)
#: Its worker part (``worker.py``), which the agent loads when ``FOLDPLANE_FACETS`` names the
#: facet in a worker's environment: ``agent.counter`` and ``agent.add_to_counter(by)``.
WORKER = WorkerPart(module="worker", offers=("counter", "add_to_counter"))
