"""Every update the coordinator sends an agent, declared once (docs/protocol.md).

An update is a Struct tagged by its ``type``: the JSON on the wire is the Struct encoded by
msgspec (``{"type": "view_committed", "offset": ..., ...}``), and a reader decodes it into the
same Struct with :data:`AgentUpdate`, the tagged union of them all (:func:`decode_updates`).
The coordinator builds them (``wire.protocol.view_update`` and ``prepare_update``, the
``*_update`` functions of ``coordinator.fold.projections`` and of each facet's ``updates.py``);
a facet's own Structs are read by an :class:`UpdateReader` that names them (the one its
composer builds, ``coordinator.fold.registry.Facets``); the module's functions read the
protocol's own (:data:`PROTOCOL_UPDATES`), and nothing here changes after import. The agent's
machine, its data and refit trackers, the relay, the simulated hosts and the simulator read
them by class, never by a ``type`` string.

Each update carries ``offset``, the offset of the log record whose fold produced it (a reader
resumes after it). Who receives it is the class's :attr:`audience`: the group's journal (every
rank of the group reads it) or the journal of one rank.

A field that a Struct leaves out when it is None (``omit_defaults``) is absent from the JSON, as
it always was: a ``rank_state`` without a ``cause``, a view without a ``checkpoint_rank``.

This module is pure: no I/O, clock, threads or randomness.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar, Union

import msgspec
from msgspec import Struct

from .ranks import RankSetField

#: The audiences of an update: which journals it is published to.
GROUP = "every rank of the group"
OWN_RANK = "the rank it names (`rank`)"


class Update(Struct, frozen=True, kw_only=True, tag_field="type", omit_defaults=True):
    """Base of every update: ``offset`` is that of the record whose fold produced it."""

    #: who receives it (the journals it is published to), for the reference
    audience: ClassVar[str] = GROUP

    offset: int

    @property
    def type(self) -> str:
        """The update's wire ``type`` (its tag)."""
        return self.__struct_config__.tag  # type: ignore[return-value]


class RankSetDelta(Struct, frozen=True, kw_only=True, omit_defaults=True):
    """How a rank set changed: the ranks that entered it (``add``) and left it (``remove``);
    an empty delta is ``{}``."""

    add: RankSetField | None = None
    remove: RankSetField | None = None


# -- the view and its barrier (wire.protocol) -------------------------------------------------


class ViewPrepareUpdate(Update, frozen=True, kw_only=True, tag="view_prepare"):
    """Phase one of a view change: the next ``active_ranks`` as a delta from view ``base``,
    and ``absent``, the members of the old or new view that are not participants (OFFLINE:
    they need not ACK). A participant ACKs ``(version, incarnation)`` by ``ack_deadline_ts``."""

    group: str
    version: int
    base: int
    active_ranks: RankSetDelta
    absent: RankSetField
    ack_deadline_ts: int


class ViewCommittedUpdate(Update, frozen=True, kw_only=True, tag="view_committed"):
    """View ``version`` committed: what changed since version ``base`` (0: nothing, so this is
    the full view). ``states``: the ranks whose state changed, by their new state; each rank
    set of the view as a delta; ``checkpoint_rank`` is absent from views committed before it
    existed."""

    group: str
    version: int
    base: int
    states: dict[str, RankSetField]
    cause: dict[str, Any]
    ts: int
    checkpoint_rank: int | None = None
    active_ranks: RankSetDelta
    healthy_set: RankSetDelta
    acked_ranks: RankSetDelta
    dropped_ranks: RankSetDelta


class RankStateUpdate(Update, frozen=True, kw_only=True, tag="rank_state"):
    """A rank's physical state changed (or its incarnation did). ``cause`` is a code where a
    program needs one: ``death_reported`` (a supervisor reported that incarnation dead; its
    agent stops rather than rejoin)."""

    audience: ClassVar[str] = OWN_RANK

    group: str
    rank: int
    state: str
    incarnation: str | None
    rank_epoch: int
    reason: str
    cause: str | None = None


class ShutdownUpdate(Update, frozen=True, kw_only=True, tag="shutdown_with_save"):
    """The group's one shutdown directive: save and stop. ``reason`` is
    ``max_failure_exceeded``, ``single_survivor``, ``all_ranks_lost`` or
    ``unresolved_view_failure``; ``checkpoint_rank`` is the rank that saves."""

    group: str
    reason: str
    detail: str
    checkpoint_rank: int | None


#: Every update an agent may receive: decode with this union, dispatch on the class.
AgentUpdate = ViewPrepareUpdate | ViewCommittedUpdate | RankStateUpdate | ShutdownUpdate

#: The updates that name the one rank they are for (the rest are the group's).
_ADDRESSED = (RankStateUpdate,)

_encode = msgspec.json.Encoder().encode


U = TypeVar("U", bound="Update")


def update_from(cls: type[U], source: object) -> U:
    """A ``cls`` whose every field is the same-named attribute of ``source`` (an effect of the
    fold that carries them all): the builders of updates that copy their effect."""
    return cls(**{name: getattr(source, name) for name in cls.__struct_fields__})


class UpdateError(ValueError):
    """Updates that are not the protocol's (the message says which and why)."""


