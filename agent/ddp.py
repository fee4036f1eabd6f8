"""Elastic data parallelism on the foldplane group: DDP that survives failures and heals joiners.

>>> from foldplane.agent.ddp import DistributedDataParallel, ElasticOptimizer
>>> model = DistributedDataParallel(model)                 # the foldplane default group
>>> opt = ElasticOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1))
>>> for x, y in data:
...     opt.zero_grad()
...     loss_fn(model(x), y).backward()
...     opt.step()                                        # True: committed on every member

The rules (see ``docs/ddp.md``):

- **A step runs on one view.** The first ``forward`` of a step (or ``begin_step()``) pins the
  installed view; every bucket of that step is all-reduced on it. A rank that finds a newer view
  installed leaves the old one (poisoning it, so members still on it fail fast) and enters the
  new one at its next step. A step whose view was superseded while it ran is skipped on every
  member (its remaining buckets are not all-reduced): the members enter the new view with the
  last committed state, the one a joiner pulled meanwhile.
- **Gradients are the mean over the view's members**: each bucket is summed over the members
  and divided by their number (DDP is built on a local group of one, with a comm hook, so
  torch's own division by the world size never happens).
- **Every member commits or skips the same steps.** After the backward pass each member votes
  in the coordinator's store: the last of the view's members to vote "ok" writes ``commit``;
  a member whose collectives failed, or that sees the view fail or a member leave while it
  waits, writes ``skip`` instead. The first write wins (``compare_set``) and everybody adopts
  it, so the members' parameters stay bit-identical after every step.
- **An inactive rank does not step**: it waits (``inactive_wait_s`` at a time) for a view that
  activates it; meanwhile its steps run locally and are never committed.
- **Healing** (``agent.heal``). Every member serves the state of its last committed step
  (the model's and every attached optimizer's) from a thread of its own, copy-on-write against
  its optimizer steps. Entering a view, a rank that never committed pulls it from every member
  that holds it, at once, straight into its own tensors, while they finish their step; the
  members' all-gather of committed steps then finds it level, or it pulls again from the
  members with the most steps (before the first step, from the lowest rank) while they wait in
  their first all-reduce.
- Nothing here raises for a peer's failure: ``should_commit()`` / ``ElasticOptimizer.step()``
  return False and ``last_failed_ranks`` says whom the failed step's hints named.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, Protocol, cast

import torch
import torch.distributed as dist
from torch.distributed import DistStoreError
from torch.nn.parallel import DistributedDataParallel as _TorchDDP

from .dataplane.group import ElasticProcessGroup
from .dataplane.plane import DataPlane
from .dataplane.view import ViewGroup
from .dataplane.work import Work
from .heal import (
    SLOT,
    HealError,
    HealServer,
    PullReport,
    Snapshot,
    Source,
    SourceSession,
    StateGate,
    join_tensors,
    nbytes,
    pin_sources,
    pull_state,
    split_tensors,
)

log = logging.getLogger("foldplane.ddp")

#: How often a member waiting for the step's decision looks at its view's health (locally:
#: the wait itself is one store wait that the decision, or the watch's ``skip``, ends).
DECISION_SLICE_S = 0.02
#: How long past the collective timeout a decision wait may last before it gives up on the
#: watch (whose ``skip`` at the deadline normally ends it first).
DECISION_GRACE_S = 5.0
COMMIT, SKIP = b"commit", b"skip"


def _local_group() -> dist.ProcessGroup:
    """A process group of one (this process), for the DDP machinery that needs a group."""
    from torch.distributed import ProcessGroupGloo

    store = dist.HashStore()
    opts = ProcessGroupGloo._Options()
    opts._devices = [ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    backend = ProcessGroupGloo(store, 0, 1, opts)
    group = dist.ProcessGroup(store, 0, 1)
    group._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, backend)
    return group


class DistributedDataParallel(_TorchDDP):
    """``torch.nn.parallel.DistributedDataParallel`` over the foldplane group's current view.

    ``process_group`` is an ``ElasticProcessGroup`` (default: the default group, which
    ``dist.init_process_group("foldplane")`` or ``agent.process_group()`` set). Other keyword
    arguments go to torch's DDP (``bucket_cap_mb``, ``gradient_as_bucket_view``, ...).
    ``name`` keeps the store keys of two wrapped models of one group apart.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        process_group: ElasticProcessGroup | None = None,
        *,
        name: str = "ddp",
        inactive_wait_s: float = 1.0,
        view_wait_s: float | None = None,
        **ddp_kwargs: Any,
    ) -> None:
        group = process_group if process_group is not None else dist.group.WORLD
        if not isinstance(group, ElasticProcessGroup):
            raise TypeError(
                "agent.ddp.DistributedDataParallel runs on the foldplane group: pass "
                "process_group=agent.process_group(), or call "
                f'dist.init_process_group("foldplane") first (got {type(group).__name__})'
            )
        for bad in ("device_ids", "output_device", "process_group", "static_graph"):
            if ddp_kwargs.get(bad):
                raise ValueError(f"{bad} is not supported by the elastic DDP")
        super().__init__(module, process_group=_local_group(), **ddp_kwargs)
        self.elastic_group = group
        self.ddp_name = name
        self.inactive_wait_s = inactive_wait_s
        self.view_wait_s = view_wait_s
        #: Steps this rank has committed (the same on every member of a view after it entered).
        self.committed_steps = 0
        self._optimizers: list[torch.optim.Optimizer] = []
        self._view: ViewGroup | None = None  # the view this rank entered (synced state on)
        self._entered: tuple[int, ...] | None = None  # the members of the last view entered
        self._index = 0  # the next step's number within ``_view``
        self._step_view: ViewGroup | None = None  # the view of the step in progress
        self._in_step = False
        self._step_ok = True
        self._works: list[Work] = []
        self._failed_works: list[Work] = []
        self._agreement = StepAgreement(self._plane, f"ddp/{name}")
        #: The last heal of this rank's state (None: never healed).
        self.last_heal: PullReport | None = None
        params = {name for name, _ in self.module.named_parameters()}
        self._buffer_keys = {k for k in self.module.state_dict() if k not in params}
        self._buffer_copies: dict[str, torch.Tensor] = {}
        self._gate = StateGate()
        self._gate.begin_mutation()
        self._end_mutation()  # the buffers' first copy
        plane = self._plane
        self._heal_server = HealServer(
            self._gate, self._snapshot, plane.gloo_hostname, name=f"{name}-{plane.rank}"
        )
        self._heal_server.pin_timeout_s = plane.p2p_timeout_s
        self.register_comm_hook(self, _comm_hook)

    @property
    def _plane(self) -> DataPlane:
        """The group's data plane: the ``DataPlane`` that owns it (the group itself needs only
        its ``GroupPlane`` part)."""
        return cast(DataPlane, self.elastic_group.plane)

    # -- the user's surface ---------------------------------------------------------------------

    def attach_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Heal ``optimizer``'s state together with the model's (``ElasticOptimizer`` calls it)."""
        if optimizer not in self._optimizers:
            self._optimizers.append(optimizer)

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        if not self._in_step:
            self.begin_step()
        return super().forward(*inputs, **kwargs)

    def _pre_forward(self, *inputs: Any, **kwargs: Any) -> Any:
        # torch rebuilds the buckets once, after a process's first step, in the order its
        # gradients arrived: a joiner's first step would then be laid out differently from the
        # members' (the bucket all-reduce goes element by element). Keep the buckets torch built
        # at construction, the same in every process of the same model.
        reducer = self.reducer
        self.reducer = _KeepBuckets(reducer)
        try:
            return super()._pre_forward(*inputs, **kwargs)
        finally:
            self.reducer = reducer

    def begin_step(self) -> None:
        """Pin the view of the next step: move to a newer view (healing joiners) if there is one.

        Called by the first ``forward`` of a step. An inactive rank waits up to
        ``inactive_wait_s`` to be activated; after a failed view, up to ``view_wait_s`` (the
        collective timeout by default) for the next one.
        """
        if self._in_step:
            return
        self._end_mutation()  # the caller's optimizer step (if any) is over
        plane = self._plane
        while True:
            current = plane.view_for_op("begin_step")
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
                if newer is current:
                    break  # no next view yet: this step runs on the failed one and is skipped
                continue
            if not current.active:
                rank = plane.rank
                activated = plane.wait_for_view(
                    lambda v, r=rank: r in v.members, self.inactive_wait_s
                )
                if activated is None or not activated.active:
                    self._start(None)  # still inactive: a local step, never committed
                    return
                continue
            if self._enter(current):
                break
        self._start(self._view if self._view is not None else current)

    def should_commit(self) -> bool:
        """End the step: True if every member of its view succeeded (then the caller steps).

        All members of the view get the same answer. Idempotent per step: a second call
        without a new step returns False.
        """
        if not self._in_step:
            return False
        self._in_step = False
        view = self._step_view
        if view is None:
            return False  # inactive: never steps
        ok = self._step_ok and all(w.wait() for w in self._works)
        newer = self._plane.current_view()
        if newer is not None and newer.version > view.version:
            ok = False  # superseded: members enter the newer view with the last committed state
        works, self._works = self._works, []
        index = self._index
        self._index += 1
        committed = self._agree(view, index, ok)
        if committed:
            self._gate.begin_mutation()  # the caller steps the optimizer now
            self.committed_steps += 1
            self._failed_works = []
        else:
            self._failed_works = [w for w in works if not w.wait()]
            failed = self.last_failed_ranks
            if failed:
                why = f"failed ranks {failed}"
            elif newer is not None and newer.version > view.version:
                why = f"view {newer.version} committed during it"
            else:
                why = "another member's operation failed"
            # Numbered as ``committed_steps`` counts (the step after the last committed one),
            # the one numbering a script and its heal see; ``index`` is the agreement's key.
            log.warning(
                "rank %d: step %d of view %d skipped on every member (%s); "
                "its batch goes again in the next step",
                self._plane.rank,
                self.committed_steps + 1,
                view.version,
                why,
            )
        return committed

    @property
    def last_failed_ranks(self) -> list[int]:
        """The ranks the failed operations of the last skipped step blamed (their hints)."""
        failed: set[int] = set()
        for work in self._failed_works:
            hint = self.elastic_group.get_failed_ranks_hint(work)
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

    def _start(self, view: ViewGroup | None) -> None:
        self._step_view = view
        self._in_step = True
        self._step_ok = view is not None
        self._works = []

    def _hook(self, bucket: dist.GradBucket) -> torch.futures.Future:
        buffer = bucket.buffer()
        view = self._step_view
        newer = self._plane.current_view()
        if view is not None and newer is not None and newer.version > view.version:
            # Superseded: the step will be skipped (``should_commit``), so its remaining
            # all-reduces are not worth waiting for; leaving fails them fast on every member.
            self._step_ok = False
            view.leave(f"rank {self._plane.rank} moved on to view {newer.version}")
        if view is None or not self._step_ok:  # inactive, or the step failed already
            future: torch.futures.Future = torch.futures.Future()
            future.set_result(buffer)
            return future
        work = self.elastic_group.all_reduce(buffer, async_op=True, view=view)
        self._works.append(work)
        members = len(view.members)

        def mean(_fut: torch.futures.Future) -> torch.Tensor:
            if work.wait():
                buffer.div_(members)
            else:
                self._step_ok = False
            return buffer

        return work.get_future().then(mean)

    def _agree(self, view: ViewGroup, index: int, ok: bool) -> bool:
        """Every member's vote on step ``index`` of ``view``; the first decision written wins."""
        return self._agreement.agree(view, index, ok)

    # -- entering a view: agree on the state ---------------------------------------------------

    def _enter(self, view: ViewGroup) -> bool:
        """Sync the state over ``view`` (heal members behind); False if the view failed.

        A rank that has never committed a step first pulls the members' last committed state
        from their threads (``_prefetch``), while they finish the step they are in; the
        all-gather of committed steps then usually finds it level with them. A rank still behind
        pulls the state of the members with the most steps (the lowest rank alone before the
        first step: ranks may have initialised differently); the members go on into their step
        meanwhile, their threads serve it.
        """
        group = self.elastic_group
        self._publish_server()
        if self.committed_steps == 0 and len(view.members) > 1:
            self._prefetch(view)
        counts = [torch.zeros(1, dtype=torch.int64) for _ in range(group.world_size)]
        mine = torch.tensor([self.committed_steps], dtype=torch.int64)
        if not group.all_gather(counts, mine, async_op=True, view=view).wait():
            return False
        steps = {m: int(counts[m].item()) for m in view.members}
        top = max(steps.values())
        rank = group.plane.rank
        if top == 0 or len(set(steps.values())) > 1:
            sources = (
                [min(view.members)] if top == 0 else sorted(m for m, s in steps.items() if s == top)
            )
            if rank not in sources:
                try:
                    self._heal_from(view, sources, top)
                except RuntimeError as e:  # a HealError, or the store is unreachable
                    reason = f"rank {rank} could not heal from ranks {sources} (step {top}): {e}"
                    log.error("%s", reason)
                    view.fail(reason, report=False)
                    return False
            self.committed_steps = top
            log.info(
                "rank %d: view %d: state of rank(s) %s (%d steps) on every member",
                rank,
                view.version,
                sources,
                top,
            )
        self._view, self._index = view, 0
        say_entered(rank, view, self._entered, self.committed_steps)
        self._entered = view.members
        return True

    def state_for_healing(self) -> dict[str, Any]:
        """The state a heal carries: the model's and every attached optimizer's state dict."""
        return {
            "model": self.module.state_dict(),
            "optimizers": [o.state_dict() for o in self._optimizers],
        }

    def _snapshot(self, steps: int) -> Snapshot:
        """The state as of the last committed step (called by a serving thread, between
        mutations): live parameters and optimizer state, buffers from their last copy."""
        state = self.state_for_healing()
        model = dict(state["model"])
        for key, copy in self._buffer_copies.items():
            model[key] = copy
        state["model"] = model
        skeleton, tensors = split_tensors(state)
        return Snapshot(steps, skeleton, tensors)

    def _end_mutation(self) -> None:
        """The state is the last committed step's again: copy the buffers (a forward changes
        them in place), let the serving threads pin it."""
        if not self._gate.mutating:
            return
        if self._buffer_keys:
            self._buffer_copies = {
                key: b.detach().clone() for key, b in self.module.state_dict().items()
                if key in self._buffer_keys
            }  # fmt: skip
        self._gate.end_mutation(self.committed_steps)

    def _publish_server(self) -> None:
        host, port = self._heal_server.address
        try:
            self._agreement.store().set(self._server_key(self._plane.rank), f"{host}:{port}")
        except RuntimeError as e:  # the store is down: no heal from us until the next view
            log.warning("rank %d: cannot publish the heal server: %s", self._plane.rank, e)
            self._agreement.reset()

    def _server_key(self, rank: int) -> str:
        return f"ddp/{self.ddp_name}/heal/{rank}"

    def _sources(self, ranks: list[int]) -> list[Source]:
        """The heal servers of ``ranks`` that have published one."""
        store = self._agreement.store()
        out = []
        for rank in ranks:
            key = self._server_key(rank)
            if store.check([key]):
                host, port = store.get(key).decode().rsplit(":", 1)
                out.append(Source(rank, host, int(port)))
        return out

    def _prefetch(self, view: ViewGroup) -> None:
        """Pull the state of the other members' last committed step, if any has stepped (best
        effort: the all-gather that follows says whether it is the one they enter with)."""
        rank = self._plane.rank
        try:
            sources = self._sources([m for m in view.members if m != rank])
        except RuntimeError as e:
            log.info("rank %d: no prefetch of the state: %s", rank, e)
            return
        sessions = pin_sources(sources, self._plane.p2p_timeout_s)
        top = max((s.steps for s in sessions), default=0)
        chosen = [s for s in sessions if s.steps == top and top > 0]
        for s in sessions:
            if s not in chosen:
                s.close()
        if not chosen:
            return
        try:
            self._load_from(chosen)
        except RuntimeError as e:  # the all-gather that follows finds this rank behind
            log.warning("rank %d: prefetch of step %d failed: %s", rank, top, e)

    def _heal_from(self, view: ViewGroup, ranks: list[int], steps: int) -> None:
        """Pull the state of step ``steps`` from ``ranks`` (who hold it, all of them at once)."""
        sessions = pin_sources(self._sources(ranks), self._plane.p2p_timeout_s)
        chosen = [s for s in sessions if s.steps == steps]
        for s in sessions:
            if s not in chosen:
                s.close()
        if not chosen:
            raise HealError(
                f"none of ranks {ranks} serves step {steps} (they serve "
                f"{sorted((s.source.rank, s.steps) for s in sessions)})"
            )
        self._load_from(chosen)

    def _load_from(self, sessions: list[SourceSession]) -> None:
        """Receive the sessions' state straight into this rank's tensors, then install it."""
        first = sessions[0]
        layout = first.layout
        if any(s.layout != layout for s in sessions[1:]):
            raise HealError(f"ranks {[s.source.rank for s in sessions]} serve different layouts")
        targets = self._targets(first.skeleton, layout)
        self._gate.begin_mutation()
        try:
            seconds, failed = pull_state(sessions, targets)
            self._install(first.skeleton, targets)
            self.committed_steps = first.steps
        finally:
            for s in sessions:
                s.close()
            self._end_mutation()
        self.last_heal = PullReport(
            first.steps,
            tuple(s.source.rank for s in sessions),
            sum(nbytes(d, shape) for d, shape in layout),
            seconds,
            failed,
            time.time(),
        )
        log.info("rank %d: healed: %s", self._plane.rank, self.last_heal)

    def _targets(self, skeleton: Any, layout: list[tuple[str, list[int]]]) -> list[torch.Tensor]:
        """Where each served tensor lands: this rank's own tensor of that name, dtype and shape
        (a parameter, a buffer, an optimizer state's tensor), or a new one."""
        if len(skeleton["optimizers"]) != len(self._optimizers):
            raise HealError(
                f"the serving member has {len(skeleton['optimizers'])} optimizer(s) attached, "
                f"this rank {len(self._optimizers)}"
            )
        own: dict[int, torch.Tensor] = {}
        mine = self.state_for_healing()

        def match(theirs: Any, ours: Any) -> None:
            if isinstance(theirs, tuple) and len(theirs) == 2 and theirs[0] == SLOT:
                dtype, shape = layout[theirs[1]]
                if (
                    isinstance(ours, torch.Tensor)
                    and str(ours.dtype).removeprefix("torch.") == dtype
                    and list(ours.shape) == shape
                    and ours.device.type == "cpu"
                    and ours.is_contiguous()
                ):
                    own[theirs[1]] = ours.detach()
            elif isinstance(theirs, dict) and isinstance(ours, dict):
                for key, value in theirs.items():
                    if key in ours:
                        match(value, ours[key])

        match(skeleton["model"], mine["model"])
        for theirs, ours in zip(skeleton["optimizers"], mine["optimizers"], strict=True):
            match(theirs.get("state", {}), ours.get("state", {}))
        return [
            own[i] if i in own else torch.empty(shape, dtype=getattr(torch, dtype))
            for i, (dtype, shape) in enumerate(layout)
        ]

    def _install(self, skeleton: Any, tensors: list[torch.Tensor]) -> None:
        """Make the received tensors this rank's state (those received in place need nothing)."""
        state = join_tensors(skeleton, tensors)
        own = self.module.state_dict()
        if any(
            own.get(k) is None or own[k].data_ptr() != v.data_ptr()
            for k, v in state["model"].items()
        ):
            self.module.load_state_dict(state["model"])
        for optimizer, saved in zip(self._optimizers, state["optimizers"], strict=True):
            optimizer.load_state_dict(saved)  # keeps the received tensors (no copy)


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


