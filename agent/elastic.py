"""The elastic training step, written once for the wrappers that run it (``agent.ddp``'s DDP,
``agent.fsdp``'s HSDP): one view per step, every member commits or skips it, joiners heal.

A step of a wrapped model (``ElasticStep``):

- **It runs on one view.** ``begin_step`` (the first forward of a step calls it) pins the
  installed view. A rank that finds a newer view leaves the old one (poisoning it, so members
  still on it fail fast) and enters the new one, healing its state into it first (the
  wrapper's ``_heal_into``). After a failed view it waits up to ``view_wait_s`` (the
  collective timeout by default) for the next one; the step runs on the failed view (and is
  skipped) if none comes. An inactive rank waits up to ``inactive_wait_s`` for a view that
  activates it; meanwhile its steps run locally and are never committed.
- **Every member commits or skips it.** ``should_commit`` ends the step: the members vote on
  their collectives' success (``agent.agreement.StepAgreement``), and all of them get the
  same answer. ``ElasticOptimizer.step()`` steps the optimizer only on a commit.
- Nothing raises for a peer's failure: ``should_commit()`` returns False and
  ``last_failed_ranks`` says whom the failed step's hints named.

What a wrapper provides (the methods ``ElasticStep`` leaves to it): ``_heal_into(view)``
(make this rank's state the view's), ``_pin(view)`` and ``_collectives_outcome(view)`` (run
the step's collectives on the view, then say whether they succeeded), and optionally
``_decide`` (HSDP: a replica steps only if every shard's group committed), ``_committing``,
``_end_mutation`` and ``_say_skipped``; and ``moves_while_waiting``.
"""

from __future__ import annotations

import ctypes
import io
import logging
import math
from collections.abc import Callable
from typing import Any, ClassVar, Protocol, cast

import torch

from .agreement import StepAgreement
from .dataplane.group import ElasticProcessGroup
from .dataplane.plane import DataPlane
from .dataplane.view import ViewGroup
from .dataplane.work import Work
from .heal import join_tensors, split_tensors

log = logging.getLogger("foldplane.elastic")