class UpdateReader:
    """What one reader decodes: a set of update Structs, each by its ``type``, and the
    decoders of their union. A value: whoever composes the facets builds one (the
    coordinator's ``coordinator.fold.registry.Facets``; an agent that follows a facet's updates
    extends its own with :meth:`with_types`), so two readers in one process may read different
    sets; nothing here changes once built."""

    __slots__ = ("types", "_list", "_decoder", "_one")

    def __init__(self, classes: Iterable[type[Update]]) -> None:
        types: dict[str, type[Update]] = {}
        for cls in classes:
            tag = getattr(getattr(cls, "__struct_config__", None), "tag", None)
            if not (isinstance(cls, type) and issubclass(cls, Update)) or not isinstance(tag, str):
                raise ValueError(f"{cls!r} is not an update (a tagged wire.updates.Update)")
            known = types.get(tag)
            if known is not None and known is not cls:
                raise ValueError(
                    f"update type {tag!r} of {cls.__name__} is declared already: {known}"
                )
            types[tag] = cls
        #: each update class by its wire ``type``
        self.types: Mapping[str, type[Update]] = MappingProxyType(types)
        union = Union[tuple(types.values())]  # noqa: UP007 - built from the declared ones
        self._list: Any = list[union]  # type: ignore[valid-type]
        self._decoder = msgspec.json.Decoder(self._list)
        self._one = msgspec.json.Decoder(union)

    def with_types(self, *classes: type[Update]) -> UpdateReader:
        """This reader and ``classes`` besides (a facet's updates); ``self`` if it reads them
        already. A ``type`` already read as another Struct is a ValueError naming both."""
        if all(self.types.get(c.__struct_config__.tag) is c for c in classes):  # type: ignore[arg-type]
            return self
        return UpdateReader((*self.types.values(), *classes))

    def decode_update(self, data: bytes) -> AgentUpdate:
        """One update's JSON, as a journal keeps it, into its Struct."""
        return self._one.decode(data)

    def convert_update(self, item: Any) -> AgentUpdate:
        """One update as decoded JSON (a snapshot's) into its Struct."""
        return msgspec.convert(item, self._one.type)

    def decode_updates(self, items: Iterable[Mapping[str, Any]] | bytes) -> list[AgentUpdate]:
        """The updates of an answer (its ``updates`` list, decoded JSON or its bytes), typed.

        An update whose ``type`` this reader does not read is left out, as a reader of an
        older revision ignores what it does not know; one it reads that does not match its
        Struct raises :class:`UpdateError`, naming it."""
        try:
            if isinstance(items, bytes | bytearray | memoryview):
                return self._decoder.decode(items)
            return msgspec.convert(items, self._list)
        except msgspec.ValidationError:
            pass  # find the one at fault, or the unknown ones to leave out
        if isinstance(items, bytes | bytearray | memoryview):
            items = msgspec.json.decode(items)
        out: list[AgentUpdate] = []
        for item in items:
            kind = item.get("type") if isinstance(item, Mapping) else None
            cls = self.types.get(kind) if isinstance(kind, str) else None
            if cls is None:
                if isinstance(kind, str):
                    continue  # a newer coordinator's update, or a facet's: not this reader's
                raise UpdateError(f"an update without a type: {str(item)[:200]}")
            try:
                out.append(msgspec.convert(item, cls))
            except msgspec.ValidationError as exc:
                raise UpdateError(f"a malformed {kind} update ({exc}): {str(item)[:200]}") from None
        return out


#: The protocol's own updates (those of :data:`AgentUpdate`), read by every reader.
PROTOCOL_UPDATES = UpdateReader(AgentUpdate.__args__)  # type: ignore[attr-defined]
#: Each update class of the protocol by its wire ``type``, in the order of :data:`AgentUpdate`.
UPDATE_TYPES: Mapping[str, type[Update]] = PROTOCOL_UPDATES.types


def decode_update(data: bytes) -> AgentUpdate:
    """One update's JSON into its Struct (the protocol's own; a facet's through its reader)."""
    return PROTOCOL_UPDATES.decode_update(data)


def convert_update(item: Any) -> AgentUpdate:
    """One update as decoded JSON into its Struct (the protocol's own; a facet's through its
    reader)."""
    return PROTOCOL_UPDATES.convert_update(item)


def decode_updates(items: Iterable[Mapping[str, Any]] | bytes) -> list[AgentUpdate]:
    """:meth:`UpdateReader.decode_updates` of the protocol's own updates."""
    return PROTOCOL_UPDATES.decode_updates(items)


def addressed_rank(update: Update) -> int | None:
    """The rank an update names as its reader (``rank_state``, ``data_assignment``, a facet's
    update whose :attr:`~Update.audience` is :data:`OWN_RANK`), or None for an update the
    group's ranks share."""
    if isinstance(update, _ADDRESSED):
        return update.rank
    return getattr(update, "rank", None) if update.audience == OWN_RANK else None


def encode(update: Update) -> bytes:
    """An update's JSON, as it goes on the wire."""
    return _encode(update)


__all__ = [
    "AgentUpdate",
    "RankSetDelta",
    "RankStateUpdate",
    "ShutdownUpdate",
    "PROTOCOL_UPDATES",
    "UPDATE_TYPES",
    "Update",
    "UpdateError",
    "UpdateReader",
    "ViewCommittedUpdate",
    "ViewPrepareUpdate",
    "addressed_rank",
    "convert_update",
    "decode_update",
    "decode_updates",
    "encode",
]
