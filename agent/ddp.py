"""Elastic data parallelism on the foldplane group: DDP that survives failures and heals joiners.

>>> from foldplane.agent.ddp import DistributedDataParallel, ElasticOptimizer
>>> model = DistributedDataParallel(model)                 # the foldplane default group
>>> opt = ElasticOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1))
>>> for x, y in data:
...     opt.zero_grad()
...     loss_fn(model(x), y).backward()
...     opt.step()                                        # True: committed on every member

The rules (see ``docs/ddp.md``; the step's are ``agent.elastic.ElasticStep``'s, shared with
``agent.fsdp``):

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

import logging
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as _TorchDDP

# The agreement, the state's sync and the optimizer are the elastic step's, shared with
# ``agent.fsdp``; they are named here too, where they were first documented.
from .agreement import StepAgreement as StepAgreement
from .dataplane.group import ElasticProcessGroup
from .dataplane.view import ViewGroup
from .dataplane.work import Work
from .elastic import ElasticOptimizer, ElasticStep
from .elastic import send_state as send_state
from .elastic import sync_state as sync_state
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


class DistributedDataParallel(ElasticStep, _TorchDDP):
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
        self._init_step(group, f"ddp/{name}", inactive_wait_s, view_wait_s)
        self._step_ok = True
        self._works: list[Work] = []
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

    # -- the user's surface (and ``agent.elastic.ElasticStep``'s) ----------------------------------

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
        self._begin(self._plane.view_for_op("begin_step"))

    # -- one step: ``ElasticStep``'s parts ---------------------------------------------------------

    def _pin(self, view: ViewGroup | None) -> None:
        self._step_ok = view is not None
        self._works = []

    def _collectives_outcome(self, view: ViewGroup | None) -> tuple[bool, list[Work]]:
        ok = self._step_ok and all(w.wait() for w in self._works)
        newer = self._plane.current_view()
        if view is not None and newer is not None and newer.version > view.version:
            ok = False  # superseded: members enter the newer view with the last committed state
        works, self._works = self._works, []
        return ok, works

    def _committing(self) -> None:
        self._gate.begin_mutation()  # the caller steps the optimizer now

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

    # -- entering a view: agree on the state ---------------------------------------------------

    def _heal_into(self, view: ViewGroup) -> bool:
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


__all__ = ["DistributedDataParallel", "ElasticOptimizer"]
