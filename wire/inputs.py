"""The inputs of membership: one Struct per record kind, declared once, here.

A record's ``payload`` is one of these, encoded (``eventlog.record``: the log stores the payload's
canonical JSON, so a Struct with the same fields stores the same bytes). The fold decodes each
input it steps into its Struct (:func:`decode`) and dispatches on the class. An input an agent
sends is also its event: ``wire.protocol.agent_event`` makes the event the API decodes and the
agent emits from the input's own fields (:class:`OnWire` marks a field the wire bounds more
tightly than the log, or never sends), inside the envelope that says whose it is.

Each Struct's :meth:`Input.problem` is its ``invalid_event`` rule: ``None`` when a payload is well
formed, or a message naming the field that is missing or has the wrong type. A payload it
accepts always decodes. Checks that need the group (ranks in range, current incarnation, version
in flight) live with the fold; these only need the payload and the group's world size.

This module is pure: the fold, the host and the agent may import it.
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Union

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from . import ranks as rank_sets
from .ranks import RankSet, RankSetError, RankSetField

MAX_ID_LEN = 256
RECONFIGURE = "reconfigure"
OPS = ("activate", "deactivate", RECONFIGURE)
#: A reconfigure's uuid is torch's ``ReconfigureOptions.uuid``: a signed 64-bit integer.
UUID_RANGE = (-(2**63), 2**63)
#: The longest a reconfigure may wait to be admitted (``timeout_s``), as for every duration.
MAX_TIMEOUT_S = 7 * 24 * 3600.0
#: The fields only a reconfigure carries.
RECONFIGURE_FIELDS = ("incarnations", "uuid", "caller", "call", "timeout_s")

#: The largest group the protocol's bounds are stated for.
MAX_WORLD_SIZE = 65_536
#: A rank, and an incarnation, as the wire bounds them.
Rank = Annotated[int, Meta(ge=0, le=MAX_WORLD_SIZE - 1)]
Incarnation = Annotated[str, Meta(min_length=1, max_length=128)]
#: A view version, and a count (a pid, operations): what the wire and the log both bound at 0.
#: (Distinct types, by their description: ``wire.reference`` names a field's type by identity.)
Version = Annotated[int, Meta(ge=0, description="a view version")]
NonNegative = Annotated[int, Meta(ge=0)]
#: A short text of the wire (a host name, a reporter, a proposer), and an id (a key, a call).
ShortText = Annotated[str, Meta(max_length=256)]
Id = Annotated[str, Meta(min_length=1, max_length=MAX_ID_LEN)]


@dataclass(frozen=True, slots=True)
class OnWire:
    """How the wire carries a field of an input where that is not how the log stores it,
    marked on the field (``Annotated[stored, OnWire(wire)]``), so the field is declared once.

    The log keeps what it was given: the fold takes a stored payload by the field's own type
    and refuses one by the input's ``problem`` (its messages are recorded), while the API
    decodes an agent's event or an operator's body by ``type``, the wire's bound
    (:func:`wire_fields`). ``type`` None: the wire never carries the field (the host writes it,
    or an older protocol did, or a route sets it). ``required``: the wire requires a field the
    log may lack (an operator's input of the same kind has none). ``default``: the wire's,
    where the log has none (``UNSET``: a body may leave it out, and the route fills in the
    default the record then says).
    """

    type: Any
    required: bool = False
    default: Any = msgspec.NODEFAULT


#: A field the wire does not carry.
NOT_SENT = OnWire(None)


def wire_fields(input_cls: type[Struct], leave_out: Iterable[str] = ()) -> list[tuple[Any, ...]]:
    """The fields of a Struct of the wire made from an input (``msgspec.defstruct``'s), those
    of ``leave_out`` (the wire's envelope, which declares its own) and those the wire does not
    carry left out: each with its own type but for what its :class:`OnWire` says. A field the
    input may lack (``UNSET``) or hold as null is optional on the wire, null or absent alike,
    so that an encoder that omits defaults leaves it out of the record either way."""
    skip = set(leave_out)
    out: list[tuple[Any, ...]] = []
    for field in msgspec.structs.fields(input_cls):
        if field.name in skip:
            continue
        hint, mark = _marked(field.type)
        if mark is not None and mark.type is None:
            continue
        wire = _without_unset(hint) if mark is None else mark.type
        default: Any
        if mark is not None and mark.required:
            out.append((field.name, wire))
            continue
        if mark is not None and mark.default is not msgspec.NODEFAULT:
            default = mark.default
            wire = (
                wire | UnsetType if default is UNSET else wire | None if default is None else wire
            )
        elif field.default is msgspec.NODEFAULT and field.default_factory is msgspec.NODEFAULT:
            out.append((field.name, wire))
            continue
        elif field.default is UNSET or field.default is None:
            wire, default = wire | None, None
        elif field.default_factory is not msgspec.NODEFAULT:
            default = msgspec.field(default_factory=field.default_factory)
        else:
            default = field.default
        out.append((field.name, wire, default))
    return out


def _marked(hint: Any) -> tuple[Any, OnWire | None]:
    """A field's type as the log stores it, and its :class:`OnWire` mark (None if unmarked)."""
    if typing.get_origin(hint) is Annotated:
        marks = [m for m in hint.__metadata__ if isinstance(m, OnWire)]
        if marks:
            return hint.__origin__, marks[0]
    return hint, None


def _without_unset(hint: Any) -> Any:
    """A union type without ``msgspec.UnsetType``."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (Union, types.UnionType) and UnsetType in args:
        kept = tuple(a for a in args if a is not UnsetType)
        return kept[0] if len(kept) == 1 else Union[kept]  # noqa: UP007 - a type made here
    return hint


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text(payload: dict[str, Any], name: str, *, required: bool) -> str | None:
    if name not in payload or (payload[name] is None and not required):
        return f"{name} is required" if required else None
    value = payload[name]
    if not isinstance(value, str) or not value or len(value) > MAX_ID_LEN:
        return (
            f"{name} must be a non-empty string of at most {MAX_ID_LEN} characters, got {value!r}"
        )
    return None


def _optional_int(payload: dict[str, Any], name: str) -> str | None:
    value = payload.get(name)
    if value is not None and (not _is_int(value) or value < 0):
        return f"{name} must be a non-negative integer, got {value!r}"
    return None


def _check_join(payload: dict[str, Any], world_size: int) -> str | None:
    if (err := _text(payload, "incarnation", required=True)) is not None:
        return err
    if "host" in payload and payload["host"] is not None and not isinstance(payload["host"], str):
        return f"host must be a string, got {payload['host']!r}"
    return _optional_int(payload, "pid")


def _check_heartbeat(payload: dict[str, Any], world_size: int) -> str | None:
    """One rank's beat (``incarnation``, from an older log), or the beats of many ranks that
    arrived together, sharing one record: ``ranks``, a rank set (``wire.ranks``)."""
    if "ranks" in payload:
        if "incarnation" in payload:
            return "a shared heartbeat record names ranks, not an incarnation"
        return _rank_set(payload, "ranks", world_size) or _optional_int(payload, "version")
    return _text(payload, "incarnation", required=True) or _optional_int(payload, "version")


def _rank_set(payload: dict[str, Any], name: str, world_size: int) -> str | None:
    try:
        rank_sets.decode(payload[name], world_size, name=name)
    except RankSetError as exc:
        return str(exc)
    return None


def _check_ack(payload: dict[str, Any], world_size: int) -> str | None:
    if (err := _text(payload, "incarnation", required=True)) is not None:
        return err
    version = payload.get("version")
    if not _is_int(version) or version < 1:
        return f"version must be a positive integer, got {version!r}"
    return None


def _check_exit(payload: dict[str, Any], world_size: int) -> str | None:
    return _text(payload, "incarnation", required=True)


def _check_death(payload: dict[str, Any], world_size: int) -> str | None:
    return _text(payload, "incarnation", required=False) or _text(
        payload, "reporter", required=False
    )


def _check_links(payload: dict[str, Any], world_size: int) -> str | None:
    """A links report: ``down`` and ``hint`` rank sets (protocol 2), or, in records of an
    older log, ``peers`` {rank: "up"|"down"} and a ``failed_ranks_hint`` list."""
    if (err := _text(payload, "incarnation", required=True)) is not None:
        return err
    ready = payload.get("self_ready")
    if not isinstance(ready, bool):
        return f"self_ready must be true or false, got {ready!r}"
    legacy = "peers" in payload or "failed_ranks_hint" in payload
    if legacy and ("down" in payload or "hint" in payload):
        return "a links report carries down/hint or (protocol 1) peers/failed_ranks_hint, not both"
    if legacy:
        err = _check_legacy_links(payload, world_size)
    else:
        err = next(
            (
                e
                for n in ("down", "hint")
                if n in payload and (e := _rank_set(payload, n, world_size))
            ),
            None,
        )
    return err or next(
        (
            e
            for n in ("version", "reached", "failed", "issued", "completed")
            if (e := _optional_int(payload, n))
        ),
        None,
    )


def _check_legacy_links(payload: dict[str, Any], world_size: int) -> str | None:
    peers = payload.get("peers", {})
    if not isinstance(peers, dict):
        return f"peers must be an object of rank -> 'up'|'down', got {peers!r}"
    if not _plainly_good_peers(peers, world_size) and (err := _check_each_peer(peers, world_size)):
        return err
    hint = payload.get("failed_ranks_hint")
    if hint is not None:
        if not isinstance(hint, list):
            return f"failed_ranks_hint must be a list of ranks, got {hint!r}"
        bad = [r for r in hint if not _is_int(r) or not 0 <= r < world_size]
        if bad:
            return f"failed_ranks_hint names {bad!r}, not ranks in 0..{world_size - 1}"
    return None


_STATUSES = frozenset({"up", "down"})
#: world size -> the rank keys a peers map may use, as decimal strings ("0", "1", ...).
_rank_keys: dict[int, frozenset[str]] = {}


def _plainly_good_peers(peers: dict[Any, Any], world_size: int) -> bool:
    """The common case decided by two set comparisons in C: every key a plain decimal rank of
    the group, every value 'up' or 'down'. A full links report names every other rank, so a
    rank-by-rank loop here would cost a 512-rank group about a third of a millisecond per
    report. False sends the report to the rank-by-rank check, which words the error (and
    decides the rare spellings this test does not know, like "007")."""
    keys = _rank_keys.get(world_size)
    if keys is None:
        if len(_rank_keys) >= 64:
            _rank_keys.clear()
        keys = _rank_keys[world_size] = frozenset(map(str, range(world_size)))
    try:
        return peers.keys() <= keys and _STATUSES.issuperset(peers.values())
    except TypeError:  # an unhashable value
        return False


def _check_each_peer(peers: dict[Any, Any], world_size: int) -> str | None:
    for key, value in peers.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and int(key) < world_size):
            return f"peers key {key!r} is not a rank in 0..{world_size - 1}"
        if value not in ("up", "down"):
            return f"peers[{key!r}] must be 'up' or 'down', got {value!r}"
    return None


def _check_proposal(payload: dict[str, Any], world_size: int) -> str | None:
    """Malformed proposals are refused; well-formed ones naming bad ranks are logged and
    rejected later (so audits see them), hence ranks are not range-checked here.

    A ``reconfigure`` (torch's ``ProcessGroup.reconfigure``, one member's call) also carries
    ``incarnations`` (one per rank, in the same order: the members' handles), ``uuid`` (an
    integer), ``caller`` (the member whose call this is, an integer), an optional ``call``
    (the id of this call of the member: the same id again is the same call, sent again) and an
    optional ``timeout_s``; it takes no ``idempotency_key``. The other ops carry none of those
    fields."""
    op = payload.get("op")
    if op not in OPS:
        return f"op must be one of {list(OPS)}, got {op!r}"
    ranks = payload.get("ranks")
    if not isinstance(ranks, list) or not ranks:
        return f"ranks must be a non-empty list of ranks, got {ranks!r}"
    bad = [r for r in ranks if not _is_int(r)]
    if bad:
        return f"ranks must be integers; got {bad!r}"
    if len(ranks) > 65_536:
        return f"ranks names {len(ranks)} ranks; at most 65536"
    err = _text(payload, "proposer", required=False) or _text(
        payload, "idempotency_key", required=False
    )
    if err is not None:
        return err
    if op == RECONFIGURE:
        return _check_reconfigure(payload, ranks)
    extra = [name for name in RECONFIGURE_FIELDS if name in payload]
    if extra:
        return f"{', '.join(extra)} belong to a reconfigure, not to {op}"
    return None


def _check_reconfigure(payload: dict[str, Any], ranks: list[int]) -> str | None:
    if payload.get("idempotency_key") is not None:
        return "a reconfigure takes no idempotency_key: its uuid is its key"
    incarnations = payload.get("incarnations")
    if not isinstance(incarnations, list) or len(incarnations) != len(ranks):
        return (
            f"incarnations must be a list of {len(ranks)} incarnations, one per rank in the "
            f"order of ranks, got {incarnations!r}"
        )
    for i, inc in enumerate(incarnations):
        if not isinstance(inc, str) or not inc or len(inc) > MAX_ID_LEN:
            return (
                f"incarnations[{i}] must be a non-empty string of at most {MAX_ID_LEN} "
                f"characters, got {inc!r}"
            )
    uuid = payload.get("uuid")
    lo, hi = UUID_RANGE
    if not _is_int(uuid) or not lo <= uuid < hi:
        return f"uuid must be a signed 64-bit integer, got {uuid!r}"
    caller = payload.get("caller")
    if not _is_int(caller):
        return f"caller must be the calling member's rank, got {caller!r}"
    if (err := _text(payload, "call", required=False)) is not None:
        return err
    timeout = payload.get("timeout_s")
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or not 0 < timeout <= MAX_TIMEOUT_S
    ):
        return f"timeout_s must be a number of seconds in (0, {MAX_TIMEOUT_S:.0f}], got {timeout!r}"
    return None


def _check_group_ended(payload: dict[str, Any], world_size: int) -> str | None:
    """``{"reason"?: text, "delete"?: bool}``."""
    if "delete" in payload and not isinstance(payload["delete"], bool):
        return f"delete must be true or false, got {payload['delete']!r}"
    return _text(payload, "reason", required=False)


def _no_problem(payload: dict[str, Any], world_size: int) -> str | None:
    return None


# -- the inputs --------------------------------------------------------------------------------


class Input(Struct, frozen=True, kw_only=True, gc=False):
    """A record's payload, typed: the base of every input's Struct."""

    #: the record kind whose payload this is
    kind: ClassVar[str]
    #: the ``invalid_event`` rule: ``(payload, world_size) -> message | None``
    problem: ClassVar[Callable[[dict[str, Any], int], str | None]]


class GroupCreatedInput(Input, frozen=True, kw_only=True, gc=False):
    """``group_created``: ``world_size`` and the group's ``config`` (an object the fold's
    ``GroupConfig`` reads and words the problems of; so both are taken as they come here)."""

    kind = "group_created"
    problem = staticmethod(_no_problem)
    world_size: Any = UNSET
    config: Any = UNSET


class GroupEndedInput(Input, frozen=True, kw_only=True, gc=False):
    """``group_ended``: the operator ends the group's run, and may delete it."""

    kind = "group_ended"
    problem = staticmethod(_check_group_ended)
    reason: Annotated[str | None, OnWire(Id)] = None
    #: ``DELETE /groups/{group}`` sets it
    delete: Annotated[bool, NOT_SENT] = False


class JoinInput(Input, frozen=True, kw_only=True, gc=False):
    """``join``: an incarnation of the record's rank joins; ``host`` and ``pid`` say where it
    runs (absent: what the fold knew stays)."""

    kind = "join"
    problem = staticmethod(_check_join)
    incarnation: str
    host: Annotated[str | None | UnsetType, OnWire(ShortText)] = UNSET
    pid: NonNegative | None | UnsetType = UNSET


class HeartbeatInput(Input, frozen=True, kw_only=True, gc=False):
    """``heartbeat``: one rank's beat (``incarnation``, the view ``version`` it holds), or the
    beats of many ranks that arrived together (``ranks``, a rank set; the record names no rank)."""

    kind = "heartbeat"
    problem = staticmethod(_check_heartbeat)
    incarnation: str | None = None
    version: Version | None = None
    #: the host writes it (``coordinator.fold.heartbeats``)
    ranks: Annotated[RankSet | None, NOT_SENT] = None


class LinksInput(Input, frozen=True, kw_only=True, gc=False):
    """A rank's evidence about its data-plane links; it replaces its previous report. Every
    peer not named in ``down`` or ``hint`` is up."""

    kind = "links"
    problem = staticmethod(_check_links)
    incarnation: str
    self_ready: bool
    down: Annotated[RankSet, OnWire(RankSetField)] = []
    hint: Annotated[RankSet, OnWire(RankSetField)] = []
    #: the view this evidence is about
    version: Version | None = None
    #: "I built view ``reached`` and reached every member" (the claim behind the empty ``down``)
    reached: Version | None = None
    #: "view ``failed`` failed here and its hint blames nobody" (a collective timed out with
    #: every member alive); ``issued`` and ``completed`` are the operations this rank had
    #: started and finished successfully on it when it failed (``coordinator.fold.stalls``)
    failed: Version | None = None
    issued: NonNegative | None = None
    completed: NonNegative | None = None
    #: protocol 1's, in records of an older log (an agent of protocol 2 is refused them)
    peers: Annotated[dict[str, str] | None, NOT_SENT] = None
    failed_ranks_hint: Annotated[list[int] | None, NOT_SENT] = None

    @property
    def legacy(self) -> bool:
        """A protocol-1 report (``peers``/``failed_ranks_hint``)."""
        return self.peers is not None or self.failed_ranks_hint is not None

    def down_ranks(self, world_size: int) -> set[int]:
        """The ranks it reports down: ``down`` and ``hint`` (protocol 1: the peers it calls
        down and ``failed_ranks_hint``)."""
        if self.legacy:
            out = {int(p) for p, status in (self.peers or {}).items() if status == "down"}
            out.update(self.failed_ranks_hint or ())
            return out
        out = set()
        if self.down:
            out.update(rank_sets.decode(self.down, world_size, name="down"))
        if self.hint:
            out.update(rank_sets.decode(self.hint, world_size, name="hint"))
        return out


class AckInput(Input, frozen=True, kw_only=True, gc=False):
    """``ack``: the rank holds view ``version`` prepared."""

    kind = "ack"
    problem = staticmethod(_check_ack)
    incarnation: str
    version: Version


class ExitInput(Input, frozen=True, kw_only=True, gc=False):
    """``exit``: the rank's incarnation leaves cleanly."""

    kind = "exit"
    problem = staticmethod(_check_exit)
    incarnation: str


class DeathReportedInput(Input, frozen=True, kw_only=True, gc=False):
    """``death_reported``: a supervisor (``reporter``) saw the rank's process die; without an
    ``incarnation``, whichever incarnation the rank has."""

    kind = "death_reported"
    problem = staticmethod(_check_death)
    incarnation: Annotated[str | None, OnWire(Incarnation)] = None
    reporter: Annotated[str | None, OnWire(ShortText)] = None


class ProposalInput(Input, frozen=True, kw_only=True, gc=False):
    """``proposal``: activate or deactivate ``ranks``, or one member's call of torch's
    reconfigure (which alone carries ``incarnations``, ``uuid``, ``caller``, ``call`` and
    ``timeout_s``; see :func:`_check_proposal`)."""

    kind = "proposal"
    problem = staticmethod(_check_proposal)
    op: Annotated[str, OnWire(Literal["activate", "deactivate", "reconfigure"])]
    ranks: Annotated[
        list[int], OnWire(Annotated[list[Rank], Meta(min_length=1, max_length=65_536)])
    ]
    proposer: Annotated[str | None, OnWire(ShortText)] = None
    idempotency_key: Annotated[str | None, OnWire(Id)] = None
    incarnations: Annotated[
        list[str] | None,
        OnWire(Annotated[list[Incarnation], Meta(min_length=1, max_length=65_536)]),
    ] = None
    uuid: Annotated[
        int | None, OnWire(Annotated[int, Meta(ge=UUID_RANGE[0], le=UUID_RANGE[1] - 1)])
    ] = None
    caller: Annotated[int | None, OnWire(Rank)] = None
    call: Annotated[str | None, OnWire(Id)] = None
    #: the wire's is a float (an int sent is stored as 5.0), the log's either
    timeout_s: Annotated[
        int | float | None, OnWire(Annotated[float, Meta(gt=0, le=int(MAX_TIMEOUT_S))])
    ] = None

    @property
    def caller_incarnation(self) -> str:
        """A reconfigure's caller's own handle's incarnation (the caller is a member)."""
        assert self.incarnations is not None
        return self.incarnations[self.ranks.index(self.caller)]  # type: ignore[arg-type]


class TickInput(Input, frozen=True, kw_only=True, gc=False):
    """``tick``: time passed; ``resumed`` true says the coordinator (re)started serving. The
    host alone appends ticks, so nothing about one is refused."""

    kind = "tick"
    problem = staticmethod(_no_problem)
    resumed: Any = None


#: The Struct of each membership kind.
INPUTS: dict[str, type[Input]] = {
    cls.kind: cls
    for cls in (
        GroupCreatedInput,
        GroupEndedInput,
        JoinInput,
        HeartbeatInput,
        LinksInput,
        AckInput,
        ExitInput,
        DeathReportedInput,
        ProposalInput,
        TickInput,
    )
}


def decode(kind: str, payload: dict[str, Any]) -> Input:
    """The typed input of a payload its Struct's :meth:`Input.problem` accepted."""
    return msgspec.convert(payload, INPUTS[kind])


def problem(kind: str, payload: dict[str, Any], world_size: int) -> str | None:
    """The ``invalid_event`` message of a membership payload, or None."""
    return INPUTS[kind].problem(payload, world_size)
