"""A group's configuration: its fields, their defaults, their validation, and their resolution.

Configuration is what an operator chooses when creating a group (``POST /groups``); it never
changes afterwards. Durations are seconds as floats at the surface and become integer
nanoseconds in exactly one place, :meth:`GroupConfig.resolve`, so the fold never multiplies
seconds by 1e9 itself.

Defaults suit a real training job: agents heartbeat about once a second, so ten missed beats
(``heartbeat_timeout_s=10``) mean the process or its host is gone; a view change waits 30 s for
ACKs because a rank may be inside a long collective; a group waits five minutes to form because
pulling a container image and loading a checkpoint takes minutes.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta

# The largest group the fold accepts is the protocol's MAX_WORLD_SIZE; larger values are almost
# certainly a typo.
from ...wire.inputs import MAX_WORLD_SIZE, OnWire

#: Survivor floor per backend: NCCL cannot run a communicator of one rank, gloo can.
BACKEND_FLOOR: dict[str, int] = {"gloo": 1, "nccl": 2}

_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")
_NS_PER_S = 1_000_000_000


class ConfigError(ValueError):
    """A configuration was refused; ``field`` names the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


#: The bounds ``POST /groups`` decodes its body by (``api.models.CreateGroupRequest``, made
#: from :class:`GroupConfig`): a duration is more than zero seconds (the reconcile window: zero
#: or more), at most a week; a failure budget as a percentage of the group is more than 0 and
#: at most 100 (``"25%"``). :meth:`GroupConfig.from_request` then words what depends on the
#: group (a count above its world size) and what a record of an older log may hold.
Timeout = Annotated[float, Meta(gt=0, le=604_800)]
Seconds = Annotated[float, Meta(ge=0, le=604_800)]
PERCENT = r"^ *(0*[1-9][0-9]?(\.[0-9]+)?|0*100(\.0+)?|0+\.[0-9]*[1-9][0-9]*) *% *$(?!\n)"
AtLeastOne = Annotated[int, Meta(ge=1)]


class GroupConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The configuration of one group. Build it with :meth:`from_request` to get validation.
    Its fields are declared once, here: the body of ``POST /groups`` is the group's name and
    these (``wire.protocol.request_body``), each as the wire bounds it (``OnWire``; one the
    body leaves out, ``UNSET``, takes its default here)."""

    world_size: Annotated[int, OnWire(Annotated[int, Meta(ge=1, le=MAX_WORLD_SIZE)])]
    heartbeat_timeout_s: Annotated[float, OnWire(Timeout, default=UNSET)] = 10.0
    ack_timeout_s: Annotated[float, OnWire(Timeout, default=UNSET)] = 30.0
    admission_timeout_s: Annotated[float, OnWire(Timeout, default=UNSET)] = 30.0
    formation_timeout_s: Annotated[float, OnWire(Timeout, default=UNSET)] = 300.0
    reconcile_window_s: Annotated[float, OnWire(Seconds, default=UNSET)] = 0.25
    min_ranks: Annotated[int | None, OnWire(AtLeastOne | None, default=UNSET)] = None
    min_active: Annotated[int, OnWire(AtLeastOne, default=UNSET)] = 1
    max_failure: Annotated[
        int | str | None,
        OnWire(AtLeastOne | Annotated[str, Meta(pattern=PERCENT)] | None, default=UNSET),
    ] = None
    auto_deactivate_on_failure: Annotated[bool, OnWire(bool, default=UNSET)] = True
    backend: Annotated[str, OnWire(Literal["gloo", "nccl"], default=UNSET)] = "gloo"
    #: the rank that saves the group's checkpoints while it is active and alive (None: the
    #: lowest active rank); see ``budget.checkpoint_rank``
    checkpoint_rank: Annotated[
        int | None,
        OnWire(Annotated[int, Meta(ge=0, le=MAX_WORLD_SIZE - 1)] | None, default=UNSET),
    ] = None

    @classmethod
    def from_request(cls, request: dict[str, Any]) -> GroupConfig:
        """Validate a request body (``POST /groups``) into a config, or raise ConfigError.

        ``group`` (the name, which is not part of the configuration) is ignored if present;
        any other unknown field is an error, so a misspelt option never silently falls back to
        its default.
        """
        if not isinstance(request, dict):
            raise ConfigError("config", f"must be a JSON object, got {type(request).__name__}")
        known = set(cls.__struct_fields__)
        unknown = sorted(k for k in request if k not in known and k != "group")
        if unknown:
            raise ConfigError(unknown[0], f"unknown field; expected some of {sorted(known)}")
        if "world_size" not in request:
            raise ConfigError("world_size", "is required")
        fields = {k: v for k, v in request.items() if k in known}
        world_size = _int(fields, "world_size", lo=1, hi=MAX_WORLD_SIZE)
        out: dict[str, Any] = {"world_size": world_size}
        for name in (
            "heartbeat_timeout_s",
            "ack_timeout_s",
            "admission_timeout_s",
            "formation_timeout_s",
        ):
            if name in fields:
                out[name] = _seconds(fields, name, allow_zero=False)
        if "reconcile_window_s" in fields:
            out["reconcile_window_s"] = _seconds(fields, "reconcile_window_s", allow_zero=True)
        if fields.get("min_ranks") is not None:
            out["min_ranks"] = _int(fields, "min_ranks", lo=1, hi=world_size)
        if "min_active" in fields:
            out["min_active"] = _int(fields, "min_active", lo=1, hi=world_size)
        if fields.get("max_failure") is not None:
            out["max_failure"] = _max_failure(fields["max_failure"], world_size)
        if "auto_deactivate_on_failure" in fields:
            value = fields["auto_deactivate_on_failure"]
            if not isinstance(value, bool):
                raise ConfigError(
                    "auto_deactivate_on_failure", f"must be true or false, got {value!r}"
                )
            out["auto_deactivate_on_failure"] = value
        if "backend" in fields:
            backend = fields["backend"]
            if backend not in BACKEND_FLOOR:
                raise ConfigError(
                    "backend", f"must be one of {sorted(BACKEND_FLOOR)}, got {backend!r}"
                )
            out["backend"] = backend
        if fields.get("checkpoint_rank") is not None:
            out["checkpoint_rank"] = _int(fields, "checkpoint_rank", lo=0, hi=world_size - 1)
        return cls(**out)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, as carried in a ``group_created`` record's ``config``."""
        out = msgspec.to_builtins(self)
        if out["checkpoint_rank"] is None:  # as configs written before the field read
            del out["checkpoint_rank"]
        return out

    def resolve(self) -> Resolved:
        """Integer nanoseconds and derived counts: the only form the fold computes with."""
        return Resolved(
            world_size=self.world_size,
            heartbeat_timeout_ns=_ns(self.heartbeat_timeout_s),
            ack_timeout_ns=_ns(self.ack_timeout_s),
            admission_timeout_ns=_ns(self.admission_timeout_s),
            formation_timeout_ns=_ns(self.formation_timeout_s),
            reconcile_window_ns=_ns(self.reconcile_window_s),
            min_ranks=self.world_size if self.min_ranks is None else self.min_ranks,
            min_active=self.min_active,
            max_failure=failure_budget(self.max_failure, self.world_size),
            auto_deactivate=self.auto_deactivate_on_failure,
            survivor_floor=BACKEND_FLOOR[self.backend],
        )