class ElasticStep:
    """The step rules of an elastic wrapper over a foldplane group (see the module's text).

    The wrapper calls ``_init_step`` in its constructor and provides the methods marked
    "the wrapper's" below.
    """

    #: Whether a move found while ``begin_step`` waits (a next view after a failed one, an
    #: activation) is made in the same step. DDP: yes, a rank moves alone. HSDP: no, at the
    #: next step, after the processes of the replica have compared their views again.
    moves_while_waiting: ClassVar[bool] = True

    def _init_step(
        self,
        group: ElasticProcessGroup,
        agreement_prefix: str,
        inactive_wait_s: float,
        view_wait_s: float | None,
    ) -> None:
        self._step_group = group
        self.inactive_wait_s = inactive_wait_s
        self.view_wait_s = view_wait_s
        #: Steps this rank has committed (the same on every member of a view after it entered).
        self.committed_steps = 0
        self._optimizers: list[torch.optim.Optimizer] = []
        self._agreement = StepAgreement(self._plane, agreement_prefix)
        self._view: ViewGroup | None = None  # the view this rank entered (synced state on)
        self._entered: tuple[int, ...] | None = None  # the members of the last view entered
        self._index = 0  # the next step's number within ``_view``
        self._step_view: ViewGroup | None = None  # the view of the step in progress
        self._in_step = False
        self._failed_works: list[Work] = []

    def close(self) -> bool:
        """Stop the step agreement's threads, bounded (``StepAgreement.close``; an exit hook
        does it for a wrapper left open): True if they ended. The data plane and the group are
        the caller's and stay open; a later step connects again."""
        return self._agreement.close()

    @property
    def _plane(self) -> DataPlane:
        """The group's data plane: the ``DataPlane`` that owns it (the group itself needs only
        its ``GroupPlane`` part)."""
        return cast(DataPlane, self._step_group.plane)

    # -- the wrapper's ---------------------------------------------------------------------------

    def _heal_into(self, view: ViewGroup) -> bool:
        """Make this rank's state the view's (the members' with the most committed steps) and
        ``committed_steps`` theirs; False if the view failed on the way."""
        raise NotImplementedError

    def _pin(self, view: ViewGroup | None) -> None:
        """Run the step's collectives on ``view`` (None: a local step, none run)."""
        raise NotImplementedError

    def _collectives_outcome(self, view: ViewGroup | None) -> tuple[bool, list[Work]]:
        """Whether the step's collectives on ``view`` succeeded (False for a local step), and
        their works; unpins them."""
        raise NotImplementedError

    def _decide(self, view: ViewGroup | None, agreed: bool) -> bool:
        """Whether this rank steps, given whether the members of ``view`` agreed to commit."""
        return agreed

    def _committing(self) -> None:
        """The step is committed: the caller steps its optimizer now."""

    def _end_mutation(self) -> None:
        """The caller's optimizer step is over: ``ElasticOptimizer`` calls it after stepping (DDP
        releases its heal servers' pin here; HSDP heals over the view, nothing to release)."""

    def _say_skipped(self, view: ViewGroup) -> None:
        """Log that a step of ``view`` was skipped, and why."""
        failed = self.last_failed_ranks
        newer = self._plane.current_view()
        if failed:
            why = f"failed ranks {failed}"
        elif newer is not None and newer.version > view.version:
            why = f"view {newer.version} committed during it"
        else:
            why = "another member's operation failed"
        # Numbered as ``committed_steps`` counts (the step after the last committed one),
        # the one numbering a script and its heal see; ``_index`` is the agreement's key.
        log.warning(
            "rank %d: step %d of view %d skipped on every member (%s); "
            "its batch goes again in the next step",
            self._plane.rank,
            self.committed_steps + 1,
            view.version,
            why,
        )

    # -- the user's surface ----------------------------------------------------------------------

    def attach_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Heal ``optimizer``'s state together with the model's (``ElasticOptimizer`` calls it)."""
        if optimizer not in self._optimizers:
            self._optimizers.append(optimizer)

    def should_commit(self) -> bool:
        """End the step: True if every member of its view succeeded (then the caller steps).

        All members of the view get the same answer. Idempotent per step: a second call
        without a new step returns False.
        """
        if not self._in_step:
            return False
        self._in_step = False
        view = self._step_view
        ok, works = self._collectives_outcome(view)
        agreed = False
        if view is not None:  # a local step is never committed
            index = self._index
            self._index += 1
            agreed = self._agreement.agree(view, index, ok)
        committed = self._decide(view, agreed)
        if committed:
            self._committing()
            self.committed_steps += 1
            self._failed_works = []
        else:
            self._failed_works = [w for w in works if not w.wait()]
            if view is not None:
                self._say_skipped(view)
        return committed

    @property
    def last_failed_ranks(self) -> list[int]:
        """The ranks the failed operations of the last skipped step blamed (their hints)."""
        failed: set[int] = set()
        for work in self._failed_works:
            hint = self._step_group.get_failed_ranks_hint(work)
            failed.update(r for r, bad in enumerate(hint.tolist()) if bad)
        return sorted(failed)

    @property
    def view_version(self) -> int | None:
        """The version of the view the last step ran on (None if that step was local)."""
        return None if self._step_view is None else self._step_view.version

    @property
    def step_index(self) -> int:
        """The last step's number within its view (steps are numbered from 0 in each view)."""
        return self._index - 1

    @property
    def members(self) -> tuple[int, ...]:
        """The members the last step's gradients were averaged over."""
        return () if self._step_view is None else self._step_view.members

    # -- one step --------------------------------------------------------------------------------

    def _begin(self, current: ViewGroup) -> None:
        """Pin the step's view, starting from ``current`` (the installed view): stay in the
        view entered, or leave it and enter ``current``; after a failed view, wait for the
        next; inactive, wait to be activated (the rules of the module's text)."""
        plane = self._plane
        while True:
            if self._view is not None and current is not self._view:
                self._view.leave(f"rank {plane.rank} moved on to view {current.version}")
                self._view = None
            elif self._view is not None and current.failure is not None:
                self._view = None  # it failed: wait for the next view instead of failing again
            if self._view is not None:
                break
            if current.failure is not None:
                wait = (
                    self.view_wait_s if self.view_wait_s is not None else plane.collective_timeout_s
                )
                newer = plane.wait_for_view(lambda v, c=current: v.version > c.version, wait)
                if newer is current or not self.moves_while_waiting:
                    break  # no next view yet: this step runs on the failed one and is skipped
            elif not current.active:
                rank = plane.rank
                activated = plane.wait_for_view(
                    lambda v, r=rank: r in v.members, self.inactive_wait_s
                )
                if not self.moves_while_waiting or activated is None or not activated.active:
                    self._start(None)  # still inactive: a local step, never committed
                    return
            elif self._enter(current) or not self.moves_while_waiting:
                break
            current = plane.view_for_op("begin_step")
        self._start(self._view if self._view is not None else current)

    def _enter(self, view: ViewGroup) -> bool:
        """Heal into ``view`` and make it the one this rank is in; False if the view failed."""
        if not self._heal_into(view):
            return False
        self._view, self._index = view, 0
        say_entered(self._plane.rank, view, self._entered, self.committed_steps)
        self._entered = view.members
        return True

    def _start(self, view: ViewGroup | None) -> None:
        self._step_view = view
        self._in_step = True
        self._pin(view)


