"""The ``epochs`` facet's declaration (``coordinator/fold/registry.py``): what the server side
reads of it. Its package's ``PLUGIN``, loaded when the registry asks for it, so a worker that
imports the facet's worker modules loads none of its server side."""

from ...coordinator.fold.registry import FacetPlugin
from .fold import Epochs
from .protocol import EVENTS, UPDATES
from .rows import PROJECTION_KINDS, ROWS

PLUGIN = FacetPlugin(
    name=Epochs.name,
    kinds=Epochs.kinds,
    fold=Epochs,
    rows=ROWS,
    updates=UPDATES,
    events=EVENTS,
    projection_kinds=PROJECTION_KINDS,
    # a report that moved only a cursor is in the snapshot that lies before it
    compactable=frozenset({"progress"}),
    host="foldplane.facets.epochs.host",
    routes="foldplane.facets.epochs.routes",
    plot="foldplane.facets.epochs.plot",
    console="foldplane.facets.epochs:console.html",
    sim="foldplane.facets.epochs.sim",
    benchmarks={"data": "foldplane.facets.epochs.benchmark"},
)
