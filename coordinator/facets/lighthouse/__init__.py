"""The ``lighthouse`` facet: foldplane as torchft's lighthouse (docs/torchft.md). Its quorum
rule is torchft's, decided by the fold over the log (``fold.py``); ``serve --lighthouse-port``
serves torchft's gRPC service (``service.py``). Registered in
``coordinator/fold/registry.py``."""

from foldplane.coordinator.facets.lighthouse.fold import HEARTBEAT, Lighthouse
from foldplane.coordinator.facets.lighthouse.rows import PROJECTION_KINDS, ROWS
from foldplane.coordinator.fold.registry import FacetPlugin

PLUGIN = FacetPlugin(
    name=Lighthouse.name,
    kinds=Lighthouse.kinds,
    fold=Lighthouse,
    rows=ROWS,
    projection_kinds=PROJECTION_KINDS,
    # a shared beat whose step decided nothing is in the snapshot that lies after it
    compactable=frozenset({HEARTBEAT}),
    host="foldplane.coordinator.facets.lighthouse.host",
    routes="foldplane.coordinator.facets.lighthouse.routes",
)