class ElasticOptimizer:
    """An optimizer whose ``step()`` runs only when every member of the step's view agreed.

    ``step()`` returns True if it stepped. ``zero_grad``, ``param_groups``, ``state``,
    ``state_dict`` ... are the wrapped optimizer's. Its state heals together with the model's.
    """

    def __init__(self, model: ElasticStep, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer
        model.attach_optimizer(optimizer)

    def step(self, closure: Callable[[], float] | None = None) -> bool:
        if not self.model.should_commit():
            return False
        try:
            self.optimizer.step(closure)
        finally:
            self.model._end_mutation()
        return True

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)


def say_entered(
    rank: int, view: ViewGroup, before: tuple[int, ...] | None, committed_steps: int
) -> None:
    """One line as ``rank`` enters ``view`` after a view of members ``before``: a warning when
    some of them are gone (what a recovery did, in its own words), INFO when ranks joined."""
    if before is None:
        return
    left = sorted(set(before) - set(view.members))
    joined = sorted(set(view.members) - set(before))
    if left:
        log.warning(
            "rank %d: view %d: ranks %s go on from step %d without %s",
            rank,
            view.version,
            list(view.members),
            committed_steps + 1,
            _ranks_text(left),
        )
    if joined:
        log.info(
            "rank %d: view %d: %s joined at step %d",
            rank,
            view.version,
            _ranks_text(joined),
            committed_steps + 1,
        )


