"""The refits facet's worker part: a worker's side of a weight refit, join, admission,
bootstrap, transfers (docs/refit.md).

>>> refit = agent.refit("rl")                        # this rank's client of refit "rl"
>>> admitted = refit.join(slot=rank, digest=plan.digest(),  # blocks until every slot joined
...                       make_bootstrap=make_bootstrap)     # publisher slot 0 only
>>> boot = refit.bootstrap(admitted)                        # it came with the admission
>>> t = refit.transfer(admitted, key="step-100")            # publishers start it (idempotent)
>>> ... move the shards over the data plane (agent.refit) ...
>>> refit.report(t, ok=True)
>>> refit.wait_transfer(t)                                  # completed, or TransferFailed(detail)

The coordinator decides everything (``fold.py``); this module follows its updates
(``refit_epoch``, ``transfer``, this rank's ``refit_bootstrap``) and sends the worker's events
through the agent, which loads it by the name the facet's ``protocol.py`` declares (``WORKER``)
and offers its :meth:`RefitsWorker.refit`, :attr:`RefitsWorker.refits` and
:meth:`RefitsWorker.create_refit` as its own (``agent/facets.py``). It is a module of the worker
side: it imports the agent and the facet's protocol, never the facet's server parts, and no
server module imports it (the import contracts say so).

Every wait ends early with :class:`RefitEpochMoved` when the refit's epoch moves past the one
the caller holds (a view of either group, a member lost, a transfer timed out): the caller then
joins again, on new communicators, never retrying on the old ones.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...agent.events import EventAnswers, EventRefused
from ...agent.facets import WorkerSide
from ...wire.codes import AGENT_STOPPED, REFIT_NOT_READY, STALE_REFIT_EPOCH
from .protocol import RefitBootstrapUpdate, RefitEpochUpdate, TransferUpdate

#: How long a call waits for the coordinator's answer to one of its events.
ANSWER_S = 30.0
#: How many epochs' first updates a tracker keeps per refit.
_CAUSES_KEPT = 16


class RefitRefused(EventRefused):
    """The coordinator refused a refit event; ``code`` is its error code."""


class RefitEpochMoved(RefitRefused):
    """The refit moved to a newer epoch (``epoch``) while this caller held an older one."""

    def __init__(self, epoch: int, cause: str) -> None:
        super().__init__(STALE_REFIT_EPOCH, f"the refit is at epoch {epoch}: {cause}")
        self.epoch = epoch
        self.cause = cause


class TransferFailed(RefitRefused):
    """A transfer's attempt failed; ``detail`` says who or what."""

    def __init__(self, key: str, attempt: int, detail: str) -> None:
        super().__init__("transfer_failed", f"transfer {key!r} attempt {attempt}: {detail}")
        self.key = key
        self.attempt = attempt


@dataclass(frozen=True)
class Admission:
    """An admitted epoch, as this rank sees it."""

    refit: str
    epoch: int
    lanes: int
    digest: str
    role: str
    slot: int
    #: this rank's rank in the refit's world, and the world's size (publishers + subscribers)
    refit_rank: int
    world_size: int
    publisher_ranks: tuple[int, ...]
    subscriber_ranks: tuple[int, ...]


@dataclass(frozen=True)
class Transfer:
    refit: str
    id: int
    key: str
    attempt: int
    epoch: int
    #: ``running`` (this attempt is to be carried out) or ``completed`` (nothing left to do)
    status: str = "running"


