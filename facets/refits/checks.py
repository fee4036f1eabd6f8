"""The refits facet's checks: which inputs it refuses, with which code, and which repeat an
earlier one. They read the refits (``state.py``) and decide nothing; the steps are ``fold.py``'s.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ...coordinator.fold.facets import FoldContext, Refusal
from ...coordinator.fold.fencing import online_rank_refusal
from ...coordinator.fold.reasons import abridged
from ...coordinator.fold.state import GroupState
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
from .inputs import (
    _DIGEST,
    _KEY,
    MAX_BOOTSTRAP_BYTES,
    decode,
    spec_problem,
)
from .state import (
    ADMITTED,
    COMPLETED,
    FAILED,
    PUBLISHER,
    RUNNING,
    SUBSCRIBER,
    TIMED_OUT,
    WAITING,
    Refit,
    _slot_name,
    _Transfer,
)


class RefitChecks:
    """``Refits.refusal`` and ``Refits.repeat_of`` (``coordinator.fold.facets.Facet``), over the
    facet's refits by name (the same dict the fold steps, read only here)."""

    def __init__(self, refits: dict[str, Refit]) -> None:
        self._refits = refits

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
        t = self.transfer_by_key(r, key)
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
            t = self.transfer_by_key(r, key) if isinstance(key, str) else None
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
    def transfer_by_key(r: Refit, key: str) -> _Transfer | None:
        number = r.by_key.get(key)
        return None if number is None else r.transfers[number]

    def _not_admitted(self, r: Refit) -> str:
        """Why the epoch is not admitted, naming the slots it waits for or never had."""
        if r.status == WAITING:
            return f"is waiting for {abridged(self.missing(r))}"
        return (
            f"timed out: {abridged(list(r.missing))} never joined (a view change of either "
            "group or a restart opens a new epoch)"
        )

    @staticmethod
    def missing(r: Refit) -> list[str]:
        return [
            _slot_name(role, slot) for role, slot in r.every_slot() if (role, slot) not in r.joined
        ]
