"""Refit plans: what moves from a publisher group (M trainers) to a subscriber group (N generators).

A plan is **declared, never inferred**: every parameter names its dtype, its global shape and,
on each side, how that side's mesh holds it. Nothing here guesses a sharding from a parameter's
name; :func:`megatron_params` derives the usual tensor-parallel layout only from roles the user
gives (``column``, ``row``, ``replicated``), and is opt-in.

The words:

- A :class:`MeshSpec` is one side's mesh: ``size`` slots, arranged as ``size // tp`` replicas of
  ``tp`` tensor-parallel ranks; slot ``s`` is tensor-parallel rank ``s % tp`` of replica
  ``s // tp``.
- A :class:`Placement` says how one parameter lies on a mesh: :func:`replicate` (every slot holds
  the whole tensor) or :func:`shard` (``dim``) (split along ``dim``).
- A :class:`ParamPlan` is one parameter on one side: name, dtype, global shape, placement,
  ``partition_count`` (how many equal partitions along the shard dim) and ``rank_offset`` (the
  tensor-parallel rank that holds partition 0). Partition ``k`` is held by tensor-parallel rank
  ``rank_offset + k`` of every replica; tensor-parallel ranks outside
  ``rank_offset .. rank_offset + partition_count - 1`` hold none of it. A replicated parameter
  has one partition (the whole tensor) and offset 0.
- A :class:`Layout` is one side: its mesh and one :class:`ParamPlan` per parameter.
- A :class:`ReshardPlan` is the two layouts plus the **bulk** set (parameters sent as pieces,
  each subscriber shard assembled from the publisher partitions that overlap it) and the **misc**
  list (small replicated tensors packed, in list order, into one payload per subscriber).

The gates, applied when a value is built or decoded, each refusing with a :class:`PlanError`
that names what was wrong:

- **Shape**: sizes are positive and bounded (:data:`MAX_DIM`, :data:`MAX_NDIM`,
  :data:`MAX_PARAM_BYTES`, :data:`MAX_SLOTS`), dtypes are known (:data:`DTYPES`), a partition
  count divides its dimension, a partition range lies inside the mesh's tensor-parallel ranks.
- **Agreement**: both sides declare the same parameters with the same dtype and shape.
- **Coverage**: bulk and misc together name every parameter exactly once.

:func:`digest` is the canonical digest every participant computes and compares before any byte
moves (the control plane admits a refit only when every member joined with the same one). It is
order-independent over the bulk set and over each side's parameter list, in order over the misc
list (its order is the payload layout), and every field that changes the transfer changes it.

:func:`schedule` turns a plan and a lane count into the transfer's pieces: who sends which region
of which parameter to whom, on which lane, under which tag; every participant derives the same
schedule from the same plan. :func:`decode_plan` and :func:`decode_bootstrap` read the values the
control plane carries over the wire, with clear errors for hostile input.

The torch data plane that carries out a schedule is ``agent.refit`` (this module is pure: no
torch, no I/O).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import msgspec
from msgspec import Struct
from msgspec.structs import force_setattr

#: Element size in bytes of each dtype a plan may name (torch's names, without ``torch.``).
DTYPES: Mapping[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}

#: Bounds that keep a hostile or mistaken plan from being accepted only to fail (or hang) later.
MAX_NDIM = 16
MAX_DIM = 2**40
MAX_PARAM_BYTES = 2**42
MAX_SLOTS = 65_536
MAX_PARAMS = 1_000_000
MAX_NAME = 1024
MAX_LANES = 64
#: The largest encoded plan :func:`decode_plan` reads.
MAX_PLAN_BYTES = 64 * 2**20
#: A region held by several publishers is split among them only from this size up: below it one
#: message is cheaper than several.
SPLIT_MIN_BYTES = 2**20

Side = Literal["publisher", "subscriber"]
SIDES: tuple[Side, Side] = ("publisher", "subscriber")

#: A region of a tensor in global coordinates: ``(start, stop)`` per dimension.
Region = tuple[tuple[int, int], ...]


class PlanError(ValueError):
    """A refit plan (or a piece of one) that is malformed; the message names what is wrong."""


def _names(names: Iterable[str], limit: int = 10) -> str:
    items = sorted(names)
    shown = ", ".join(repr(n) for n in items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _int(value: Any, what: str, low: int, high: int) -> int:
    if type(value) is not int:
        raise PlanError(f"{what} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise PlanError(f"{what} must be in {low}..{high}, got {value}")
    return value


def _text(value: Any, what: str, *, empty: bool = False) -> str:
    if not isinstance(value, str):
        raise PlanError(f"{what} must be a string, got {value!r}")
    if not value and not empty:
        raise PlanError(f"{what} must not be empty")
    if len(value) > MAX_NAME:
        raise PlanError(f"{what} is {len(value)} characters long; at most {MAX_NAME}")
    if not value.isprintable():
        raise PlanError(f"{what} {value[:80]!r} contains unprintable characters")
    return value


def _tuple(obj: Struct, field: str, value: Any, what: str) -> tuple:
    if isinstance(value, list):
        value = tuple(value)
        force_setattr(obj, field, value)
    if not isinstance(value, tuple):
        raise PlanError(f"{what} must be a list, got {value!r}")
    return value


class Placement(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How a parameter lies on a mesh: ``replicate`` (whole on every slot) or ``shard`` along ``dim``."""

    kind: Literal["replicate", "shard"]
    dim: int | None = None

    def __post_init__(self) -> None:
        if self.kind == "replicate":
            if self.dim is not None:
                raise PlanError(f"a replicated placement has no dim, got dim={self.dim!r}")
        elif self.kind == "shard":
            _int(self.dim, "a shard placement's dim", 0, MAX_NDIM - 1)
        else:
            raise PlanError(f"placement kind must be 'replicate' or 'shard', got {self.kind!r}")

    def __str__(self) -> str:
        return "replicate" if self.kind == "replicate" else f"shard({self.dim})"