class RefitTracker:
    """What the coordinator said about the refits this rank follows; fed by the agent's
    driver thread, read and waited on by :class:`RefitClient` calls."""

    def __init__(self, group: str, rank: int, send: Callable[[str, dict[str, Any]], None]) -> None:
        self.group = group
        self.rank = rank
        self._cond = threading.Condition()
        self.epochs: dict[str, RefitEpochUpdate] = {}
        #: the first update of each of a refit's recent epochs (its ``cause`` and ``lost`` say
        #: what ended the one before), by epoch number: several epochs may pass between two
        #: looks at :attr:`epochs`
        self.causes: dict[str, dict[int, RefitEpochUpdate]] = {}
        self.transfers: dict[str, dict[int, TransferUpdate]] = {}
        self.bootstraps: dict[str, RefitBootstrapUpdate] = {}
        #: the epoch of each refit whose bootstrap this rank offered with its join
        self.offered: dict[str, int] = {}
        #: the answers to this rank's refit events (``agent.events``: a refit's are a facet's)
        self._answers = EventAnswers(send)
        self.stopped: str | None = None

    # -- from the agent's driver -----------------------------------------------------------

    def on_update(self, update: RefitEpochUpdate | TransferUpdate | RefitBootstrapUpdate) -> None:
        name = update.refit
        with self._cond:
            if isinstance(update, RefitEpochUpdate):
                causes = self.causes.setdefault(name, {})
                causes.setdefault(update.epoch, update)
                while len(causes) > _CAUSES_KEPT:
                    del causes[min(causes)]
                held = self.epochs.get(name)
                if held is None or (update.epoch, update.offset) >= (held.epoch, held.offset):
                    self.epochs[name] = update
            elif isinstance(update, TransferUpdate):
                self.transfers.setdefault(name, {})[update.transfer] = update
            elif isinstance(update, RefitBootstrapUpdate):
                self.bootstraps[name] = update
            self._cond.notify_all()

    def on_answer(
        self, kind: str, fields: dict[str, Any], offset: int | None, error: str | None, detail: str
    ) -> None:
        self._answers.on_answer(kind, fields, offset, error, detail)

    def on_stopped(self, why: str) -> None:
        with self._cond:
            self.stopped = why
            self._cond.notify_all()
        self._answers.on_stopped(why)

    # -- for the client ----------------------------------------------------------------------

    def send(self, kind: str, fields: dict[str, Any], timeout: float = ANSWER_S) -> None:
        """Send one event and wait for its answer; raise :class:`RefitRefused` on a refusal
        (:class:`RefitEpochMoved` when the refit is at a newer epoch)."""
        try:
            self._answers.send(kind, fields, timeout)
        except EventRefused as exc:
            if exc.code == STALE_REFIT_EPOCH:
                with self._cond:
                    held = self.epochs.get(fields["refit"])
                raise RefitEpochMoved(-1 if held is None else held.epoch, exc.detail) from None
            raise RefitRefused(exc.code, exc.detail) from None

    def wait(self, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if self.stopped is not None:
                    raise RefitRefused(AGENT_STOPPED, f"while waiting for {what}: {self.stopped}")
                value = predicate()
                if value is not None:
                    return value
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"rank {self.rank}: {what} within {timeout:g} s")
                self._cond.wait(left)


