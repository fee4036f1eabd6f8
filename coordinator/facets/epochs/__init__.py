"""The ``epochs`` facet: epoch plans and the data partitions that survive a dead rank
(docs/data.md). Registered in ``coordinator/fold/registry.py``."""

from foldplane.coordinator.facets.epochs.fold import Epochs
from foldplane.coordinator.facets.epochs.rows import PROJECTION_KINDS, ROWS
from foldplane.coordinator.fold.registry import FacetPlugin
from foldplane.wire.protocol import ProgressEvent
from foldplane.wire.updates import (
    DataAssignmentUpdate,
    DataMovesUpdate,
    EpochCompleteUpdate,
    EpochPlanUpdate,
)

PLUGIN = FacetPlugin(
    name=Epochs.name,
    kinds=Epochs.kinds,
    fold=Epochs,
    rows=ROWS,
    updates=(EpochPlanUpdate, DataAssignmentUpdate, DataMovesUpdate, EpochCompleteUpdate),
    events=(ProgressEvent,),
    projection_kinds=PROJECTION_KINDS,
    # a report that moved only a cursor is in the snapshot that lies before it
    compactable=frozenset({"progress"}),
    host="foldplane.coordinator.facets.epochs.host",
    routes="foldplane.coordinator.facets.epochs.routes",
    plot="foldplane.coordinator.facets.epochs.plot",
    console="foldplane.coordinator.facets.epochs:console.html",
)
