"""What the fold's effects become outside the fold: projection rows and agent updates.

Both the execution host and ``replay`` turn effects into projection rows through this one
module, so "what the host stored" and "what a fold from scratch gives" are computed the same way
and can be compared byte for byte.

Projection kinds, keyed ``(kind, group, seq)`` and upserted; membership's are below, and each
facet adds its own (its ``rows`` module, registered through ``coordinator/fold/registry.py``:
:func:`projection_kinds` lists them all):

==============  =========  ==========================================================
kind            seq        document
==============  =========  ==========================================================
``group``       0          the group's configuration and creation offset
``view``        version    a committed view, full or as a delta (append-only: a version is
                           written once); see "View rows" below
``proposal``    id         a proposal, rewritten when it resolves (terminal is final)
``rank_state``  rank       the rank's latest physical state
``failure``     0          why formation failed (``group_failed``)
``ended``       0          why the operator ended the group, and whether it was deleted
``shutdown``    offset     a ``shutdown_with_save`` directive
==============  =========  ==========================================================

View rows
---------
A view of 16,384 ranks is a few hundred kB as a document, while what changes from one version
to the next is a few ranks. So a view row is one of two documents:

- **full**: the view itself, ``view_doc(view)`` (every row of a log written before delta rows
  existed is one);
- **delta**: what changed since the version before, marked by ``"delta_from": version - 1``:
  the wire's ``view_committed`` update (:func:`wire.protocol.view_update`, a
  ``wire.updates.ViewCommittedUpdate``) without its ``type``, its ``base`` renamed
  ``delta_from``; ``group``, ``version``, ``offset``, ``ts`` and
  ``cause`` as in the full view, ``states`` (the ranks whose state changed, by state) and the
  rank sets as ``{"add", "remove"}`` deltas in the wire's rank-set encoding.

Version ``v`` is stored full when it is the group's first view, a checkpoint
(:func:`is_view_checkpoint`: every :data:`VIEW_CHECKPOINT_EVERY`-th version), or when its delta
would not be smaller than the full document (or would not rebuild exactly this view); as a
delta otherwise. The choice depends only on the two views, so replay derives the same rows.
A reader (:func:`fold_view_rows`) starts at the nearest full row at or before the first
version it wants and folds the deltas after it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ...eventlog import LogError, ProjectionRow
from ...wire.protocol import fold_view_update, view_update
from ...wire.ranks import RankSetError
from ...wire.updates import (
    RankStateUpdate,
    ShutdownUpdate,
    ViewCommittedUpdate,
    update_from,
)
from . import registry
from .effects import (
    Effect,
    GroupCreated,
    GroupEnded,
    GroupFailed,
    Proposal,
    ProposalAccepted,
    ProposalResolved,
    RankState,
    ShutdownWithSave,
    View,
    ViewCommitted,
)

#: Membership's projection kinds, which ``replay`` compares.
MEMBERSHIP_PROJECTION_KINDS = (
    "group",
    "view",
    "proposal",
    "rank_state",
    "failure",
    "ended",
    "shutdown",
)


def projection_kinds() -> tuple[str, ...]:
    """The projection kinds ``replay`` compares: membership's, then each facet's."""
    return MEMBERSHIP_PROJECTION_KINDS + registry.projection_kinds()


_encoder = msgspec.json.Encoder(order="sorted")
_decoder = msgspec.json.Decoder(dict)


def to_doc(value: Any) -> dict[str, Any]:
    """A value as the JSON object the store keeps: string keys, lists, sorted on encoding.

    Round-tripping through JSON here means the host's rows equal what a reader decodes later.
    """
    return _decoder.decode(_encoder.encode(msgspec.to_builtins(value, str_keys=True)))


def view_doc(view: View) -> dict[str, Any]:
    return to_doc(view)


# -- view rows ---------------------------------------------------------------------------------

#: Every this many versions a view row is full (versions 1, 65, 129, ...), so reading any
#: version folds at most 63 deltas: a page of history reads one full row and the small deltas
#: after it, and a full row's cost (a few hundred kB at 16,384 ranks) is paid once per 64
#: view changes instead of on every one.
VIEW_CHECKPOINT_EVERY = 64

#: The key that marks a delta view row; its value is the version the delta is from.
DELTA_FROM = "delta_from"

#: The fewest bytes one ``rank_states`` entry takes in a full view row (``"0":""``): a
#: delta shorter than this times the ranks is smaller than the full row without encoding it.
_MIN_ENTRY_BYTES = 6


class ViewRowError(LogError):
    """Stored view rows that do not fold into views (a delta without its base, a malformed
    delta): the store was damaged or written by something else. The message names the row."""


def is_view_checkpoint(version: int) -> bool:
    """Whether ``version``'s row is always a full one (the first version, and every
    :data:`VIEW_CHECKPOINT_EVERY`-th after it)."""
    return (version - 1) % VIEW_CHECKPOINT_EVERY == 0


def view_checkpoint_at(version: int) -> int:
    """The checkpoint version at or before ``version`` (``version`` >= 1)."""
    return version - (version - 1) % VIEW_CHECKPOINT_EVERY


def is_delta(doc: dict[str, Any]) -> bool:
    """Whether a stored view row's document is a delta (else it is a full view)."""
    return DELTA_FROM in doc


def view_row(view: View, base: View | None) -> ProjectionRow:
    """The projection row of ``view``, committed after ``base`` (None: the group's first)."""
    delta = _view_delta(view, base)
    return ProjectionRow(
        "view", view.group, view.version, view_doc(view) if delta is None else delta
    )