class RefitClient:
    """This rank's handle on one refit (``Agent.refit(name)``: :meth:`RefitsWorker.refit`)."""

    def __init__(self, tracker: RefitTracker, name: str) -> None:
        self.tracker = tracker
        self.name = name

    def current_epoch(self, timeout: float = ANSWER_S) -> RefitEpochUpdate:
        """The refit's epoch as last heard (waits for the first word of it)."""
        return self.tracker.wait(
            lambda: self.tracker.epochs.get(self.name), timeout, f"refit {self.name!r}'s epoch"
        )

    def join(
        self,
        slot: int,
        digest: str,
        timeout: float = 120.0,
        make_bootstrap: Callable[[], dict[str, Any]] | None = None,
    ) -> Admission:
        """Join the current epoch with ``slot`` and the plan's ``digest``; wait until every slot
        joined (the epoch is admitted). An epoch that moves meanwhile is joined again, until
        ``timeout``; a refusal (a digest mismatch, a slot held by another rank, a readiness
        timeout) raises :class:`RefitRefused` with the coordinator's reason.

        Publisher slot 0 (refit rank 0) may pass ``make_bootstrap``: each join sends a fresh
        bootstrap with it, which the coordinator publishes to the members with the admission,
        so :meth:`bootstrap` has it at once instead of after another round trip."""
        deadline = time.monotonic() + timeout
        while True:
            epoch = self.current_epoch(max(0.1, deadline - time.monotonic()))
            number = epoch.epoch
            if epoch.status == "timed_out":
                raise RefitRefused(
                    REFIT_NOT_READY,
                    f"refit {self.name!r} epoch {number} timed out waiting for "
                    f"{', '.join(epoch.missing)}",
                )
            try:
                if not self._holds(epoch, slot):
                    fields: dict[str, Any] = {
                        "refit": self.name,
                        "epoch": number,
                        "slot": slot,
                        "digest": digest,
                    }
                    if make_bootstrap is not None:
                        if (self._role(), slot) != ("publisher", 0):
                            raise ValueError(
                                "only publisher slot 0 (refit rank 0) offers the bootstrap, not "
                                f"{self._role()} slot {slot}"
                            )
                        fields["bootstrap"] = make_bootstrap()
                    self.tracker.send("refit_join", fields)
                    if make_bootstrap is not None:
                        self.tracker.offered[self.name] = number
                admitted = self.tracker.wait(
                    lambda n=number: self._admitted(n, slot),
                    max(0.1, deadline - time.monotonic()),
                    f"refit {self.name!r} epoch {number} to be admitted",
                )
            except RefitEpochMoved:
                if time.monotonic() >= deadline:
                    raise
                # the refusal can arrive before the update that moved the epoch
                self.tracker.wait(
                    lambda n=number: self._moved_past(n),
                    max(0.1, deadline - time.monotonic()),
                    f"refit {self.name!r} to move past epoch {number}",
                )
                continue
            return admitted

    def _moved_past(self, number: int) -> bool | None:
        epoch = self.tracker.epochs.get(self.name)
        return True if epoch is not None and epoch.epoch > number else None

    def _holds(self, epoch: RefitEpochUpdate, slot: int) -> bool:
        if epoch.status != "admitted":
            return False
        ranks = epoch.publisher_ranks if self._role() == "publisher" else epoch.subscriber_ranks
        return slot < len(ranks) and ranks[slot] == self.tracker.rank

    def _role(self) -> str:
        epoch = self.tracker.epochs.get(self.name)
        assert epoch is not None
        return "publisher" if self.tracker.group == epoch.groups[0] else "subscriber"

    def _admitted(self, number: int, slot: int) -> Admission | None:
        epoch = self.tracker.epochs.get(self.name)
        if epoch is None:
            return None
        if epoch.epoch > number:
            raise RefitEpochMoved(epoch.epoch, epoch.cause)
        if epoch.status == "timed_out":
            raise RefitRefused(
                REFIT_NOT_READY,
                f"refit {self.name!r} epoch {number} timed out waiting for "
                f"{', '.join(epoch.missing)}",
            )
        if epoch.status != "admitted":
            return None
        role = self._role()
        pubs, subs = epoch.publisher_ranks, epoch.subscriber_ranks
        return Admission(
            refit=self.name,
            epoch=number,
            lanes=epoch.lanes,
            digest=str(epoch.digest),
            role=role,
            slot=slot,
            refit_rank=slot if role == "publisher" else len(pubs) + slot,
            world_size=len(pubs) + len(subs),
            publisher_ranks=pubs,
            subscriber_ranks=subs,
        )

    def verdict(self, admitted: Admission) -> Callable[[], Any]:
        """The coordinator's word on ``admitted``'s epoch, for the refit world's watch
        (``open_world(..., verdict=client.verdict(admitted))``): a function that returns None
        while the epoch stands, else why it is over (the refit moved to a newer epoch: a member
        went OFFLINE, whom it names as dead, or a view committed). It reads what the agent
        already heard, asking nobody, so a transfer sees the death of the store's host
        (publisher slot 0) as any member's. (An ``agent.refit.Verdict``; that package, and
        torch with it, is imported only here, by a worker that opens a refit world.)"""
        from ...agent.refit.errors import Peer, Verdict

        def moved() -> Verdict | None:
            epoch = self.tracker.epochs.get(self.name)
            if epoch is None or epoch.epoch <= admitted.epoch:
                return None
            # what ended this epoch: the cause of the next one (later ones may follow at once:
            # a lost member's view change moves the epoch again)
            began = self.tracker.causes.get(self.name, {}).get(admitted.epoch + 1)
            if began is None:  # not heard (a resync sends the latest epoch only)
                began = epoch
            return Verdict(
                f"the coordinator moved refit {self.name!r} from epoch {admitted.epoch} to "
                f"{began.epoch}: {began.cause}",
                () if began.lost is None else (Peer(*began.lost),),
            )

        return moved

    def check(self, admitted: Admission) -> None:
        """Raise :class:`RefitEpochMoved` if the refit has moved past ``admitted``'s epoch."""
        epoch = self.tracker.epochs.get(self.name)
        if epoch is not None and epoch.epoch > admitted.epoch:
            raise RefitEpochMoved(epoch.epoch, epoch.cause)

    def bootstrap(
        self,
        admitted: Admission,
        make: Callable[[], dict[str, Any]] | None = None,
        timeout: float = 60.0,
    ) -> dict[str, Any]:
        """The data plane's rendezvous of ``admitted``'s epoch: refit rank 0 makes it
        (``make()``) and publishes it, unless it offered one with its join (then it comes with
        the admission); every member waits for it. Asked again in the same epoch, it is the
        same one (open the world once an epoch; it carries many transfers)."""
        held = self.tracker.bootstraps.get(self.name)
        if held is not None and held.epoch == admitted.epoch:
            return held.bootstrap  # one bootstrap an epoch: its world carries every transfer
        if admitted.refit_rank == 0 and self.tracker.offered.get(self.name) != admitted.epoch:
            if make is None:
                raise ValueError("refit rank 0 publishes the bootstrap: pass make=")
            self.tracker.send(
                "refit_bootstrap",
                {"refit": self.name, "epoch": admitted.epoch, "bootstrap": make()},
            )

        def published() -> dict[str, Any] | None:
            self.check(admitted)
            b = self.tracker.bootstraps.get(self.name)
            return b.bootstrap if b is not None and b.epoch == admitted.epoch else None

        return self.tracker.wait(published, timeout, f"refit {self.name!r}'s bootstrap")

    def transfer(self, admitted: Admission, key: str, timeout: float = 60.0) -> Transfer:
        """The running attempt of transfer ``key`` in ``admitted``'s epoch: a publisher starts it
        (idempotent: every publisher may ask), a subscriber waits for it to start. A transfer
        that already completed is returned with ``status`` ``completed``: nothing to move."""
        if admitted.role == "publisher":
            self.tracker.send("transfer", {"refit": self.name, "epoch": admitted.epoch, "key": key})

        def running() -> Transfer | None:
            self.check(admitted)
            for t in self.tracker.transfers.get(self.name, {}).values():
                if t.key != key:
                    continue
                if t.status == "completed":
                    return Transfer(self.name, t.transfer, key, t.attempt, t.epoch, "completed")
                if t.epoch == admitted.epoch and t.status == "running":
                    return Transfer(self.name, t.transfer, key, t.attempt, admitted.epoch)
            return None

        return self.tracker.wait(running, timeout, f"transfer {key!r} to start")

    def report(self, t: Transfer, ok: bool, detail: str = "") -> None:
        """This member's outcome of ``t``'s attempt."""
        fields: dict[str, Any] = {
            "refit": self.name,
            "epoch": t.epoch,
            "transfer": t.id,
            "attempt": t.attempt,
            "status": "done" if ok else "failed",
        }
        if detail:
            fields["detail"] = detail[:1000]
        self.tracker.send("transfer_status", fields)

    def wait_transfer(self, t: Transfer, timeout: float = 600.0) -> TransferUpdate:
        """Wait until ``t``'s attempt completes (every member reported done); raise
        :class:`TransferFailed` with the coordinator's reason when it fails."""

        def outcome() -> TransferUpdate | None:
            held = self.tracker.transfers.get(self.name, {}).get(t.id)
            if held is None or held.attempt < t.attempt:
                return None
            if held.attempt > t.attempt:
                raise TransferFailed(t.key, t.attempt, f"attempt {held.attempt} started since")
            if held.status == "failed":
                raise TransferFailed(t.key, t.attempt, held.detail)
            return held if held.status == "completed" else None

        return self.tracker.wait(outcome, timeout, f"transfer {t.key!r} to complete")


