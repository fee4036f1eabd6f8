"""The refits facet's inputs: one Struct per record kind, declared here, by their owner.

An operator creates a refit (``refit_created``: :class:`RefitCreatedInput`, every field explicit,
:func:`complete_spec`), restarts it (``refit_restart``) or starts a transfer (``transfer``); a
worker joins an epoch (``refit_join``), publishes its bootstrap (``refit_bootstrap``), starts a
transfer and reports its outcome (``transfer_status``). The log stores each as its payload; the
fold (``fold.py``) checks it (``spec_problem`` here, the rest against the refit's state, each with
its code), then decodes it into its Struct and dispatches on the class. A worker's input is also
its event (``protocol.py`` makes it, ``wire.protocol.agent_event``): the input's fields, with the
wire's bounds each marks (``OnWire``), while the fold decodes a stored payload by the field's own
type (a payload that does not decode is refused naming the field, as recorded). Pure: the agent
may import it.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar

import msgspec
from msgspec import UNSET, Meta, UnsetType

from ...wire.inputs import OnWire, ShortText
from ...wire.protocol import GroupName

#: A refit's name (``POST /refits``), and a plan digest: sha256 in lowercase hex.
RefitName = Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")]
Digest = Annotated[str, Meta(pattern=r"^[0-9a-f]{64}$")]
RefitEpoch = Annotated[int, Meta(ge=1, le=2**62, description="a refit epoch")]
#: A transfer's key: printable ASCII without spaces.
TransferKey = Annotated[str, Meta(pattern=r"^[\x21-\x7e]{1,128}$")]
#: A bootstrap is flat: the data plane's rendezvous (a store address, a prefix, an NCCL unique
#: id in hex), at most 16 values, each short (the fold also bounds its encoded size).
BootstrapValue = (
    Annotated[str, Meta(max_length=1024)] | Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
)
FlatBootstrap = Annotated[
    dict[Annotated[str, Meta(max_length=64)], BootstrapValue], Meta(max_length=16)
]
#: A transfer's number, and its attempt's.
Count = Annotated[int, Meta(ge=1, le=2**62)]

#: The bounds of a refit's definition: a worker that never joins must not hold the others for
#: a day, and a transfer deadline of years is a typo, not a plan. 8,192 slots a side keeps an
#: admitted epoch's update (every slot's rank) well inside ``wire.protocol.MAX_UPDATE_BYTES``.
MAX_SLOTS = 8192
MAX_LANES = 64
#: How many slots a side has, as ``POST /refits`` bounds it.
Slots = Annotated[int, Meta(ge=1, le=MAX_SLOTS)]
MAX_READINESS_S = 3600.0
MAX_TRANSFER_S = 86_400.0
#: The bootstrap's encoded size (a store address, an NCCL unique id: well under this).
MAX_BOOTSTRAP_BYTES = 4096
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_KEY = re.compile(r"^[\x21-\x7e]{1,128}$")
_SPEC_FIELDS = {
    "refit": str,
    "publisher": str,
    "subscriber": str,
    "publisher_slots": int,
    "subscriber_slots": int,
    "lanes": int,
    "readiness_timeout_s": float,
    "transfer_timeout_s": float,
    "digest": str,
}
#: Defaults filled in where ``POST /refits`` leaves a field out (the record says them all).
SPEC_DEFAULTS: dict[str, Any] = {
    "lanes": 4,
    "readiness_timeout_s": 60.0,
    "transfer_timeout_s": 600.0,
    "digest": None,
}


def complete_spec(request: dict[str, Any]) -> dict[str, Any]:
    """A refit request with the defaults filled in: the ``refit_created`` payload."""
    return {**SPEC_DEFAULTS, **request}


def spec_problem(payload: dict[str, Any]) -> str | None:
    """Why a ``refit_created`` payload is malformed (naming the field), or None."""
    unknown = sorted(set(payload) - set(_SPEC_FIELDS))
    if unknown:
        return f"unknown field(s) {unknown}; a refit has {sorted(_SPEC_FIELDS)}"
    missing = sorted(set(_SPEC_FIELDS) - set(payload))
    if missing:
        return f"missing field(s) {missing}"
    for name in ("refit", "publisher", "subscriber"):
        value = payload[name]
        if not isinstance(value, str) or not _NAME.match(value):
            return (
                f"{name} must be 1-64 characters of letters, digits and _.:- (starting with a "
                f"letter or digit), got {value!r}"
            )
    if payload["publisher"] == payload["subscriber"]:
        return f"publisher and subscriber are the same group {payload['publisher']!r}"
    for name, high in (
        ("publisher_slots", MAX_SLOTS),
        ("subscriber_slots", MAX_SLOTS),
        ("lanes", MAX_LANES),
    ):
        value = payload[name]
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= high:
            return f"{name} must be an integer in 1..{high}, got {value!r}"
    for name, high in (
        ("readiness_timeout_s", MAX_READINESS_S),
        ("transfer_timeout_s", MAX_TRANSFER_S),
    ):
        value = payload[name]
        if (
            not isinstance(value, int | float)
            or isinstance(value, bool)
            or not 0 < value <= high  # NaN compares false: refused too
        ):
            return f"{name} must be a number of seconds in (0, {high:g}], got {value!r}"
    digest = payload["digest"]
    if digest is not None and (not isinstance(digest, str) or not _DIGEST.match(digest)):
        return f"digest must be 64 lowercase hex characters (sha256) or null, got {digest!r}"
    return None


# -- the inputs --------------------------------------------------------------------------------


class RefitsInput(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """An input of the facet: every one names its refit."""

    #: the record kind whose payload this is
    kind: ClassVar[str]
    refit: Annotated[str, OnWire(RefitName)]


class RefitCreatedInput(RefitsInput, frozen=True, kw_only=True, gc=False):
    """``refit_created``: the refit's definition (``spec_problem`` checks it)."""

    kind = "refit_created"
    # ``POST /refits``'s body is made from these (``models.py``), with its bounds; it may leave
    # the last four out (UNSET), which :func:`complete_spec` fills in.
    publisher: Annotated[str, OnWire(GroupName)]
    subscriber: Annotated[str, OnWire(GroupName)]
    publisher_slots: Annotated[int, OnWire(Slots)]
    subscriber_slots: Annotated[int, OnWire(Slots)]
    lanes: Annotated[int, OnWire(Annotated[int, Meta(ge=1, le=MAX_LANES)], default=UNSET)]
    readiness_timeout_s: Annotated[
        int | float,
        OnWire(Annotated[float, Meta(gt=0, le=int(MAX_READINESS_S))], default=UNSET),
    ]
    transfer_timeout_s: Annotated[
        int | float,
        OnWire(Annotated[float, Meta(gt=0, le=int(MAX_TRANSFER_S))], default=UNSET),
    ]
    digest: Annotated[str | None, OnWire(Digest | None, default=UNSET)]


