"""The ``rendezvous`` facet's declaration (``coordinator/fold/registry.py``): what the server side
reads of it. Its package's ``PLUGIN``, loaded when the registry asks for it, so a worker that
imports the facet's worker modules loads none of its server side."""

from ...coordinator.fold.registry import Explain, FacetPlugin
from .fold import Rendezvous
from .rows import PROJECTION_KINDS, ROWS

PLUGIN = FacetPlugin(
    name=Rendezvous.name,
    kinds=Rendezvous.kinds,
    fold=Rendezvous,
    rows=ROWS,
    projection_kinds=PROJECTION_KINDS,
    compactable=frozenset({"rdzv_keepalive"}),
    host="foldplane.facets.rendezvous.host",
    routes="foldplane.facets.rendezvous.routes",
    explain=Explain(
        option="--rdzv",
        metavar="JOB",
        help="tell this torchrun job's rendezvous story (its --rdzv-id; not a rank's)",
        tell="foldplane.facets.rendezvous.story:rendezvous_story_from",
        shown="foldplane.facets.rendezvous.story:shown",
    ),
)
