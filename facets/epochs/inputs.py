"""The epochs facet's inputs: one Struct per record kind, declared here, by their owner.

An ``epoch_plan`` (``POST /groups/{group}/epochs``, ``routes.py``) is an :class:`EpochPlan`, every
field explicit (:func:`complete_plan`); a rank's ``progress`` is a :class:`ProgressInput`, which
is also the agent's ``progress`` event (``protocol.py`` makes it, ``wire.protocol.agent_event``:
its fields, with the wire's bounds each marks, ``OnWire``). The log stores each as its payload; the fold (``fold.py``) decodes each
input it steps into its Struct and dispatches on the class. ``plan_problem`` and
``progress_problem`` are their ``invalid_event`` rules: None for a well-formed payload (which then
always decodes), or a message naming the field. Pure: the agent may import it.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Literal

import msgspec
from msgspec import UNSET, Meta

from ...wire.inputs import MAX_ID_LEN, OnWire

#: The largest dataset an epoch plan may name, and so the largest position or count.
MAX_DATASET = 2**48
#: A position or count of a dataset, as the wire bounds it.
Position = Annotated[int, Meta(ge=0, le=MAX_DATASET)]

SPLITS = ("equal", "ratios", "throughput")
#: The plan's fields and their defaults where the request leaves them out (``reclaim``'s
#: default depends on ``split``: on for a throughput split, off otherwise).
PLAN_DEFAULTS: dict[str, Any] = {
    "seed": 0,
    "shuffle": True,
    "split": "equal",
    "partition_ratios": None,
    "grain": 1,
    "lookahead": 1024,
}
_PLAN_FIELDS = frozenset({"epoch", "dataset_size", "reclaim", *PLAN_DEFAULTS})


class EpochsInput(msgspec.Struct, frozen=True, kw_only=True):
    """An input of the facet."""

    #: the record kind whose payload this is
    kind: ClassVar[str]


class EpochPlan(EpochsInput, frozen=True, kw_only=True):
    """One epoch's plan, as the ``epoch_plan`` record carries it (every field explicit)."""

    kind = "epoch_plan"

    # The body of ``POST /groups/{group}/epochs`` is made from these (``models.py``): each with
    # the request's bounds, and but for the first two it may leave any out (UNSET), which
    # :func:`complete_plan` fills in; the log takes what :func:`plan_problem` accepts.
    epoch: Annotated[int, OnWire(Position)]
    dataset_size: Annotated[int, OnWire(Annotated[int, Meta(ge=1, le=MAX_DATASET)])]
    seed: Annotated[int, OnWire(Annotated[int, Meta(ge=0, le=2**63 - 1)], default=UNSET)]
    shuffle: Annotated[bool, OnWire(bool, default=UNSET)]
    split: Annotated[str, OnWire(Literal["equal", "ratios", "throughput"], default=UNSET)]
    partition_ratios: Annotated[
        tuple[float, ...] | None,
        OnWire(
            Annotated[
                list[Annotated[float, Meta(ge=0, le=1e9)]], Meta(min_length=1, max_length=65_536)
            ]
            | None,
            default=UNSET,
        ),
    ]
    grain: Annotated[int, OnWire(Annotated[int, Meta(ge=1, le=MAX_DATASET)], default=UNSET)]
    lookahead: Annotated[int, OnWire(Position, default=UNSET)]
    reclaim: Annotated[bool, OnWire(bool, default=UNSET)]


def complete_plan(request: dict[str, Any]) -> dict[str, Any]:
    """A plan request with the defaults filled in: the payload the ``epoch_plan`` record
    carries, so the log says exactly what was decided."""
    out = {**PLAN_DEFAULTS, **request}
    out.setdefault("reclaim", out.get("split") == "throughput")
    return out