def _ranks_text(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"


class StateHolder(Protocol):
    """What healing needs of whatever holds the state: the state, and a way to load it."""

    def state_for_healing(self) -> dict[str, Any]: ...

    def load_healed_state(self, state: dict[str, Any]) -> None: ...


def sync_state(
    group: ElasticProcessGroup, view: ViewGroup, committed_steps: int, holder: StateHolder
) -> int | None:
    """Entering ``view``: make every member hold the state of the member with the most steps.

    The members all-gather their ``committed_steps``; if the counts differ (a replacement has
    0) or nobody has stepped yet (the first view: ranks may have initialised differently), the
    member with the most steps (the lowest rank among equals) sends ``holder``'s state to the
    members behind (every other member before the first step), which load it. Returns the
    steps every member has committed now, or None if the view failed on the way.
    """
    counts = [torch.zeros(1, dtype=torch.int64) for _ in range(group.world_size)]
    mine = torch.tensor([committed_steps], dtype=torch.int64)
    if not group.all_gather(counts, mine, async_op=True, view=view).wait():
        return None
    steps = {m: int(counts[m].item()) for m in view.members}
    top = max(steps.values())
    if top == 0 or len(set(steps.values())) > 1:
        source = min(m for m, s in steps.items() if s == top)
        # Members with as many committed steps as the source hold its state already (every
        # member commits the same steps); before the first step nobody is known to.
        behind = [m for m in view.members if m != source and (top == 0 or steps[m] < top)]
        if not send_state(group, view, source, behind, holder):
            return None
        log.info(
            "rank %d: view %d: state of rank %d (%d steps) on every member",
            group.plane.rank,
            view.version,
            source,
            top,
        )
    return top


def send_state(
    group: ElasticProcessGroup,
    view: ViewGroup,
    source: int,
    receivers: list[int],
    holder: StateHolder,
) -> bool:
    """``source`` hands ``holder``'s state to ``receivers`` over ``view``; they load it. False:
    it failed.

    In three parts: a header's length, the header (the state's structure, with every
    tensor replaced by its number, and each tensor's dtype and shape, saved by
    ``torch.save``), then one flat buffer per dtype holding every tensor of that dtype.
    Broadcast when every other member receives it; sent to each receiver in turn when only
    some do (a replacement joining members that hold the state), so that the state crosses
    the network once per receiver and not once per member.
    """
    rank = group.plane.rank
    if rank != source and rank not in receivers:
        return True
    everyone = len(receivers) == len(view.members) - 1

    def move(tensor: torch.Tensor) -> bool:
        if everyone:
            return group.broadcast(tensor, source, async_op=True, view=view).wait()
        if rank != source:
            return group.recv(tensor, source, async_op=True, view=view).wait()
        return all(group.send(tensor, r, async_op=True, view=view).wait() for r in receivers)

    sender = rank == source
    flats: list[torch.Tensor] = []
    header = torch.empty(0, dtype=torch.uint8)
    if sender:
        skeleton, tensors = split_tensors(holder.state_for_healing())
        layout = [(str(t.dtype).removeprefix("torch."), list(t.shape)) for t in tensors]
        dtypes = sorted({d for d, _ in layout})
        for dtype in dtypes:
            parts = [t.reshape(-1) for t, (d, _) in zip(tensors, layout, strict=True) if d == dtype]
            # the state travels as CPU tensors (gloo) whatever device it lives on
            flats.append(torch.cat(parts).cpu() if parts else torch.empty(0))
        buf = io.BytesIO()
        torch.save({"skeleton": skeleton, "layout": layout, "dtypes": dtypes}, buf)
        header = torch.frombuffer(bytearray(buf.getbuffer()), dtype=torch.uint8)
    size = torch.tensor([header.numel()], dtype=torch.int64)
    if not move(size):
        return False
    if not sender:
        header = torch.empty(int(size.item()), dtype=torch.uint8)
    if not move(header):
        return False
    if sender:
        return all(move(f) for f in flats)
    raw = ctypes.string_at(header.data_ptr(), header.numel())
    meta = torch.load(io.BytesIO(raw), weights_only=True)
    tensors: list[torch.Tensor | None] = [None] * len(meta["layout"])
    for dtype in meta["dtypes"]:
        mine = [(i, shape) for i, (d, shape) in enumerate(meta["layout"]) if d == dtype]
        numel = [math.prod(shape) for _, shape in mine]
        flat = torch.empty(sum(numel), dtype=getattr(torch, dtype))
        if not move(flat):
            return False
        for (i, shape), piece in zip(mine, flat.split(numel), strict=True):
            tensors[i] = piece.view(shape)
    holder.load_healed_state(join_tensors(meta["skeleton"], tensors))
    return True


__all__ = [
    "ElasticOptimizer",
    "ElasticStep",
    "StateHolder",
    "say_entered",
    "send_state",
    "sync_state",
]
