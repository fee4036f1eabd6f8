"""A toy facet that plugs into foldplane the way every facet does: one folder, one line.

Its kind of state is a per-group counter the operator bumps (``POST /groups/{group}/toy``) and
the group's ranks add to (``Agent.send_event(AddEvent, by=...)``): two record kinds
(``toy_bump``, ``toy_add``), an agent event, refusals, a projection row (``toy_counter``), an
update to the group's agents, a route, a panel in the operator's console and an option of
``serve`` (``--toy-note FILE``) and a benchmark (``python -m benchmarks toy``). The line that plugs it in is ``FOLDPLANE_FACETS=tests.facets.toy``
(``coordinator/fold/registry.py``); nothing of foldplane names it.
"""

from foldplane.coordinator.fold.registry import FacetPlugin
from tests.facets.toy.fold import CounterBumped, Counters, counter_row
from tests.facets.toy.protocol import EVENTS, UPDATES

PLUGIN = FacetPlugin(
    name=Counters.name,
    kinds=Counters.kinds,
    fold=Counters,
    rows={CounterBumped: counter_row},
    updates=UPDATES,
    events=EVENTS,
    projection_kinds=("toy_counter",),
    host="tests.facets.toy.host",
    routes="tests.facets.toy.routes",
    console="tests.facets.toy:console.html",
    serve="tests.facets.toy.serve",
    benchmarks={"toy": "tests.facets.toy.benchmark"},
)