class StepAgreement:
    """Every member's vote on each step of a view, in the coordinator's store.

    ``agree(view, index, ok)``: the last of the view's members to vote "ok" on step ``index``
    writes ``commit``; a member that votes not ok, or that sees the view fail or lose a member
    (or the collective timeout pass) while it waits, writes ``skip``. The first write wins
    (``compare_set``) and every member adopts it. ``prefix`` keeps the keys of two users of one
    group apart. Three store round trips per step.
    """

    def __init__(self, plane: DataPlane, prefix: str) -> None:
        self._plane = plane
        self._prefix = prefix
        self._store: Any = None
        self._store_address: tuple[str, int] | None = None
        self._watch: DecisionWatch | None = None

    def agree(self, view: ViewGroup, index: int, ok: bool) -> bool:
        """True if step ``index`` of ``view`` is committed on every member (False: skipped)."""
        store = self.store()
        base = f"{self._prefix}/{view.version}/{index}"
        decision = f"{base}/decision"
        try:
            if not ok:
                return store.compare_set(decision, "", SKIP) == COMMIT
            if store.add(f"{base}/ok", 1) == len(view.members):
                answer = store.compare_set(decision, "", COMMIT)
                if answer == COMMIT and index > 0:  # every member is past step index - 1
                    done = f"{self._prefix}/{view.version}/{index - 1}"
                    self._janitor.forget(f"{done}/ok", f"{done}/decision")
                return answer == COMMIT
            return self._await_decision(store, view, decision)
        except RuntimeError as e:  # the store is unreachable: the step cannot be agreed
            rank = self._plane.rank
            log.error(
                "rank %d: cannot agree on step %d of view %d: %s", rank, index, view.version, e
            )
            self._store = None
            return False

    def _await_decision(self, store: Any, view: ViewGroup, decision: str) -> bool:
        """Wait for ``decision`` in one store wait: the last "ok" vote ends it with ``commit``,
        the watch (:class:`DecisionWatch`) with ``skip`` once the view fails, a member leaves
        or the deadline passes. A wait that ends by its own timeout makes torch's store client
        log a warning; this one times out only if the watch could not write (the store is
        gone), so a worker's recovery stays quiet."""
        plane = self._plane
        deadline = time.monotonic() + plane.collective_timeout_s
        limit = timedelta(seconds=plane.collective_timeout_s + DECISION_GRACE_S)
        assert self._watch is not None  # made with the store
        # A timeout: nobody wrote it, not even the watch (the store is gone): skipped.
        with self._watch.watching(view, decision, deadline), contextlib.suppress(DistStoreError):
            store.wait([decision], limit)
        # Present now: compare_set answers its value in one round trip (get takes two).
        return store.compare_set(decision, "", SKIP) == COMMIT

    def reset(self) -> None:
        """Forget the store client (it failed): the next use connects again."""
        self._store = None

    def store(self) -> Any:
        """A store client of our own (a wait here must not hold up the heartbeat's client);
        the elastic DDP also publishes its heal servers through it."""
        plane = self._plane
        address = plane.store_address
        if self._store is None or self._store_address != address:
            self._store = plane.connect_store(*address)
            self._store_address = address
            self._janitor = Janitor(plane.connect_store(*address))
            if self._watch is not None:
                self._watch.close()
            self._watch = DecisionWatch(plane, plane.connect_store(*address))
        return self._store


