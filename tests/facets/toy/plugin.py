"""The toy facet's declaration (``FacetPlugin``), which the registry reads as its package's
``PLUGIN``."""

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
