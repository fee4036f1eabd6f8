"""The refits facet's effects: a refit created, its epoch and its transfers each time they
change, and the bootstrap its admitted members receive (the glossary of the rest is
``coordinator/fold/effects.py``)."""

from __future__ import annotations

from typing import Any

from ...coordinator.fold.effects import Effect


class RefitCreated(Effect, frozen=True, kw_only=True, tag="refit_created"):
    """A refit was declared between a publisher and a subscriber group (``spec``: the
    ``refit_created`` payload, every field explicit)."""

    refit: str
    spec: dict[str, Any]
    offset: int


class RefitEpochChanged(Effect, frozen=True, kw_only=True, tag="refit_epoch"):
    """The refit's epoch, whole, each time its status changes: ``waiting`` (slots may join
    until ``deadline_ts``), ``admitted`` (every slot joined with ``digest``, and the data
    plane's ``lanes``), ``timed_out`` (``missing`` names the slots that never joined).
    ``cause`` says why this epoch began (the refit's creation, a view of either group, a
    member lost, a transfer timed out, an operator's restart); ``lost`` names the member whose
    loss began it (its side and slot), for the workers' data plane to name as dead.
    ``groups``: the publisher and the subscriber group, whose workers all hear of it."""

    refit: str
    groups: tuple[str, str]
    epoch: int
    status: str
    cause: str
    deadline_ts: int | None
    digest: str | None
    lanes: int
    publisher_ranks: tuple[int, ...]
    subscriber_ranks: tuple[int, ...]
    missing: tuple[str, ...]
    offset: int
    lost: tuple[str, int] | None = None


class RefitBootstrap(Effect, frozen=True, kw_only=True, tag="refit_bootstrap"):
    """Refit rank 0 published the data plane's rendezvous for ``epoch``; only the admitted
    ``members`` (``(group, rank)``) receive it."""

    refit: str
    epoch: int
    bootstrap: dict[str, Any]
    members: tuple[tuple[str, int], ...]
    offset: int


class TransferChanged(Effect, frozen=True, kw_only=True, tag="transfer"):
    """A transfer, whole, each time it changes: ``running`` (attempt ``attempt`` in refit epoch
    ``epoch``, due by ``deadline_ts``), ``completed`` (final), ``failed`` (``detail`` says who or
    what; a new attempt may follow)."""

    refit: str
    groups: tuple[str, str]
    transfer: int
    key: str
    attempt: int
    epoch: int
    status: str
    detail: str
    deadline_ts: int | None
    offset: int