def plan_problem(payload: dict[str, Any], world_size: int) -> str | None:
    """Why an ``epoch_plan`` payload is malformed (naming the field), or None."""
    unknown = sorted(set(payload) - _PLAN_FIELDS)
    if unknown:
        return f"unknown field(s) {unknown}; a plan has {sorted(_PLAN_FIELDS)}"
    missing = sorted(_PLAN_FIELDS - set(payload))
    if missing:
        return f"missing field(s) {missing}"

    def integer(name: str, low: int, high: int) -> str | None:
        value = payload[name]
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            return f"{name} must be an integer in {low}..{high}, got {value!r}"
        return None

    err = (
        integer("epoch", 0, MAX_DATASET)
        or integer("dataset_size", 1, MAX_DATASET)
        or integer("seed", 0, 2**63 - 1)
        or integer("grain", 1, MAX_DATASET)
        or integer("lookahead", 0, MAX_DATASET)
    )
    if err is not None:
        return err
    for name in ("shuffle", "reclaim"):
        if not isinstance(payload[name], bool):
            return f"{name} must be true or false, got {payload[name]!r}"
    split = payload["split"]
    if split not in SPLITS:
        return f"split must be one of {list(SPLITS)}, got {split!r}"
    if payload["grain"] > payload["dataset_size"]:
        return (
            f"grain {payload['grain']} is larger than the dataset ({payload['dataset_size']} "
            "positions)"
        )
    ratios = payload["partition_ratios"]
    if split != "ratios":
        if ratios is not None:
            return f"partition_ratios is for split 'ratios', not {split!r}"
        return None
    if not isinstance(ratios, list) or len(ratios) != world_size:
        got = len(ratios) if isinstance(ratios, list) else repr(ratios)
        return f"partition_ratios must list one ratio per rank ({world_size}), got {got}"
    for rank, r in enumerate(ratios):
        if (
            not isinstance(r, int | float)
            or isinstance(r, bool)
            or not math.isfinite(r)
            or not 0 <= r <= 1e9
        ):
            return f"partition_ratios[{rank}] must be a number in 0..1e9, got {r!r}"
    return None


def progress_problem(payload: dict[str, Any]) -> str | None:
    """Why a ``progress`` payload is malformed (naming the field), or None."""
    inc = payload.get("incarnation")
    if not isinstance(inc, str) or not inc or len(inc) > MAX_ID_LEN:
        return f"incarnation must be a non-empty string of at most {MAX_ID_LEN} characters"
    for name, low in (("epoch", 0), ("assignment", 1), ("processed", 0)):
        value = payload.get(name)
        if (
            not isinstance(value, int)
            or isinstance(value, bool)
            or not low <= value <= MAX_DATASET * 4
        ):
            return f"{name} must be an integer >= {low}, got {value!r}"
    rate = payload.get("rate")
    if rate is not None and (
        not isinstance(rate, int | float)
        or isinstance(rate, bool)
        or not math.isfinite(rate)
        or not 0 <= rate <= 1e12
    ):
        return f"rate must be a number of positions a second in 0..1e12, got {rate!r}"
    unknown = sorted(set(payload) - {"incarnation", "epoch", "assignment", "processed", "rate"})
    if unknown:
        return f"unknown field(s) {unknown}"
    return None


class ProgressInput(EpochsInput, frozen=True, kw_only=True):
    """How far this rank has read its part of the open epoch (``cursor.py``): ``processed``
    positions from the front of its sequence, against the assignment it holds; ``rate`` is
    what it measured (positions a second), the weight of a throughput split.

    The wire bounds each field (an agent's float ``rate`` is stored as sent, ``5.0``); the log
    takes what :func:`progress_problem` accepts, whose bounds are wider."""

    kind = "progress"
    incarnation: str
    epoch: Annotated[int, OnWire(Position)]
    assignment: Annotated[int, OnWire(Annotated[int, Meta(ge=1, le=2**62)])]
    processed: Annotated[int, OnWire(Position)]
    rate: Annotated[int | float | None, OnWire(Annotated[float, Meta(ge=0, le=1e12)])] = None


#: The Struct of each of the facet's kinds.
INPUTS: dict[str, type[EpochsInput]] = {cls.kind: cls for cls in (EpochPlan, ProgressInput)}


def decode(kind: str, payload: dict[str, Any]) -> EpochsInput:
    """The typed input of a payload its kind's problem check accepted."""
    return msgspec.convert(payload, INPUTS[kind])