def replicate() -> Placement:
    """Every slot holds the whole tensor."""
    return Placement(kind="replicate")


def shard(dim: int) -> Placement:
    """The tensor is split into equal partitions along ``dim``."""
    return Placement(kind="shard", dim=dim)


class MeshSpec(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One side's mesh: ``size`` slots as ``size // tp`` replicas of ``tp`` tensor-parallel ranks."""

    name: str
    size: int
    tp: int = 1

    def __post_init__(self) -> None:
        _text(self.name, "mesh name")
        _int(self.size, f"mesh {self.name!r} size", 1, MAX_SLOTS)
        _int(self.tp, f"mesh {self.name!r} tp", 1, MAX_SLOTS)
        if self.size % self.tp:
            raise PlanError(
                f"mesh {self.name!r}: tp={self.tp} does not divide its size {self.size}"
            )

    @property
    def replicas(self) -> int:
        return self.size // self.tp


class ParamPlan(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One parameter on one side; see the module docstring for what each field means.

    ``group_key`` names the unit a subscriber loads together (a layer, a fused projection): the
    parameters of one group travel on one lane. Empty means the parameter is its own group.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    placement: Placement
    partition_count: int = 1
    rank_offset: int = 0
    group_key: str = ""

    def __post_init__(self) -> None:
        name = _text(self.name, "parameter name")
        if self.dtype not in DTYPES:
            raise PlanError(
                f"{name}: unknown dtype {self.dtype!r}; known: {', '.join(sorted(DTYPES))}"
            )
        shape = _tuple(self, "shape", self.shape, f"{name}: shape")
        if len(shape) > MAX_NDIM:
            raise PlanError(f"{name}: shape has {len(shape)} dimensions; at most {MAX_NDIM}")
        for i, n in enumerate(shape):
            _int(n, f"{name}: shape[{i}]", 1, MAX_DIM)
        if math.prod(shape) * DTYPES[self.dtype] > MAX_PARAM_BYTES:
            raise PlanError(f"{name}: shape {list(shape)} is over {MAX_PARAM_BYTES} bytes")
        if not isinstance(self.placement, Placement):
            raise PlanError(f"{name}: placement must be a Placement, got {self.placement!r}")
        _int(self.partition_count, f"{name}: partition_count", 1, MAX_SLOTS)
        _int(self.rank_offset, f"{name}: rank_offset", 0, MAX_SLOTS)
        _text(self.group_key, f"{name}: group_key", empty=True)
        if self.placement.kind == "replicate":
            if self.partition_count != 1 or self.rank_offset != 0:
                raise PlanError(
                    f"{name}: a replicated parameter has partition_count 1 and rank_offset 0, "
                    f"got {self.partition_count} and {self.rank_offset}"
                )
            return
        dim = self.placement.dim
        assert dim is not None
        if dim >= len(shape):
            raise PlanError(f"{name}: shard dim {dim} is outside its shape {list(shape)}")
        if shape[dim] % self.partition_count:
            raise PlanError(
                f"{name}: partition_count {self.partition_count} does not divide "
                f"shape[{dim}] = {shape[dim]}"
            )

    @property
    def group(self) -> str:
        """The effective group key: the declared one, or the name."""
        return self.group_key or self.name

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPES[self.dtype]

    def partition_region(self, k: int) -> Region:
        """Partition ``k``'s region of the global tensor."""
        region = [(0, n) for n in self.shape]
        if self.placement.kind == "shard":
            dim = self.placement.dim
            assert dim is not None
            step = self.shape[dim] // self.partition_count
            region[dim] = (k * step, (k + 1) * step)
        return tuple(region)


class Layout(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One side of a refit: its mesh and how it holds each parameter."""

    mesh: MeshSpec
    params: tuple[ParamPlan, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.mesh, MeshSpec):
            raise PlanError(f"layout mesh must be a MeshSpec, got {self.mesh!r}")
        params = _tuple(self, "params", self.params, f"mesh {self.mesh.name!r}: params")
        if len(params) > MAX_PARAMS:
            raise PlanError(
                f"mesh {self.mesh.name!r}: {len(params)} parameters; at most {MAX_PARAMS}"
            )
        seen: set[str] = set()
        twice: set[str] = set()
        for p in params:
            if not isinstance(p, ParamPlan):
                raise PlanError(
                    f"mesh {self.mesh.name!r}: a parameter must be a ParamPlan, got {p!r}"
                )
            (twice if p.name in seen else seen).add(p.name)
            if p.rank_offset + p.partition_count > self.mesh.tp:
                raise PlanError(
                    f"{p.name}: partitions {p.rank_offset}..{p.rank_offset + p.partition_count - 1}"
                    f" lie outside the tensor-parallel ranks 0..{self.mesh.tp - 1} of mesh "
                    f"{self.mesh.name!r}"
                )
        if twice:
            raise PlanError(f"mesh {self.mesh.name!r} declares {_names(twice)} more than once")

    def param(self, name: str) -> ParamPlan:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def by_name(self) -> dict[str, ParamPlan]:
        return {p.name: p for p in self.params}

    def holders(self, param: ParamPlan, k: int) -> tuple[int, ...]:
        """The slots that hold partition ``k`` of ``param``, in increasing order."""
        tp = self.mesh.tp
        if param.placement.kind == "replicate":
            return tuple(range(self.mesh.size))
        return tuple(r * tp + param.rank_offset + k for r in range(self.mesh.replicas))

    def partition_of(self, param: ParamPlan, slot: int) -> int | None:
        """The partition of ``param`` that ``slot`` holds, or None when it holds none."""
        _int(slot, f"slot of mesh {self.mesh.name!r}", 0, self.mesh.size - 1)
        if param.placement.kind == "replicate":
            return 0
        k = slot % self.mesh.tp - param.rank_offset
        return k if 0 <= k < param.partition_count else None

    def local_region(self, param: ParamPlan, slot: int) -> Region | None:
        """The region of the global tensor ``slot`` holds, or None."""
        k = self.partition_of(param, slot)
        return None if k is None else param.partition_region(k)

    def local_shape(self, name: str, slot: int) -> tuple[int, ...] | None:
        """The shape of the tensor ``slot`` holds of parameter ``name``, or None."""
        region = self.local_region(self.param(name), slot)
        return None if region is None else tuple(b - a for a, b in region)


class ReshardPlan(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A whole refit: both layouts, the bulk set and the misc list (see the module docstring)."""

    publisher: Layout
    subscriber: Layout
    bulk: tuple[str, ...]
    misc: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for side in SIDES:
            if not isinstance(getattr(self, side), Layout):
                raise PlanError(f"{side} must be a Layout, got {getattr(self, side)!r}")
        bulk = _tuple(self, "bulk", self.bulk, "bulk")
        misc = _tuple(self, "misc", self.misc, "misc")
        for name in (*bulk, *misc):
            _text(name, "a bulk or misc name")
        pub, sub = self.publisher.by_name(), self.subscriber.by_name()
        if pub.keys() != sub.keys():
            only_pub, only_sub = pub.keys() - sub.keys(), sub.keys() - pub.keys()
            raise PlanError(
                "the two sides declare different parameters:"
                + (f" only the publisher declares {_names(only_pub)};" if only_pub else "")
                + (f" only the subscriber declares {_names(only_sub)};" if only_sub else "")
            )
        for name, p in pub.items():
            s = sub[name]
            if (p.dtype, p.shape) != (s.dtype, s.shape):
                raise PlanError(
                    f"{name}: the publisher declares {p.dtype}{list(p.shape)}, the subscriber "
                    f"{s.dtype}{list(s.shape)}"
                )
        _check_coverage(pub.keys(), bulk, misc)
        for name in misc:
            for side, p in (("publisher", pub[name]), ("subscriber", sub[name])):
                if p.placement.kind != "replicate":
                    raise PlanError(
                        f"misc parameter {name!r} is {p.placement} on the {side}; misc "
                        "parameters are replicated on both sides (put sharded ones in bulk)"
                    )

    def layout(self, side: Side) -> Layout:
        if side not in SIDES:
            raise PlanError(f"side must be one of {SIDES}, got {side!r}")
        return self.publisher if side == "publisher" else self.subscriber


def _check_coverage(declared: Iterable[str], bulk: Sequence[str], misc: Sequence[str]) -> None:
    """Coverage gate: bulk and misc together name every declared parameter exactly once."""
    declared = set(declared)
    listed = [*bulk, *misc]
    counts: dict[str, int] = {}
    for name in listed:
        counts[name] = counts.get(name, 0) + 1
    problems = []
    missing = declared - counts.keys()
    if missing:
        problems.append(f"missing from bulk and misc: {_names(missing)}")
    twice = {n for n, c in counts.items() if c > 1}
    if twice:
        problems.append(f"named more than once: {_names(twice)}")
    unknown = counts.keys() - declared
    if unknown:
        problems.append(f"named but not declared: {_names(unknown)}")
    if problems:
        raise PlanError(
            f"coverage: bulk and misc must name each of the {len(declared)} parameters exactly "
            "once; " + "; ".join(problems)
        )


def make_plan(publisher: Layout, subscriber: Layout, misc: Sequence[str] = ()) -> ReshardPlan:
    """The plan whose bulk set is every declared parameter not in ``misc``."""
    names = {p.name for p in publisher.params}
    return ReshardPlan(
        publisher=publisher,
        subscriber=subscriber,
        bulk=tuple(sorted(names - set(misc))),
        misc=tuple(misc),
    )


# -- the digest ------------------------------------------------------------------------------------

#: The digest's format tag: a change to what it covers changes the tag.
DIGEST_FORMAT = "foldplane.refit.v1"


def _side_entry(p: ParamPlan) -> dict[str, Any]:
    return {
        "placement": p.placement.kind,
        "dim": p.placement.dim,
        "partition_count": p.partition_count,
        "rank_offset": p.rank_offset,
        "group": p.group,
    }


def _param_entry(plan: ReshardPlan, name: str) -> dict[str, Any]:
    p, s = plan.publisher.param(name), plan.subscriber.param(name)
    return {
        "name": name,
        "dtype": p.dtype,
        "shape": list(p.shape),
        "publisher": _side_entry(p),
        "subscriber": _side_entry(s),
    }


def canonical(plan: ReshardPlan) -> bytes:
    """The canonical bytes :func:`digest` hashes (sorted keys, no spaces, ASCII)."""
    body = {
        "format": DIGEST_FORMAT,
        "publisher": msgspec.to_builtins(plan.publisher.mesh),
        "subscriber": msgspec.to_builtins(plan.subscriber.mesh),
        "bulk": [_param_entry(plan, n) for n in sorted(plan.bulk)],
        "misc": [_param_entry(plan, n) for n in plan.misc],
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def digest(plan: ReshardPlan) -> str:
    """The plan's canonical digest, sha256 in hex; equal plans (as transfers) digest equally."""
    return hashlib.sha256(canonical(plan)).hexdigest()


# -- the schedule ----------------------------------------------------------------------------------


class Piece(Struct, frozen=True, kw_only=True):
    """One message: ``src`` (publisher slot) sends ``region`` of ``name`` to ``dst`` (subscriber
    slot) on ``lane``, under ``tag``. A misc payload has ``name == ""`` and an empty region."""

    tag: int
    name: str
    src: int
    dst: int
    lane: int
    region: Region
    nbytes: int

    @property
    def is_misc(self) -> bool:
        return self.name == ""


class Schedule(Struct, frozen=True, kw_only=True):
    """Every message of a transfer, in tag order, and the misc payload's layout."""

    lanes: int
    pieces: tuple[Piece, ...]
    #: ``(name, byte offset, byte length)`` of each misc parameter in a misc payload.
    misc_layout: tuple[tuple[str, int, int], ...]

    def sent_by(self, src: int) -> tuple[Piece, ...]:
        return tuple(p for p in self.pieces if p.src == src)

    def received_by(self, dst: int) -> tuple[Piece, ...]:
        return tuple(p for p in self.pieces if p.dst == dst)


def _intersect(a: Region, b: Region) -> Region | None:
    out = tuple((max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b, strict=True))
    return out if all(lo < hi for lo, hi in out) else None


def _split(region: Region, parts: int) -> list[Region]:
    """``region`` cut into at most ``parts`` near-equal chunks along its first dimension."""
    if not region:
        return [region]
    (lo, hi), rest = region[0], region[1:]
    parts = min(parts, hi - lo)
    bounds = [lo + (hi - lo) * j // parts for j in range(parts + 1)]
    return [((bounds[j], bounds[j + 1]), *rest) for j in range(parts)]


def _region_bytes(region: Region, dtype: str) -> int:
    return math.prod(hi - lo for lo, hi in region) * DTYPES[dtype]


def assign_lanes(plan: ReshardPlan, lanes: int) -> dict[str, int]:
    """Each bulk group (the subscriber's group key) -> its lane.

    Groups are placed largest first (ties by key) on the least loaded lane (ties by index), so
    the bytes spread evenly and every participant computes the same assignment.
    """
    _int(lanes, "lanes", 1, MAX_LANES)
    sizes: dict[str, int] = {}
    for name in plan.bulk:
        p = plan.subscriber.param(name)
        sizes[p.group] = sizes.get(p.group, 0) + p.nbytes
    load = [0] * lanes
    lane_of: dict[str, int] = {}
    for group in sorted(sizes, key=lambda g: (-sizes[g], g)):
        lane = min(range(lanes), key=lambda i: (load[i], i))
        lane_of[group] = lane
        load[lane] += sizes[group]
    return lane_of


def schedule(plan: ReshardPlan, lanes: int) -> Schedule:
    """Every message of the transfer of ``plan`` over ``lanes`` lanes, deterministically.

    Each subscriber slot's region of each bulk parameter is cut where the publisher partitions
    overlapping it end; a cut held by several publisher slots (replicas, or a replicated
    parameter) is split among them from :data:`SPLIT_MIN_BYTES` up, and otherwise taken from
    the holder picked by the subscriber slot, so that no one root sends everything. A group's
    pieces ride its lane (:func:`assign_lanes`). Each subscriber gets one misc payload, from
    publisher slot ``dst % M``, on lane ``dst % lanes``.
    """
    lane_of = assign_lanes(plan, lanes)
    pub, sub = plan.publisher, plan.subscriber
    pieces: list[Piece] = []
    for name in sorted(plan.bulk):
        pp, sp = pub.param(name), sub.param(name)
        for dst in range(sub.mesh.size):
            want = sub.local_region(sp, dst)
            if want is None:
                continue
            for k in range(pp.partition_count):
                cut = _intersect(want, pp.partition_region(k))
                if cut is None:
                    continue
                holders = pub.holders(pp, k)
                many = len(holders) > 1 and _region_bytes(cut, pp.dtype) >= SPLIT_MIN_BYTES
                chunks = _split(cut, len(holders)) if many else [cut]
                for j, chunk in enumerate(chunks):
                    pieces.append(
                        Piece(
                            tag=len(pieces),
                            name=name,
                            src=holders[(dst + k + j) % len(holders)],
                            dst=dst,
                            lane=lane_of[sp.group],
                            region=chunk,
                            nbytes=_region_bytes(chunk, pp.dtype),
                        )
                    )
    misc_layout: list[tuple[str, int, int]] = []
    offset = 0
    for name in plan.misc:
        n = pub.param(name).nbytes
        misc_layout.append((name, offset, n))
        offset += n
    if plan.misc:
        for dst in range(sub.mesh.size):
            pieces.append(
                Piece(
                    tag=len(pieces),
                    name="",
                    src=dst % pub.mesh.size,
                    dst=dst,
                    lane=dst % lanes,
                    region=(),
                    nbytes=offset,
                )
            )
    return Schedule(lanes=lanes, pieces=tuple(pieces), misc_layout=tuple(misc_layout))


# -- the opt-in Megatron-style derivation ------------------------------------------------------------

ROLES = ("column", "row", "replicated")


def megatron_params(
    mesh: MeshSpec,
    tensors: Mapping[str, tuple[str, Sequence[int]]],
    roles: Mapping[str, str],
    *,
    group_keys: Mapping[str, str] | None = None,
) -> tuple[ParamPlan, ...]:
    """Megatron-style tensor-parallel plans from roles the user declares, over ``mesh.tp`` ranks.

    ``tensors`` maps each parameter name to ``(dtype, global shape)``; ``roles`` gives each one a
    role: ``column`` (split along dim 0: a column-parallel weight or its bias, an embedding split
    by vocabulary), ``row`` (split along dim 1: a row-parallel weight; its bias is
    ``replicated``), or ``replicated``. A parameter without a role, a role for an unknown
    parameter, or an unknown role is refused: nothing is guessed from a name.
    """
    missing = tensors.keys() - roles.keys()
    if missing:
        raise PlanError(f"no role declared for {_names(missing)} (roles: {', '.join(ROLES)})")
    unknown = roles.keys() - tensors.keys()
    if unknown:
        raise PlanError(f"roles given for parameters that do not exist: {_names(unknown)}")
    out = []
    for name in sorted(tensors):
        dtype, shape = tensors[name]
        role = roles[name]
        key = (group_keys or {}).get(name, "")
        if role == "replicated":
            placement, count = replicate(), 1
        elif role == "column":
            placement, count = shard(0), mesh.tp
        elif role == "row":
            if len(shape) < 2:
                raise PlanError(
                    f"{name}: a row-parallel parameter has at least 2 dimensions, got shape "
                    f"{list(shape)} (a row-parallel layer's bias is 'replicated')"
                )
            placement, count = shard(1), mesh.tp
        else:
            raise PlanError(f"{name}: unknown role {role!r}; roles: {', '.join(ROLES)}")
        out.append(
            ParamPlan(
                name=name,
                dtype=dtype,
                shape=tuple(shape),
                placement=placement,
                partition_count=count,
                group_key=key,
            )
        )
    return tuple(out)


def megatron_layout(
    mesh: MeshSpec,
    tensors: Mapping[str, tuple[str, Sequence[int]]],
    roles: Mapping[str, str],
    *,
    group_keys: Mapping[str, str] | None = None,
) -> Layout:
    """:func:`megatron_params` as a :class:`Layout` of ``mesh``."""
    return Layout(mesh=mesh, params=megatron_params(mesh, tensors, roles, group_keys=group_keys))


# -- on the wire ---------------------------------------------------------------------------------------


def encode_plan(plan: ReshardPlan) -> bytes:
    """The plan as JSON (what :func:`decode_plan` reads)."""
    return msgspec.json.encode(plan)


def _decode(data: bytes | str | Mapping[str, Any], kind: type, what: str) -> Any:
    try:
        if isinstance(data, (bytes, bytearray, memoryview, str)):
            size = len(data.encode() if isinstance(data, str) else data)
            if size > MAX_PLAN_BYTES:
                raise PlanError(f"{what} is {size} bytes; at most {MAX_PLAN_BYTES}")
            return msgspec.json.decode(data, type=kind)
        return msgspec.convert(data, kind)
    except PlanError:
        raise
    except RecursionError:
        raise PlanError(f"{what} is nested too deeply") from None
    except msgspec.ValidationError as e:
        raise PlanError(f"invalid {what}: {e}") from None
    except msgspec.DecodeError as e:
        raise PlanError(f"{what} is not valid JSON: {e}") from None


def decode_plan(data: bytes | str | Mapping[str, Any]) -> ReshardPlan:
    """A :class:`ReshardPlan` from JSON or from builtins (``msgspec.to_builtins`` of one).

    Every gate runs; anything malformed, unknown fields included, raises :class:`PlanError`.
    """
    return _decode(data, ReshardPlan, "refit plan")


BACKENDS = ("gloo", "nccl")


class Bootstrap(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A refit world's rendezvous: the TCPStore address, the world's key prefix, the backend.

    Publisher slot 0 makes it (``agent.refit.make_bootstrap``); the control plane hands it to the
    admitted members. A new attempt always has a new prefix.
    """

    store: str
    prefix: str
    backend: Literal["gloo", "nccl"] = "gloo"

    def __post_init__(self) -> None:
        host, port = self.address
        _text(host, "bootstrap store host")
        _text(self.prefix, "bootstrap prefix")
        if "/" in self.prefix:
            raise PlanError(f"bootstrap prefix {self.prefix!r} must not contain '/'")
        if self.backend not in BACKENDS:
            raise PlanError(f"bootstrap backend must be one of {BACKENDS}, got {self.backend!r}")

    @property
    def address(self) -> tuple[str, int]:
        if not isinstance(self.store, str):
            raise PlanError(f"bootstrap store must be 'host:port', got {self.store!r}")
        host, sep, port = self.store.rpartition(":")
        if not sep or not host or not (port.isascii() and port.isdigit()) or len(port) > 5:
            raise PlanError(f"bootstrap store must be 'host:port', got {self.store!r}")
        return host, _int(int(port), "bootstrap store port", 1, 65_535)

    def as_dict(self) -> dict[str, str]:
        return {"store": self.store, "prefix": self.prefix, "backend": self.backend}


def decode_bootstrap(data: bytes | str | Mapping[str, Any]) -> Bootstrap:
    """A :class:`Bootstrap` from JSON or a dict; malformed input raises :class:`PlanError`."""
    return _decode(data, Bootstrap, "refit bootstrap")
