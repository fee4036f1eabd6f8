"""The refits facet's agent updates (docs/refit.md, docs/protocol.md): each a Struct of
``wire.updates``.

Both groups' journals carry the refit's epochs and transfers (every worker of either side
follows them); the bootstrap goes to the journals of the admitted members only (``host.py``).
"""

from __future__ import annotations

from foldplane.coordinator.facets.refits.effects import (
    RefitBootstrap,
    RefitEpochChanged,
    TransferChanged,
)
from foldplane.wire.updates import RefitBootstrapUpdate, RefitEpochUpdate, TransferUpdate


def refit_epoch_update(effect: RefitEpochChanged) -> RefitEpochUpdate:
    return RefitEpochUpdate(
        offset=effect.offset,
        refit=effect.refit,
        groups=effect.groups,
        epoch=effect.epoch,
        status=effect.status,
        cause=effect.cause,
        deadline_ts=effect.deadline_ts,
        digest=effect.digest,
        lanes=effect.lanes,
        publisher_ranks=effect.publisher_ranks,
        subscriber_ranks=effect.subscriber_ranks,
        missing=effect.missing,
    )


def transfer_update(effect: TransferChanged) -> TransferUpdate:
    return TransferUpdate(
        offset=effect.offset,
        refit=effect.refit,
        groups=effect.groups,
        transfer=effect.transfer,
        key=effect.key,
        attempt=effect.attempt,
        epoch=effect.epoch,
        status=effect.status,
        detail=effect.detail,
        deadline_ts=effect.deadline_ts,
    )


def refit_bootstrap_update(effect: RefitBootstrap) -> RefitBootstrapUpdate:
    return RefitBootstrapUpdate(
        offset=effect.offset, refit=effect.refit, epoch=effect.epoch, bootstrap=effect.bootstrap
    )