class RefitsWorker:
    """The facet's worker part, one per agent: what the coordinator said of the refits this
    rank follows (:attr:`refits`, fed the facet's updates and its events' answers by the
    agent's driver thread), and what the Agent offers of it as its own: ``agent.refit(name)``,
    ``agent.refits`` and ``agent.create_refit(...)``."""

    def __init__(self, side: WorkerSide) -> None:
        self.side = side
        #: what the coordinator said of the refits (``Agent.refits``)
        self.refits = RefitTracker(side.group, side.rank, side.send)

    def refit(self, name: str) -> RefitClient:
        """This rank's client of refit ``name``: join it, wait for admission, share the
        bootstrap, run and report transfers (docs/refit.md)."""
        return RefitClient(self.refits, name)

    def create_refit(self, refit: str, publisher: str, subscriber: str, **spec: Any) -> dict:
        """``POST /refits`` (the operator's: this needs the operator token when auth is on)."""
        body = {"refit": refit, "publisher": publisher, "subscriber": subscriber, **spec}
        return self.side.request("POST", "/refits", json=body)  # type: ignore[no-any-return]

    # -- the agent's hooks ------------------------------------------------------------------

    def on_update(self, update: RefitEpochUpdate | TransferUpdate | RefitBootstrapUpdate) -> None:
        self.refits.on_update(update)

    def on_answer(
        self, kind: str, fields: dict[str, Any], offset: int | None, error: str | None, detail: str
    ) -> None:
        self.refits.on_answer(kind, fields, offset, error, detail)

    def on_stopped(self, why: str) -> None:
        self.refits.on_stopped(why)


#: What the agent makes of this module (``wire.facets.WorkerPart``, ``agent/facets.py``).
WORKER = RefitsWorker
