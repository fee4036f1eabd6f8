"""What the refits facet's effects ask of the host.

Both groups' journals carry the refit's epochs and transfers (every worker of either side
follows them), and a resync sends the latest of each; the bootstrap goes to the journals of
the admitted members only, and a resync sends it to them until the refit's next epoch.
"""

from __future__ import annotations

from typing import Any

from ...coordinator.host.facets import FacetHost
from ...coordinator.host.ready import HostState, Ready
from .effects import (
    RefitBootstrap,
    RefitEpochChanged,
    TransferChanged,
)
from .story import RefitRankStory, refit_epoch_label
from .updates import (
    refit_bootstrap_update,
    refit_epoch_update,
    transfer_update,
)


def _epoch(state: HostState, effect: RefitEpochChanged, ready: Ready) -> None:
    """Every worker of both groups follows the refit's epoch; a new epoch's bootstrap is
    not its predecessor's, so a resync stops sending the old one."""
    update = refit_epoch_update(effect)
    for group in effect.groups:
        state.latest.setdefault(group, {})[f"refit:{effect.refit}"] = update
        for by_kind in state.latest_by_rank.get(group, {}).values():
            by_kind.pop(f"refit_bootstrap:{effect.refit}", None)
        ready.updates.append((group, None, update))


def _transfer(state: HostState, effect: TransferChanged, ready: Ready) -> None:
    update = transfer_update(effect)
    for group in effect.groups:
        state.latest.setdefault(group, {})[f"transfer:{effect.refit}"] = update
        ready.updates.append((group, None, update))


def _bootstrap(state: HostState, effect: RefitBootstrap, ready: Ready) -> None:
    """The rendezvous goes to the admitted members' own journals, nowhere else."""
    update = refit_bootstrap_update(effect)
    for group, rank in effect.members:
        by_rank = state.latest_by_rank.setdefault(group, {})
        by_rank.setdefault(str(rank), {})[f"refit_bootstrap:{effect.refit}"] = update
        ready.updates.append((group, rank, update))


def _status_label(entry: dict[str, Any]) -> str:
    return f"{entry['event']} {entry['status']}"


def _decision(effect: RefitEpochChanged) -> str:
    return f"refit {effect.refit} epoch {effect.epoch} {effect.status} ({effect.cause})"


HOST = FacetHost(
    carry={
        RefitEpochChanged: _epoch,
        TransferChanged: _transfer,
        RefitBootstrap: _bootstrap,
    },
    story=RefitRankStory,
    labels={
        "refit_epoch": refit_epoch_label,
        "transfer": _status_label,
        "transfer_status": _status_label,
    },
    decisions={RefitEpochChanged: _decision},
)
