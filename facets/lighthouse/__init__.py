"""The ``lighthouse`` facet: foldplane as torchft's lighthouse (docs/torchft.md). Its quorum
rule is torchft's, decided by the fold over the log (``fold.py``); ``serve --lighthouse-port``
serves torchft's gRPC service (``service.py``). Registered in
``coordinator/fold/registry.py``."""

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
)