class DecisionWatch:
    """Ends a member's wait for a step's decision when no vote will: writes ``skip`` (first
    write wins, as any member's) once the view fails, one of its members is left out of the
    installed view, or the deadline passes.

    It looks locally every ``DECISION_SLICE_S`` while a wait is in progress (no store round
    trip), from a thread of its own with a store client of its own: the waiting thread is
    blocked in the store's wait on the other client.
    """

    def __init__(self, plane: DataPlane, store: Any) -> None:
        self._plane = plane
        self._store = store
        self._cond = threading.Condition()
        self._watched: tuple[ViewGroup, str, float] | None = None
        self._closed = False
        threading.Thread(target=self._run, name="foldplane-decision-watch", daemon=True).start()

    def close(self) -> None:
        """Stop the thread (the agreement moved to another store)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @contextlib.contextmanager
    def watching(self, view: ViewGroup, decision: str, deadline: float) -> Iterator[None]:
        with self._cond:
            self._watched = (view, decision, deadline)
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._watched = None

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._watched is not None or self._closed)
                if self._closed:
                    return
                watched = self._watched
                assert watched is not None
                view, decision, deadline = watched
                while self._watched is watched and not self._ends(view, deadline):
                    self._cond.wait(DECISION_SLICE_S)
                if self._watched is not watched:
                    continue  # decided meanwhile
            try:
                self._store.compare_set(decision, "", SKIP)
            except RuntimeError as e:  # the waiter's own wait times out instead
                log.info("rank %d: cannot end the wait for %s: %s", self._plane.rank, decision, e)
            with self._cond:  # the same wait is not ended twice
                self._cond.wait_for(lambda w=watched: self._watched is not w or self._closed)

    def _ends(self, view: ViewGroup, deadline: float) -> bool:
        """No vote will end the wait: the view failed, lost a member, or its time is up."""
        current = self._plane.current_view()
        gone = current is not None and not set(view.members) <= set(current.members)
        return view.failure is not None or gone or time.monotonic() > deadline


class Janitor:
    """Deletes the keys of decided steps on a thread of its own (off the step's critical path),
    with a store client of its own."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self._queue: queue.SimpleQueue[tuple[str, ...]] = queue.SimpleQueue()
        self._unfinished = 0  # ``forget`` calls whose keys are not deleted yet
        self._idle = threading.Condition()
        threading.Thread(target=self._run, name="foldplane-janitor", daemon=True).start()

    def forget(self, *keys: str) -> None:
        with self._idle:
            self._unfinished += 1
        self._queue.put(keys)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until every key given so far is deleted; False on timeout (or a failed delete)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._unfinished == 0, timeout)

    def _run(self) -> None:
        while True:
            keys = self._queue.get()
            try:
                for key in keys:
                    self._store.delete_key(key)
            except RuntimeError as e:  # the store moved or is down: the keys are only clutter
                log.info("cannot delete %s: %s", ", ".join(keys), e)
                return
            with self._idle:
                self._unfinished -= 1
                self._idle.notify_all()


class _KeepBuckets:
    """The reducer, as ``_pre_forward`` sees it: everything but the bucket rebuild."""

    def __init__(self, reducer: Any) -> None:
        self._reducer = reducer

    def _rebuild_buckets(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reducer, name)


def _comm_hook(model, bucket):  # annotated below: DDP checks real classes, not strings
    return model._hook(bucket)


_comm_hook.__annotations__ = {
    "model": DistributedDataParallel,
    "bucket": dist.GradBucket,
    "return": torch.futures.Future[torch.Tensor],
}


class ElasticOptimizer:
    """An optimizer whose ``step()`` runs only when every member of the step's view agreed.

    ``step()`` returns True if it stepped. ``zero_grad``, ``param_groups``, ``state``,
    ``state_dict`` ... are the wrapped optimizer's. Its state heals together with the model's.
    """

    def __init__(self, model: DistributedDataParallel, optimizer: torch.optim.Optimizer) -> None:
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


__all__ = ["DistributedDataParallel", "ElasticOptimizer"]
