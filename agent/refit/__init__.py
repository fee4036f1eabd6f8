"""The refit data plane: moving weights from M publishers (trainers) to N subscribers (generators).

See ``docs/refit.md``. The plan types, their gates, digest and schedule are pure and live in
:mod:`wire.refit`; this package carries a schedule out over torch (:mod:`agent.refit.world`).
Publisher slot 0 hosts the store (:func:`make_bootstrap`); every member of an admitted refit
calls :func:`open_world` with the same plan, bootstrap and lane count, then
:meth:`RefitWorld.transfer` with its local tensors.
"""

from ..dataplane.backend import drain_released
from .bootstrap import RefitStore, make_bootstrap
from .errors import Peer, RefitClosed, RefitError, RefitFailed, Verdict
from .tensors import (
    dtype_name,
    dtype_of,
    empty_shards,
    local_shards,
    local_view,
    roles_from_modules,
    tensors_of,
)
from .world import RefitWorld, TransferReport, open_world

__all__ = [
    "Peer",
    "RefitClosed",
    "RefitError",
    "RefitFailed",
    "RefitStore",
    "RefitWorld",
    "TransferReport",
    "Verdict",
    "drain_released",
    "dtype_name",
    "dtype_of",
    "empty_shards",
    "local_shards",
    "local_view",
    "make_bootstrap",
    "open_world",
    "roles_from_modules",
    "tensors_of",
]
