"""Weight refits between two groups (the ``refits`` facet, docs/refit.md).

A refit moves a model's weights from a *publisher* group (trainers, M slots) to a *subscriber*
group (generators, N slots), again and again, over a data plane of its own
(``agent.refit``). The plan of what moves is the workers' (``wire.refit``); the fold decides who
takes part, when they agree, and what happened to each transfer:

- **Declared** (``refit_created``, ``POST /refits``): the two groups, the slot counts, the
  lane count (the data plane's parallel streams), the readiness and transfer timeouts, and
  optionally the plan digest every worker must hold. Created again with the same definition
  is the same refit; with another one it is refused ``refit_conflict``.
- **Epochs.** Everything a worker does is fenced by the refit's *epoch*. An epoch begins
  ``waiting``: each worker joins (``refit_join``) with its slot and the digest of the plan it
  holds. It is ``admitted`` once every slot joined with the same digest: each member gets its
  rank in the refit's world (publishers first, by slot). The epoch moves on (a new one begins,
  ``waiting``) when either group commits a view, when a member goes OFFLINE, when a transfer
  times out, or on an operator's restart (``refit_restart``): a worker still holding the old
  epoch is refused ``stale_refit_epoch`` naming why it moved, never left to retry on a stale
  communicator. An epoch not admitted by its readiness deadline is ``timed_out`` and names
  the slots that never joined.
- **Gates.** A join is refused when the worker's group is neither of the refit's, when its
  rank is not active in its group's committed view, when its slot is out of range or held by
  another rank, or when its digest differs from the refit's (the message names who holds
  which digest).
- **Bootstrap.** Refit rank 0 (publisher slot 0) publishes the data plane's rendezvous, once
  per admitted epoch: offered with its join (``refit_join`` with ``bootstrap``), it is
  published in the step that admits the epoch; else it comes after admission
  (``refit_bootstrap``). It reaches the admitted members' own update journals only, and no
  status or projection row carries it.
- **Transfers** (``transfer``): created by a publisher of the admitted epoch or an operator
  (the publishers hold the weights; a subscriber waits for the transfer to start and is
  refused ``not_refit_member``), idempotent by key; one runs at a time. Each member reports ``done`` or ``failed``
  (``transfer_status``) against the transfer's current attempt and the epoch; the transfer
  completes when every member reported ``done``, and a completed transfer is final (a late or
  repeated report is refused ``transfer_final``). A failure (a report, a member lost, the
  epoch moving, the deadline) fails the attempt, naming who or what; creating the transfer
  again starts a new attempt, and the old attempt's reports are refused ``stale_attempt``.

Every rule is a method below; iteration is in a fixed order, so a replay decides the same.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET

from ...coordinator.fold.effects import Effect, RankState, View
from ...coordinator.fold.facets import FoldContext, Refusal
from ...coordinator.fold.fencing import online_rank_refusal
from ...coordinator.fold.reasons import abridged
from ...coordinator.fold.state import GroupState
from ...eventlog.record import Record
from ...wire.codes import (
    DIGEST_MISMATCH,
    INVALID_EVENT,
    INVALID_SLOT,
    NOT_REFIT_MEMBER,
    REFIT_CONFLICT,
    REFIT_NOT_READY,
    STALE_ATTEMPT,
    STALE_REFIT_EPOCH,
    TRANSFER_BUSY,
    TRANSFER_FINAL,
    UNKNOWN_GROUP,
    UNKNOWN_REFIT,
    UNKNOWN_TRANSFER,
)
from .effects import (
    RefitBootstrap,
    RefitCreated,
    RefitEpochChanged,
    TransferChanged,
)
from .inputs import (
    _DIGEST,
    _KEY,
    MAX_BOOTSTRAP_BYTES,
    RefitBootstrapInput,
    RefitCreatedInput,
    RefitJoinInput,
    RefitRestartInput,
    RefitsInput,
    TransferInput,
    TransferStatusInput,
    decode,
    spec_problem,
)

PUBLISHER, SUBSCRIBER = "publisher", "subscriber"
WAITING, ADMITTED, TIMED_OUT = "waiting", "admitted", "timed_out"
RUNNING, COMPLETED, FAILED = "running", "completed", "failed"

_S = 1_000_000_000


def transfer_key(payload: dict[str, Any]) -> tuple[Any, ...] | None:
    """An agent's start of a refit transfer, keyed as ``POST /refits/{refit}/transfers`` keys
    the operator's: two starts of one transfer never share a batch (the host's
    ``batching.take_batch``): the second is decided against the state after the first."""
    refit, key = payload.get("refit"), payload.get("key")
    return ("transfer", refit, key) if isinstance(refit, str) and isinstance(key, str) else None


def _slot_name(role: str, slot: int, group: str | None = None, rank: int | None = None) -> str:
    who = f"{role} slot {slot}"
    return who if group is None else f"{who} ({group} rank {rank})"


class _Joined:
    __slots__ = ("group", "rank", "incarnation", "digest", "offset", "bootstrap")

    def __init__(
        self,
        group: str,
        rank: int,
        incarnation: str,
        digest: str,
        offset: int,
        bootstrap: dict[str, Any] | None = None,
    ) -> None:
        self.group = group
        self.rank = rank
        self.incarnation = incarnation
        self.digest = digest
        self.offset = offset
        #: the bootstrap publisher slot 0 offered with its join (published on admission)
        self.bootstrap = bootstrap

    def to_list(self) -> list[Any]:
        out = [self.group, self.rank, self.incarnation, self.digest, self.offset]
        return out if self.bootstrap is None else [*out, self.bootstrap]


class _Transfer:
    __slots__ = (
        "id",
        "key",
        "attempt",
        "epoch",
        "status",
        "detail",
        "deadline",
        "done",
        "offset",
    )

    def __init__(self, id: int, key: str, offset: int) -> None:
        self.id = id
        self.key = key
        self.attempt = 0
        self.epoch = 0
        self.status = RUNNING
        self.detail = ""
        self.deadline: int | None = None
        #: members that reported the current attempt done: (role, slot)
        self.done: set[tuple[str, int]] = set()
        #: the offset of the record that started the current attempt
        self.offset = offset

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "key": self.key,
            "attempt": self.attempt,
            "epoch": self.epoch,
            "status": self.status,
            "detail": self.detail,
            "deadline": self.deadline,
            "done": sorted([list(d) for d in self.done]),
            "offset": self.offset,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> _Transfer:
        t = cls(d["id"], d["key"], d["offset"])
        t.attempt, t.epoch, t.status = d["attempt"], d["epoch"], d["status"]
        t.detail, t.deadline = d["detail"], d["deadline"]
        t.done = {(str(r), int(s)) for r, s in d["done"]}
        return t


class Refit:
    """One refit: its definition, its current epoch and its transfers."""

    def __init__(self, spec: dict[str, Any], offset: int) -> None:
        self.spec = spec
        self.name: str = spec["refit"]
        self.offset = offset
        self.epoch = 0
        self.status = WAITING
        self.cause = ""
        self.deadline: int | None = None
        self.digest: str | None = spec["digest"]
        self.joined: dict[tuple[str, int], _Joined] = {}
        self.bootstrap: dict[str, Any] | None = None
        self.missing: tuple[str, ...] = ()
        self.transfers: dict[int, _Transfer] = {}
        self.by_key: dict[str, int] = {}
        #: the transfer whose attempt is running, if any
        self.running: int | None = None
        #: the member whose loss began the current epoch (side, slot), if one did
        self.lost: tuple[str, int] | None = None

    @property
    def groups(self) -> tuple[str, str]:
        return self.spec["publisher"], self.spec["subscriber"]

    def role_of(self, group: str) -> str | None:
        if group == self.spec["publisher"]:
            return PUBLISHER
        if group == self.spec["subscriber"]:
            return SUBSCRIBER
        return None

    def slots(self, role: str) -> int:
        return self.spec[f"{role}_slots"]

    def every_slot(self) -> list[tuple[str, int]]:
        return [(PUBLISHER, s) for s in range(self.slots(PUBLISHER))] + [
            (SUBSCRIBER, s) for s in range(self.slots(SUBSCRIBER))
        ]

    def member_slot(self, group: str, rank: int) -> tuple[str, int] | None:
        """The slot ``rank`` of ``group`` joined in the current epoch, if any."""
        for key, j in self.joined.items():
            if j.group == group and j.rank == rank:
                return key
        return None

    def ranks_of(self, role: str) -> tuple[int, ...]:
        """The group rank in each slot of ``role``, once the epoch is admitted."""
        if self.status != ADMITTED:
            return ()
        return tuple(self.joined[(role, slot)].rank for slot in range(self.slots(role)))

    def members(self) -> list[dict[str, Any]]:
        """The admitted members, in refit-rank order (publishers first, by slot)."""
        if self.status != ADMITTED:
            return []
        return [
            {
                "role": role,
                "slot": slot,
                "group": self.joined[(role, slot)].group,
                "rank": self.joined[(role, slot)].rank,
                "refit_rank": i,
            }
            for i, (role, slot) in enumerate(self.every_slot())
        ]

    def epoch_effect(self, offset: int) -> RefitEpochChanged:
        return RefitEpochChanged(
            refit=self.name,
            groups=self.groups,
            epoch=self.epoch,
            status=self.status,
            cause=self.cause,
            deadline_ts=self.deadline,
            digest=self.digest if self.status == ADMITTED else None,
            lanes=self.spec["lanes"],
            publisher_ranks=self.ranks_of(PUBLISHER),
            subscriber_ranks=self.ranks_of(SUBSCRIBER),
            missing=self.missing,
            offset=offset,
            lost=self.lost,
        )

    def transfer_effect(self, t: _Transfer, offset: int) -> TransferChanged:
        return TransferChanged(
            refit=self.name,
            groups=self.groups,
            transfer=t.id,
            key=t.key,
            attempt=t.attempt,
            epoch=t.epoch,
            status=t.status,
            detail=t.detail,
            deadline_ts=t.deadline,
            offset=offset,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "offset": self.offset,
            "epoch": self.epoch,
            "status": self.status,
            "cause": self.cause,
            "deadline": self.deadline,
            "digest": self.digest,
            "joined": [[r, s, *j.to_list()] for (r, s), j in sorted(self.joined.items())],
            "bootstrap": self.bootstrap,
            "missing": list(self.missing),
            "transfers": [self.transfers[t].to_dict() for t in sorted(self.transfers)],
            "running": self.running,
        } | ({} if self.lost is None else {"lost": list(self.lost)})

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Refit:
        r = cls(d["spec"], d["offset"])
        r.epoch, r.status, r.cause = d["epoch"], d["status"], d["cause"]
        r.deadline, r.digest, r.bootstrap = d["deadline"], d["digest"], d["bootstrap"]
        r.joined = {(str(item[0]), int(item[1])): _Joined(*item[2:]) for item in d["joined"]}
        r.missing = tuple(d["missing"])
        r.transfers = {t["id"]: _Transfer.from_dict(t) for t in d["transfers"]}
        r.by_key = {t.key: t.id for t in r.transfers.values()}
        r.running = d["running"]
        lost = d.get("lost")
        r.lost = None if lost is None else (str(lost[0]), int(lost[1]))
        return r


#: The transition table: each input (``inputs.py``), the rule that steps it and what it moves.
TRANSITIONS: dict[type[RefitsInput], str] = {
    RefitCreatedInput: "_on_created",  # a new refit: its first epoch, waiting for its slots
    RefitRestartInput: "_on_restart",  # the running transfer fails; a new epoch
    RefitJoinInput: "_join",  # a slot held (the last one: the epoch admitted)
    RefitBootstrapInput: "_on_bootstrap",  # the epoch's rendezvous, to its members
    TransferInput: "_transfer",  # a transfer starts (or retries)
    TransferStatusInput: "_status",  # a member's outcome (failed: the transfer fails)
}


class Refits:
    """The refits facet (see the module docstring)."""

    name = "refits"
    kinds = frozenset(
        {
            "refit_created",
            "refit_restart",
            "refit_join",
            "refit_bootstrap",
            "transfer",
            "transfer_status",
        }
    )
    repeatable = frozenset({"refit_created", "refit_join", "refit_bootstrap", "transfer"})

    def __init__(self) -> None:
        self._refits: dict[str, Refit] = {}

    # -- reading -----------------------------------------------------------------------------

    def refit(self, name: str) -> Refit | None:
        return self._refits.get(name)

    def names(self) -> list[str]:
        return sorted(self._refits)

    def status(self, name: str) -> dict[str, Any] | None:
        """Plain data for ``GET /refits/{refit}`` (never the bootstrap)."""
        r = self._refits.get(name)
        if r is None:
            return None
        joined = {f"{role}:{slot}": j for (role, slot), j in r.joined.items()}
        return {
            "refit": r.name,
            "spec": r.spec,
            "created_offset": r.offset,
            "epoch": r.epoch,
            "status": r.status,
            "cause": r.cause,
            "deadline_ts": r.deadline,
            "digest": r.digest,
            "joined": [
                {
                    "role": key.split(":")[0],
                    "slot": int(key.split(":")[1]),
                    "group": j.group,
                    "rank": j.rank,
                    "digest": j.digest,
                }
                for key, j in sorted(
                    joined.items(), key=lambda kv: (kv[0].split(":")[0], int(kv[0].split(":")[1]))
                )
            ],
            "missing": list(r.missing) or self._missing(r),
            "members": r.members(),
            "bootstrap_published": r.bootstrap is not None,
            "transfers": [
                {k: v for k, v in r.transfers[t].to_dict().items() if k != "done"}
                | {"done": [f"{role} slot {slot}" for role, slot in sorted(r.transfers[t].done)]}
                for t in sorted(r.transfers)
            ],
        }

    # -- checks ------------------------------------------------------------------------------

    def refusal(
        self, fold: FoldContext, kind: str, group: str | None, rank: int | None, payload: Any
    ) -> Refusal | None:
        """Why an input must not be applied (its checks, each with its code, in order), or
        None; an input the checks pass still decodes into its Struct (``inputs.py``), or it is
        refused naming the field of the wrong type."""
        refused = self._checked_refusal(fold, kind, group, rank, payload)
        if refused is not None:
            return refused
        try:
            decode(kind, payload)
        except msgspec.ValidationError as exc:
            return INVALID_EVENT, f"{kind}: {exc}"
        return None

    def _checked_refusal(
        self, fold: FoldContext, kind: str, group: str | None, rank: int | None, payload: Any
    ) -> Refusal | None:
        if not isinstance(payload, dict):
            return INVALID_EVENT, f"payload must be an object, got {type(payload).__name__}"
        if kind == "refit_created":
            return self._create_refusal(fold, group, rank, payload)
        name = payload.get("refit")
        if not isinstance(name, str):
            return INVALID_EVENT, f"{kind}: refit must be a refit's name, got {name!r}"
        r = self._refits.get(name)
        if r is None:
            return UNKNOWN_REFIT, f"no refit named {name[:80]!r}"
        if kind == "refit_restart" or (kind == "transfer" and rank is None):
            if group is not None or rank is not None:
                return INVALID_EVENT, f"a {kind} from an operator names no group or rank"
            return self._operator_refusal(r, kind, payload)
        # a worker's input: fenced like every rank input, and by the refit's epoch
        if group is None:
            return INVALID_EVENT, f"a {kind} record must name the worker's group"
        g = fold.group_states.get(group)
        if g is None:
            return UNKNOWN_GROUP, f"no group named {group!r}"
        if (refused := online_rank_refusal(g, kind, rank, payload.get("incarnation"))) is not None:
            return refused
        assert rank is not None
        role = r.role_of(group)
        if role is None:
            return NOT_REFIT_MEMBER, (
                f"rank {rank} of group {group!r} is not in refit {r.name!r}, which is from "
                f"{r.spec['publisher']!r} to {r.spec['subscriber']!r}"
            )
        epoch = payload.get("epoch")
        if not isinstance(epoch, int) or isinstance(epoch, bool):
            return INVALID_EVENT, f"{kind}: epoch must be an integer, got {epoch!r}"
        if epoch != r.epoch:
            return STALE_REFIT_EPOCH, (
                f"refit {r.name!r} is at epoch {r.epoch} ({r.cause}); this {kind} is for epoch "
                f"{epoch}: join the current epoch again"
            )
        if kind == "refit_join":
            return self._join_refusal(r, g, role, rank, payload)
        slot = r.member_slot(group, rank)
        if r.status != ADMITTED:
            return REFIT_NOT_READY, f"refit {r.name!r} epoch {r.epoch} {self._not_admitted(r)}"
        if slot is None:
            return NOT_REFIT_MEMBER, (
                f"refit {r.name!r}: rank {rank} of {group!r} is not a member of epoch {r.epoch}"
            )
        if r.joined[slot].incarnation != payload.get("incarnation"):
            return NOT_REFIT_MEMBER, (
                f"refit {r.name!r}: {_slot_name(*slot)} joined epoch {r.epoch} as incarnation "
                f"{r.joined[slot].incarnation}, not {payload.get('incarnation')}"
            )
        if kind == "refit_bootstrap":
            return self._bootstrap_refusal(r, slot, payload)
        if kind == "transfer":
            if slot[0] != PUBLISHER:
                return NOT_REFIT_MEMBER, (
                    f"refit {r.name!r}: {_slot_name(*slot)} ({group} rank {rank}) may not start "
                    "a transfer: a transfer comes from a publisher of the admitted epoch or the "
                    "operator (a subscriber waits for it to start)"
                )
            return self._transfer_refusal(r, payload)
        return self._status_refusal(r, slot, payload)

    def _create_refusal(
        self, fold: FoldContext, group: str | None, rank: int | None, payload: dict[str, Any]
    ) -> Refusal | None:
        if group is not None or rank is not None:
            return INVALID_EVENT, "a refit is created by an operator, not by a rank of a group"
        if (err := spec_problem(payload)) is not None:
            return INVALID_EVENT, f"refit_created: {err}"
        for role in (PUBLISHER, SUBSCRIBER):
            name = payload[role]
            g = fold.group_states.get(name)
            if g is None:
                return UNKNOWN_GROUP, f"refit {payload['refit']!r}: no {role} group named {name!r}"
            slots = payload[f"{role}_slots"]
            if slots > g.config.world_size:
                return INVALID_SLOT, (
                    f"refit {payload['refit']!r}: {slots} {role} slots, but group {name!r} has "
                    f"{g.config.world_size} ranks"
                )
        r = self._refits.get(payload["refit"])
        if r is not None:
            diff = sorted(k for k in payload if payload[k] != r.spec[k])
            return REFIT_CONFLICT, (
                f"refit {r.name!r} exists (offset {r.offset})"
                + (f" with another {', '.join(diff)}" if diff else "")
            )
        return None

    def _operator_refusal(self, r: Refit, kind: str, payload: dict[str, Any]) -> Refusal | None:
        if kind == "refit_restart":
            if set(payload) - {"refit", "reason"}:
                return INVALID_EVENT, "refit_restart has only refit and reason"
            return None
        return self._transfer_refusal(r, payload)

    def _join_refusal(
        self, r: Refit, g: GroupState, role: str, rank: int, payload: dict[str, Any]
    ) -> Refusal | None:
        if set(payload) - {"incarnation", "refit", "epoch", "slot", "digest", "bootstrap"}:
            return INVALID_EVENT, (
                "refit_join has incarnation, refit, epoch, slot, digest and (publisher slot 0 "
                "only) bootstrap"
            )
        slot = payload.get("slot")
        slots = r.slots(role)
        if not isinstance(slot, int) or isinstance(slot, bool) or not 0 <= slot < slots:
            return INVALID_SLOT, (
                f"refit {r.name!r} has {role} slots 0..{slots - 1}; rank {rank} of {g.name!r} "
                f"asked for {slot!r}"
            )
        digest = payload.get("digest")
        if not isinstance(digest, str) or not _DIGEST.match(digest):
            return (
                INVALID_EVENT,
                f"refit_join: digest must be 64 lowercase hex characters, got {digest!r}",
            )
        if g.view is None or not g.view.is_active(rank):
            where = "no committed view" if g.view is None else f"view {g.view.version}"
            return NOT_REFIT_MEMBER, (
                f"rank {rank} of {g.name!r} is not active in {where}; only active ranks take part "
                f"in refit {r.name!r}"
            )
        if r.status == TIMED_OUT:
            return REFIT_NOT_READY, (
                f"refit {r.name!r} epoch {r.epoch} timed out waiting for {abridged(list(r.missing))}; "
                "it starts again when either group's view changes or an operator restarts it"
            )
        held = r.joined.get((role, slot))
        mine = r.member_slot(g.name, rank)
        if held is not None and (held.group, held.rank) != (g.name, rank):
            return INVALID_SLOT, (
                f"refit {r.name!r} epoch {r.epoch}: {role} slot {slot} is held by rank "
                f"{held.rank} of {held.group!r}"
            )
        if mine is not None and mine != (role, slot):
            return INVALID_SLOT, (
                f"refit {r.name!r} epoch {r.epoch}: rank {rank} of {g.name!r} already holds "
                f"{_slot_name(*mine)}"
            )
        reference = self._reference(r)
        if reference is not None and digest != reference[0]:
            return DIGEST_MISMATCH, (
                f"refit {r.name!r}: {_slot_name(role, slot, g.name, rank)} holds plan digest "
                f"{digest[:12]}…, but {reference[1]} {'hold' if ',' in reference[1] else 'holds'} "
                f"{reference[0][:12]}…"
            )
        if "bootstrap" in payload:
            if (role, slot) != (PUBLISHER, 0):
                return NOT_REFIT_MEMBER, (
                    f"refit {r.name!r}: only refit rank 0 (publisher slot 0) offers the "
                    f"bootstrap, not {_slot_name(role, slot)}"
                )
            return self._bootstrap_problem(r, "refit_join", payload["bootstrap"])
        if held is not None and held.incarnation != payload.get("incarnation"):
            return None  # a new incarnation of the same rank takes its slot over
        return None

    def _reference(self, r: Refit) -> tuple[str, str] | None:
        """The digest a join must have, and who holds it (for the refusal's message)."""
        if r.spec["digest"] is not None:
            return r.spec["digest"], "the refit's definition"
        holders = [
            _slot_name(role, slot, j.group, j.rank) for (role, slot), j in sorted(r.joined.items())
        ]
        if not holders:
            return None
        first = next(iter(sorted(r.joined.items())))[1]
        return first.digest, abridged(holders)

    def _bootstrap_refusal(
        self, r: Refit, slot: tuple[str, int], payload: dict[str, Any]
    ) -> Refusal | None:
        if slot != (PUBLISHER, 0):
            return NOT_REFIT_MEMBER, (
                f"refit {r.name!r}: only refit rank 0 (publisher slot 0) publishes the "
                f"bootstrap, not {_slot_name(*slot)}"
            )
        return self._bootstrap_problem(r, "refit_bootstrap", payload.get("bootstrap"))

    @staticmethod
    def _bootstrap_problem(r: Refit, kind: str, bootstrap: Any) -> Refusal | None:
        """One bootstrap an epoch, a small object, whether offered with the join or published
        after admission."""
        if not isinstance(bootstrap, dict):
            return (
                INVALID_EVENT,
                f"{kind}: bootstrap must be an object, got {type(bootstrap).__name__}",
            )
        size = len(msgspec.json.encode(bootstrap))
        if size > MAX_BOOTSTRAP_BYTES:
            return INVALID_EVENT, (
                f"{kind}: bootstrap of {size} bytes encoded, more than {MAX_BOOTSTRAP_BYTES}"
            )
        if r.bootstrap is not None and r.bootstrap != bootstrap:
            return REFIT_CONFLICT, (
                f"refit {r.name!r} epoch {r.epoch} already has a bootstrap; a new one comes with "
                "the next epoch"
            )
        return None

    def _transfer_refusal(self, r: Refit, payload: dict[str, Any]) -> Refusal | None:
        key = payload.get("key")
        if not isinstance(key, str) or not _KEY.match(key):
            return INVALID_EVENT, (
                f"transfer: key must be 1-128 printable ASCII characters without spaces, got "
                f"{key!r}"
            )
        t = self._transfer_by_key(r, key)
        if t is not None and t.status in (RUNNING, COMPLETED):
            return None  # a repeat: answered with the transfer's record
        if r.status != ADMITTED:
            return REFIT_NOT_READY, (
                f"refit {r.name!r} epoch {r.epoch} {self._not_admitted(r)}; a transfer starts in "
                "an admitted epoch"
            )
        if r.running is not None:
            busy = r.transfers[r.running]
            return TRANSFER_BUSY, (
                f"refit {r.name!r}: transfer {busy.key!r} (attempt {busy.attempt}) is running"
            )
        return None

    def _status_refusal(
        self, r: Refit, slot: tuple[str, int], payload: dict[str, Any]
    ) -> Refusal | None:
        if set(payload) - {
            "incarnation",
            "refit",
            "epoch",
            "transfer",
            "attempt",
            "status",
            "detail",
        }:
            return INVALID_EVENT, (
                "transfer_status has incarnation, refit, epoch, transfer, attempt, status, detail"
            )
        number = payload.get("transfer")
        t = r.transfers.get(number) if isinstance(number, int) else None
        if t is None:
            return UNKNOWN_TRANSFER, f"refit {r.name!r} has no transfer {number!r}"
        status = payload.get("status")
        if status not in ("done", "failed"):
            return (
                INVALID_EVENT,
                f"transfer_status: status must be 'done' or 'failed', got {status!r}",
            )
        detail = payload.get("detail", "")
        if not isinstance(detail, str) or len(detail) > 1000:
            return (
                INVALID_EVENT,
                "transfer_status: detail must be a string of at most 1000 characters",
            )
        if t.status == COMPLETED:
            return TRANSFER_FINAL, (
                f"refit {r.name!r}: transfer {t.key!r} completed (attempt {t.attempt}); its state "
                "is final"
            )
        if payload.get("attempt") != t.attempt:
            return STALE_ATTEMPT, (
                f"refit {r.name!r}: transfer {t.key!r} is at attempt {t.attempt}; this report is "
                f"for attempt {payload.get('attempt')!r}"
            )
        if t.status == FAILED:
            return STALE_ATTEMPT, (
                f"refit {r.name!r}: attempt {t.attempt} of transfer {t.key!r} failed ({t.detail}); "
                "create the transfer again for a new attempt"
            )
        return None

    def repeat_of(
        self, fold: FoldContext, kind: str, group: str | None, rank: int | None, payload: Any
    ) -> int | None:
        """The earlier record an identical input repeats: the same refit created again, the same
        join (slot, digest, incarnation, epoch, offered bootstrap), the same bootstrap, a
        transfer key that is running or completed."""
        if not isinstance(payload, dict):
            return None
        r = (
            self._refits.get(payload.get("refit"))
            if isinstance(payload.get("refit"), str)
            else None
        )
        if r is None:
            return None
        if kind == "refit_created":
            return r.offset if payload == r.spec else None
        if kind == "transfer":
            key = payload.get("key")
            t = self._transfer_by_key(r, key) if isinstance(key, str) else None
            return t.offset if t is not None and t.status in (RUNNING, COMPLETED) else None
        if payload.get("epoch") != r.epoch or group is None or rank is None:
            return None
        if kind == "refit_join":
            slot = payload.get("slot")
            role = r.role_of(group)
            j = r.joined.get((role, slot)) if role is not None and isinstance(slot, int) else None
            if j is not None and (j.group, j.rank, j.incarnation, j.digest, j.bootstrap) == (
                group,
                rank,
                payload.get("incarnation"),
                payload.get("digest"),
                payload.get("bootstrap"),
            ):
                return j.offset
        return None

    @staticmethod
    def _transfer_by_key(r: Refit, key: str) -> _Transfer | None:
        number = r.by_key.get(key)
        return None if number is None else r.transfers[number]

    def _not_admitted(self, r: Refit) -> str:
        """Why the epoch is not admitted, naming the slots it waits for or never had."""
        if r.status == WAITING:
            return f"is waiting for {abridged(self._missing(r))}"
        return (
            f"timed out: {abridged(list(r.missing))} never joined (a view change of either "
            "group or a restart opens a new epoch)"
        )

    @staticmethod
    def _missing(r: Refit) -> list[str]:
        return [
            _slot_name(role, slot) for role, slot in r.every_slot() if (role, slot) not in r.joined
        ]

    # -- steps -------------------------------------------------------------------------------

    def apply(self, fold: FoldContext, record: Record, effects: list[Effect]) -> None:
        """Step an input: its Struct (``inputs.py``) picks the rule (:data:`TRANSITIONS`)."""
        inp = decode(record.kind, record.payload)
        getattr(self, TRANSITIONS[type(inp)])(fold, inp, record, effects)

    def _on_created(
        self, fold: FoldContext, created: RefitCreatedInput, record: Record, effects: list[Effect]
    ) -> None:
        # the definition is the record's payload as logged (every field explicit)
        r = self._refits[created.refit] = Refit(dict(record.payload), record.offset)
        effects.append(RefitCreated(refit=r.name, spec=r.spec, offset=record.offset))
        self._new_epoch(fold, r, "the refit was created", record, effects)

    def _on_restart(
        self, fold: FoldContext, restart: RefitRestartInput, record: Record, effects: list[Effect]
    ) -> None:
        r = self._refits[restart.refit]
        reason = restart.reason or "an operator restarted it"
        self._fail_running(r, f"the refit was restarted ({reason})", record, effects)
        self._new_epoch(fold, r, f"restarted by an operator: {reason}", record, effects)

    def _on_bootstrap(
        self, fold: FoldContext, boot: RefitBootstrapInput, record: Record, effects: list[Effect]
    ) -> None:
        self._publish(self._refits[boot.refit], boot.bootstrap, record, effects)

    def _new_epoch(
        self,
        fold: FoldContext,
        r: Refit,
        cause: str,
        record: Record,
        effects: list[Effect],
        lost: tuple[str, int] | None = None,
    ) -> None:
        r.epoch += 1
        r.status = WAITING
        r.cause = cause
        r.lost = lost
        r.joined = {}
        r.bootstrap = None
        r.missing = ()
        r.digest = r.spec["digest"]
        r.deadline = fold.now + round(r.spec["readiness_timeout_s"] * _S)
        effects.append(r.epoch_effect(record.offset))

    def _join(
        self, fold: FoldContext, join: RefitJoinInput, record: Record, effects: list[Effect]
    ) -> None:
        """The last slot's join admits the epoch; a bootstrap publisher slot 0 offered with its
        join is published in the same step, after the admission (to the members it names)."""
        r = self._refits[join.refit]
        role = r.role_of(record.group)  # type: ignore[arg-type]
        assert role is not None and record.rank is not None
        offered = join.bootstrap
        r.joined[(role, join.slot)] = _Joined(
            record.group,  # type: ignore[arg-type]
            record.rank,
            join.incarnation,
            join.digest,
            record.offset,
            None if offered is UNSET else dict(offered),
        )
        if r.digest is None:
            r.digest = join.digest
        if len(r.joined) == len(r.every_slot()):
            r.status = ADMITTED
            r.deadline = None
            effects.append(r.epoch_effect(record.offset))
            offered = r.joined[(PUBLISHER, 0)].bootstrap
            if r.bootstrap is None and offered is not None:
                self._publish(r, offered, record, effects)

    @staticmethod
    def _publish(
        r: Refit, bootstrap: dict[str, Any], record: Record, effects: list[Effect]
    ) -> None:
        """The epoch's bootstrap, to the admitted members' own journals (nowhere else)."""
        r.bootstrap = dict(bootstrap)
        effects.append(
            RefitBootstrap(
                refit=r.name,
                epoch=r.epoch,
                bootstrap=r.bootstrap,
                members=tuple((m["group"], m["rank"]) for m in r.members()),
                offset=record.offset,
            )
        )

    def _transfer(
        self, fold: FoldContext, start: TransferInput, record: Record, effects: list[Effect]
    ) -> None:
        r = self._refits[start.refit]
        key = start.key
        t = self._transfer_by_key(r, key)
        if t is None:
            number = len(r.transfers) + 1
            t = r.transfers[number] = _Transfer(number, key, record.offset)
            r.by_key[key] = number
        t.attempt += 1
        t.epoch = r.epoch
        t.status = RUNNING
        t.detail = f"attempt {t.attempt} in epoch {r.epoch}"
        t.done = set()
        t.offset = record.offset
        t.deadline = fold.now + round(r.spec["transfer_timeout_s"] * _S)
        r.running = t.id
        effects.append(r.transfer_effect(t, record.offset))

    def _status(
        self, fold: FoldContext, report: TransferStatusInput, record: Record, effects: list[Effect]
    ) -> None:
        r = self._refits[report.refit]
        t = r.transfers[report.transfer]
        slot = r.member_slot(record.group, record.rank)  # type: ignore[arg-type]
        assert slot is not None
        if report.status == "failed":
            j = r.joined[slot]
            said = f": {report.detail}" if report.detail else ""
            self._fail(
                r,
                t,
                f"{_slot_name(*slot, j.group, j.rank)} reported failure{said}",
                record,
                effects,
            )
            return
        if slot in t.done:
            return
        t.done.add(slot)
        if len(t.done) == len(r.every_slot()):
            t.status = COMPLETED
            t.detail = f"every slot reported done (attempt {t.attempt}, epoch {t.epoch})"
            t.deadline = None
            r.running = None
            effects.append(r.transfer_effect(t, record.offset))

    def _fail(
        self, r: Refit, t: _Transfer, detail: str, record: Record, effects: list[Effect]
    ) -> None:
        t.status = FAILED
        t.detail = detail
        t.deadline = None
        r.running = None
        effects.append(r.transfer_effect(t, record.offset))

    def _fail_running(self, r: Refit, detail: str, record: Record, effects: list[Effect]) -> None:
        if r.running is not None:
            self._fail(r, r.transfers[r.running], detail, record, effects)

    # -- hooks -------------------------------------------------------------------------------

    def view_committed(
        self,
        fold: FoldContext,
        g: GroupState,
        view: View,
        base: View | None,
        record: Record,
        effects: list[Effect],
    ) -> None:
        """A view of either group moves every refit over it to a new epoch: its communicators
        were built over the old membership."""
        for name in sorted(self._refits):
            r = self._refits[name]
            role = r.role_of(g.name)
            if role is None:
                continue
            cause = f"view {view.version} of {role} group {g.name!r} committed"
            self._fail_running(r, f"the refit's epoch moved: {cause}", record, effects)
            self._new_epoch(fold, r, cause, record, effects)

    def rank_joined(
        self, fold: FoldContext, g: GroupState, rank: int, record: Record, effects: list[Effect]
    ) -> None:
        """A replacement joins a refit through its own ``refit_join``: nothing to do here."""

    def rank_lost(
        self, fold: FoldContext, g: GroupState, rank: int, record: Record, effects: list[Effect]
    ) -> None:
        """A member of a refit's current epoch went OFFLINE: the running attempt fails naming
        it, and the epoch moves (the survivors must not go on with a world that lost a rank)."""
        for name in sorted(self._refits):
            r = self._refits[name]
            slot = r.member_slot(g.name, rank)
            if slot is None:
                continue
            who = _slot_name(*slot, g.name, rank)
            reason = next(
                (
                    e.reason
                    for e in reversed(effects)
                    if isinstance(e, RankState) and e.group == g.name and e.rank == rank
                ),
                "",
            )
            what = f"{who} went OFFLINE" + (f" ({reason})" if reason else "")
            self._fail_running(r, what, record, effects)
            self._new_epoch(fold, r, what, record, effects, lost=slot)

    def tick(self, fold: FoldContext, record: Record, effects: list[Effect]) -> None:
        now = fold.now
        for name in sorted(self._refits):
            r = self._refits[name]
            if r.status == WAITING and r.deadline is not None and now >= r.deadline:
                r.status = TIMED_OUT
                r.missing = tuple(self._missing(r))
                r.deadline = None
                effects.append(r.epoch_effect(record.offset))
            if r.running is not None:
                t = r.transfers[r.running]
                if t.deadline is not None and now >= t.deadline:
                    waiting = [_slot_name(*s) for s in r.every_slot() if s not in t.done]
                    detail = (
                        f"timed out after {r.spec['transfer_timeout_s']:g} s; no done from "
                        f"{abridged(waiting)}"
                    )
                    self._fail(r, t, detail, record, effects)
                    self._new_epoch(
                        fold,
                        r,
                        f"transfer {t.key!r} attempt {t.attempt} timed out",
                        record,
                        effects,
                    )

    def next_deadline(self) -> int | None:
        deadlines = []
        for r in self._refits.values():
            if r.status == WAITING and r.deadline is not None:
                deadlines.append(r.deadline)
            if r.running is not None and r.transfers[r.running].deadline is not None:
                deadlines.append(r.transfers[r.running].deadline)
        return min(deadlines, default=None)

    def waits_on_ranks(self) -> bool:
        return self.next_deadline() is not None

    def resume(self, now: int) -> None:
        """The coordinator was down: the ranks could not join or report meanwhile, so each
        deadline starts again from now."""
        for r in self._refits.values():
            if r.status == WAITING and r.deadline is not None:
                r.deadline = now + round(r.spec["readiness_timeout_s"] * _S)
            if r.running is not None:
                t = r.transfers[r.running]
                t.deadline = now + round(r.spec["transfer_timeout_s"] * _S)

    def snapshot(self) -> dict[str, Any]:
        return {"refits": [self._refits[n].to_dict() for n in sorted(self._refits)]}

    def restore(self, data: dict[str, Any]) -> None:
        self._refits = {d["spec"]["refit"]: Refit.from_dict(d) for d in data.get("refits", [])}