@dataclass(frozen=True, slots=True)
class Resolved:
    """A config with durations in integer nanoseconds and ``None`` defaults filled in.

    ``max_failure`` is the number of failed incarnations at which the group shuts down
    (``None``: no budget).
    """

    world_size: int
    heartbeat_timeout_ns: int
    ack_timeout_ns: int
    admission_timeout_ns: int
    formation_timeout_ns: int
    reconcile_window_ns: int
    min_ranks: int
    min_active: int
    max_failure: int | None
    auto_deactivate: bool
    survivor_floor: int


def failure_budget(max_failure: int | str | None, world_size: int) -> int | None:
    """The failure count that ends the group: an absolute count, or ``ceil(p% * world_size)``.

    A percentage rounds up so that "25%" means "once at least a quarter of the ranks failed",
    and never rounds down to a budget of zero.
    """
    if max_failure is None:
        return None
    if isinstance(max_failure, int):
        return max_failure
    pct = float(_PERCENT.match(max_failure).group(1))  # type: ignore[union-attr]
    return max(1, math.ceil(pct * world_size / 100 - 1e-9))


def _ns(seconds: float) -> int:
    return round(seconds * _NS_PER_S)


def _int(fields: dict[str, Any], name: str, *, lo: int, hi: int) -> int:
    value = fields[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(name, f"must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise ConfigError(name, f"must be between {lo} and {hi}, got {value}")
    return value


def _seconds(fields: dict[str, Any], name: str, *, allow_zero: bool) -> float:
    value = fields[name]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(name, f"must be a number of seconds, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(name, f"must be a finite number of seconds {bound}, got {value!r}")
    if value > 7 * 24 * 3600:
        raise ConfigError(name, f"must be at most one week (604800 s), got {value!r}")
    return value


def _max_failure(value: Any, world_size: int) -> int | str:
    if isinstance(value, bool):
        raise ConfigError("max_failure", f"must be null, a count or a percentage, got {value!r}")
    if isinstance(value, int):
        if not 1 <= value <= world_size:
            raise ConfigError("max_failure", f"must be between 1 and {world_size}, got {value}")
        return value
    if isinstance(value, str):
        m = _PERCENT.match(value)
        if m is None:
            raise ConfigError("max_failure", f"a percentage looks like '25%', got {value!r}")
        pct = float(m.group(1))
        if not 0 < pct <= 100:
            raise ConfigError("max_failure", f"percentage must be in (0, 100], got {value!r}")
        return f"{m.group(1)}%"
    raise ConfigError("max_failure", f"must be null, a count or a percentage, got {value!r}")
