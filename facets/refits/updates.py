"""The refits facet's agent updates (docs/refit.md, docs/protocol.md): each a Struct of
``wire.updates``.

Both groups' journals carry the refit's epochs and transfers (every worker of either side
follows them); the bootstrap goes to the journals of the admitted members only (``host.py``).
"""

from __future__ import annotations

from ...wire.updates import update_from
from .effects import (
    RefitBootstrap,
    RefitEpochChanged,
    TransferChanged,
)
from .protocol import RefitBootstrapUpdate, RefitEpochUpdate, TransferUpdate


def refit_epoch_update(effect: RefitEpochChanged) -> RefitEpochUpdate:
    return update_from(RefitEpochUpdate, effect)


def transfer_update(effect: TransferChanged) -> TransferUpdate:
    return update_from(TransferUpdate, effect)


def refit_bootstrap_update(effect: RefitBootstrap) -> RefitBootstrapUpdate:
    return update_from(RefitBootstrapUpdate, effect)