class RefitRestartInput(RefitsInput, frozen=True, kw_only=True, gc=False):
    """``refit_restart``: an operator opens a new epoch, saying why."""

    kind = "refit_restart"
    reason: Annotated[Any, OnWire(ShortText)] = None


class RefitJoinInput(RefitsInput, frozen=True, kw_only=True, gc=False):
    """This worker takes ``slot`` of its group's side of ``refit`` in ``epoch``, holding the
    plan whose digest is ``digest`` (``wire.refit.ReshardPlan.digest``). Publisher slot 0 may
    offer the epoch's ``bootstrap`` with its join: the fold publishes it to the members in the
    step that admits the epoch, saving the separate ``refit_bootstrap`` round trip."""

    kind = "refit_join"
    incarnation: str
    epoch: Annotated[int, OnWire(RefitEpoch)]
    slot: Annotated[int, OnWire(Annotated[int, Meta(ge=0, le=65_535, description="a slot")])]
    digest: Annotated[str, OnWire(Digest)]
    bootstrap: Annotated[dict[str, Any] | UnsetType, OnWire(FlatBootstrap)] = UNSET


class RefitBootstrapInput(RefitsInput, frozen=True, kw_only=True, gc=False):
    """Refit rank 0 publishes the data plane's rendezvous of an admitted epoch."""

    kind = "refit_bootstrap"
    incarnation: str
    epoch: Annotated[int, OnWire(RefitEpoch)]
    bootstrap: Annotated[dict[str, Any], OnWire(FlatBootstrap)]


class TransferInput(RefitsInput, frozen=True, kw_only=True, gc=False):
    """Start (or, after a failure, retry) the transfer ``key`` in the admitted ``epoch``: from
    an operator (no incarnation, no epoch) or a publisher (whose event names the epoch)."""

    kind = "transfer"
    incarnation: str | None = None
    epoch: Annotated[int | None, OnWire(RefitEpoch, required=True)] = None
    key: Annotated[str, OnWire(TransferKey)]


class TransferStatusInput(RefitsInput, frozen=True, kw_only=True, gc=False):
    """This member's outcome (``done`` or ``failed``) of ``attempt`` of transfer
    ``transfer``."""

    kind = "transfer_status"
    incarnation: str
    epoch: Annotated[int, OnWire(RefitEpoch)]
    transfer: Annotated[int, OnWire(Count)]
    attempt: Annotated[int, OnWire(Count)]
    status: Annotated[str, OnWire(Annotated[str, Meta(pattern="^(done|failed)$")])]
    detail: Annotated[str, OnWire(Annotated[str, Meta(max_length=1000)])] = ""


#: The Struct of each of the facet's kinds.
INPUTS: dict[str, type[RefitsInput]] = {
    cls.kind: cls
    for cls in (
        RefitCreatedInput,
        RefitRestartInput,
        RefitJoinInput,
        RefitBootstrapInput,
        TransferInput,
        TransferStatusInput,
    )
}


def decode(kind: str, payload: dict[str, Any]) -> RefitsInput:
    """The typed input of a payload; ``msgspec.ValidationError`` names a field of the wrong
    type (the fold refuses such an input as ``invalid_event``)."""
    return msgspec.convert(payload, INPUTS[kind])
