"""The ``rendezvous`` facet: torchrun's rendezvous rounds, decided by the fold
(docs/torchrun.md). Registered in ``coordinator/fold/registry.py``; torchrun reaches it through
``agent/rendezvous.py``, the handler its ``torchrun.handlers`` entry point names."""

from ...coordinator.fold.registry import FacetPlugin
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
)