def _view_delta(view: View, base: View | None) -> dict[str, Any] | None:
    """``view`` as a delta row from ``base``, or None where a full row is stored instead."""
    if base is None or base.version != view.version - 1 or is_view_checkpoint(view.version):
        return None
    update = view_update(base, view)
    # a delta serves only if the reader's fold of it gives exactly this view back
    try:
        rebuilt = fold_view_update(base, update, len(base.rank_states))
    except (RankSetError, ValueError):
        return None
    if rebuilt != view:
        return None
    doc = to_doc(update)
    del doc["type"]
    doc[DELTA_FROM] = doc.pop("base")
    doc = dict(sorted(doc.items()))  # the order ``to_doc`` gives a row
    size = len(_encoder.encode(doc))
    if size < _MIN_ENTRY_BYTES * len(view.rank_states):
        return doc  # smaller than the full row, which need not be encoded to know it
    return doc if size < len(_encoder.encode(msgspec.to_builtins(view, str_keys=True))) else None


def view_of(doc: dict[str, Any]) -> View:
    """The view of a full view row's document."""
    return msgspec.convert(doc, View, strict=False)


def apply_view_delta(base: View, seq: int, doc: dict[str, Any]) -> View:
    """The view a delta row (version ``seq``) makes of ``base``; ViewRowError when it does
    not apply."""
    name = f"view {base.group}/{seq}"
    if doc.get(DELTA_FROM) != base.version or base.version != seq - 1 or doc.get("version") != seq:
        raise ViewRowError(
            f"{name}: a delta from version {doc.get(DELTA_FROM)!r} (of version "
            f"{doc.get('version')!r}), but the row before it is version {base.version}"
        )
    fields = {k: v for k, v in doc.items() if k != DELTA_FROM}
    try:
        update = msgspec.convert(
            {**fields, "type": ViewCommittedUpdate.__struct_config__.tag, "base": base.version},
            ViewCommittedUpdate,
        )
        return fold_view_update(base, update, len(base.rank_states))
    except (RankSetError, ValueError) as exc:
        raise ViewRowError(
            f"{name}: the delta does not apply to version {base.version}: {exc}"
        ) from None


class ViewFold:
    """Folds a group's view rows, in version order, into full view documents.

    Give it every row from a full one on (:meth:`add`); it holds the last view, so a reader
    can go on with the next rows. A full row's document is returned as stored; a delta's is
    ``view_doc`` of the view it makes."""

    def __init__(self) -> None:
        self._seq = 0
        self._doc: dict[str, Any] | None = None
        self._view: View | None = None

    @property
    def version(self) -> int:
        """The version of the last row folded (0: none)."""
        return self._seq

    def add(self, row: ProjectionRow, *, want: bool = True) -> dict[str, Any] | None:
        """Fold one row; its full document when ``want`` (a row folded only to reach a later
        one needs none, and a delta's then costs no full document)."""
        if not is_delta(row.doc):
            self._seq, self._doc, self._view = row.seq, row.doc, None
            return row.doc
        if self._seq == 0:
            raise ViewRowError(
                f"view {row.group}/{row.seq}: a delta from version {row.doc.get(DELTA_FROM)!r} "
                "with no full row before it to start from"
            )
        self._view = apply_view_delta(self.last_view(), row.seq, row.doc)
        self._seq, self._doc = row.seq, None
        return view_doc(self._view) if want else None

    def last_view(self) -> View:
        """The last view folded (``version`` must be > 0)."""
        if self._view is None:
            assert self._doc is not None
            try:
                self._view = view_of(self._doc)
            except (msgspec.ValidationError, TypeError) as exc:
                raise ViewRowError(
                    f"view {self._doc.get('group')}/{self._seq}: the full row is not a view: {exc}"
                ) from None
        return self._view


def proposal_doc(proposal: Proposal) -> dict[str, Any]:
    return to_doc(proposal)


def rows_for(effect: Effect, facets: registry.Facets | None = None) -> list[ProjectionRow]:
    """The projection rows an effect writes (none for effects that only concern the moment);
    a facet's as ``facets`` registers them (the command line's when None)."""
    if isinstance(effect, ViewCommitted):
        return [view_row(effect.view, effect.base)]
    if isinstance(effect, ProposalAccepted | ProposalResolved):
        p = effect.proposal
        return [ProjectionRow("proposal", p.group, p.id, proposal_doc(p))]
    if isinstance(effect, RankState):
        doc = to_doc(effect)
        del doc["cause"]  # a code for the agents' updates; the row keeps the reason
        return [ProjectionRow("rank_state", effect.group, effect.rank, doc)]
    if isinstance(effect, GroupCreated):
        return [ProjectionRow("group", effect.group, 0, to_doc(effect))]
    if isinstance(effect, GroupFailed):
        return [ProjectionRow("failure", effect.group, 0, to_doc(effect))]
    if isinstance(effect, GroupEnded):
        return [ProjectionRow("ended", effect.group, 0, to_doc(effect))]
    if isinstance(effect, ShutdownWithSave):
        return [ProjectionRow("shutdown", effect.group, effect.offset, to_doc(effect))]
    rows = (facets or registry.default()).rows_table.get(type(effect))
    return [] if rows is None else rows(effect)


# -- agent updates (docs/protocol.md, GET /agents/updates) ------------------------------------
# Each is a Struct of ``wire.updates``. The view updates (deltas) are the wire protocol's:
# ``wire.protocol.view_update`` and ``prepare_update``. The two below are per rank or per
# group and small.


def rank_state_update(effect: RankState) -> RankStateUpdate:
    return update_from(RankStateUpdate, effect)


def shutdown_update(effect: ShutdownWithSave) -> ShutdownUpdate:
    return update_from(ShutdownUpdate, effect)
