"""The ``refits`` facet's declaration (``coordinator/fold/registry.py``): what the server side
reads of it. Its package's ``PLUGIN``, loaded when the registry asks for it, so a worker that
imports the facet's worker modules loads none of its server side."""

from ...coordinator.fold.registry import Explain, FacetPlugin
from .fold import Refits
from .protocol import EVENTS, UPDATES
from .rows import PROJECTION_KINDS, ROWS
from .state import transfer_key

PLUGIN = FacetPlugin(
    name=Refits.name,
    kinds=Refits.kinds,
    fold=Refits,
    rows=ROWS,
    updates=UPDATES,
    events=EVENTS,
    projection_kinds=PROJECTION_KINDS,
    batch_key={"transfer": transfer_key},
    host="foldplane.facets.refits.host",
    routes="foldplane.facets.refits.routes",
    plot="foldplane.facets.refits.plot",
    console="foldplane.facets.refits:console.html",
    explain=Explain(
        option="--refit",
        metavar="NAME",
        help="tell this refit's story (not a rank's)",
        tell="foldplane.facets.refits.story:refit_story_from",
    ),
    benchmarks={"refit": "foldplane.facets.refits.benchmark"},
)
