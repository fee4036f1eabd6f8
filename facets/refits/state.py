"""A refit's state in the fold: its definition, the epoch's slots and transfers, and how the
routes and the story read them (``Refit.status`` and the effects' bodies). The rules that change
it are ``fold.py``'s."""

from __future__ import annotations

from typing import Any

from .effects import RefitEpochChanged, TransferChanged

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
