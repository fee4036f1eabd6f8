"""The ``lighthouse`` facet's declaration (``coordinator/fold/registry.py``): what the server side
reads of it. Its package's ``PLUGIN``, loaded when the registry asks for it, so a worker that
imports the facet's worker modules loads none of its server side."""

from ...coordinator.fold.registry import FacetPlugin
from .fold import HEARTBEAT, Lighthouse
from .rows import PROJECTION_KINDS, ROWS

PLUGIN = FacetPlugin(
    name=Lighthouse.name,
    kinds=Lighthouse.kinds,
    fold=Lighthouse,
    rows=ROWS,
    projection_kinds=PROJECTION_KINDS,
    # a shared beat whose step decided nothing is in the snapshot that lies after it
    compactable=frozenset({HEARTBEAT}),
    host="foldplane.facets.lighthouse.host",
    routes="foldplane.facets.lighthouse.routes",
    serve="foldplane.facets.lighthouse.serve",
)
