"""The toy facet's part of the agent protocol: the update its workers receive and the event they
send. Pure over ``wire``, so the worker side may import it: a relay reads its ``UPDATES`` when
``FOLDPLANE_FACETS`` names the facet (``agent/facets.py``), and a worker follows them by
naming the Struct (``Agent.on_update(CounterUpdate, ...)``)."""

from __future__ import annotations

from foldplane.wire.updates import Update
from tests.facets.toy.inputs import AddEvent


class CounterUpdate(Update, frozen=True, kw_only=True, tag="toy_counter"):
    """The agents' update: ``group``'s counter is ``count`` now."""

    group: str
    count: int


#: The updates the facet's workers receive.
UPDATES = (CounterUpdate,)
#: The events they send.
EVENTS = (AddEvent,)
