"""``ElasticProcessGroup``: the collectives, over whatever view is committed now.

Ranks in every call are GLOBAL ranks (``0..world_size-1``); the group maps them to the current
view's backend. One object serves the whole life of the process and follows the views that
``DataPlane.install_view`` brings.

- An active rank's operation runs on the current view's backend (waiting, the first time, for
  the backend to be built).
- An inactive rank's operation completes locally and succeeds: every tensor is left unchanged,
  so its training loop keeps running until a view activates it.
- On a failed view every operation fails at once with the view's hint, until the next view.
- ``all_gather`` and ``reduce_scatter`` take lists of ``world_size`` entries, one per global
  rank; the entries of ranks outside the view are neither sent nor written (left unchanged).
- A ``src``/``dst`` outside ``0..world_size-1`` (or this rank itself) is a ``ValueError``; one
  that is not active in the view fails that operation only, with the hint naming it.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceOptions,
    BarrierOptions,
    BroadcastOptions,
    ReduceScatterOptions,
)

from agent.dataplane.work import Work

if TYPE_CHECKING:
    from agent.dataplane.plane import DataPlane
    from agent.dataplane.view import ViewGroup

ReduceOp = dist.ReduceOp
_GLOO_UNSUPPORTED_OPS = (ReduceOp.AVG, ReduceOp.PREMUL_SUM)

Launch = Callable[[object, "ViewGroup"], object]


class ElasticProcessGroup:
    """The process group of one rank, following the committed views of its data plane."""

    def __init__(self, plane: DataPlane) -> None:
        self._plane = plane
        self.rank = plane.rank
        self.world_size = plane.world_size

    # -- the current view ---------------------------------------------------------------------

    @property
    def version(self) -> int:
        """The version of the installed view (0 before the first one)."""
        view = self._plane.current_view()
        return 0 if view is None else view.version

    @property
    def active_ranks(self) -> tuple[int, ...]:
        view = self._plane.current_view()
        return () if view is None else view.members

    # -- collectives --------------------------------------------------------------------------

    def all_reduce(
        self, tensor: torch.Tensor, op: dist.ReduceOp = ReduceOp.SUM, async_op: bool = False
    ) -> Work:
        self._check_tensor("tensor", tensor)
        opts = AllreduceOptions()
        opts.reduceOp = self._check_op(op)
        return self._run("all_reduce", lambda be, _v: be.allreduce([tensor], opts), async_op)

    def broadcast(self, tensor: torch.Tensor, src: int, async_op: bool = False) -> Work:
        self._check_tensor("tensor", tensor)
        self._check_rank("src", src, allow_self=True)

        def launch(be: object, view: ViewGroup) -> object:
            opts = BroadcastOptions()
            opts.rootRank = view.index(src)
            return be.broadcast([tensor], opts)  # type: ignore[attr-defined]

        return self._run("broadcast", launch, async_op, peer=src)

    def all_gather(
        self, output_tensors: Sequence[torch.Tensor], tensor: torch.Tensor, async_op: bool = False
    ) -> Work:
        self._check_tensor("tensor", tensor)
        self._check_list("output_tensors", output_tensors, like=tensor)
        opts = AllgatherOptions()

        def launch(be: object, view: ViewGroup) -> object:
            outputs = [output_tensors[m] for m in view.members]
            return be.allgather([outputs], [tensor], opts)  # type: ignore[attr-defined]

        return self._run("all_gather", launch, async_op)

    def reduce_scatter(
        self,
        output: torch.Tensor,
        input_list: Sequence[torch.Tensor],
        op: dist.ReduceOp = ReduceOp.SUM,
        async_op: bool = False,
    ) -> Work:
        self._check_tensor("output", output)
        self._check_list("input_list", input_list, like=output)
        opts = ReduceScatterOptions()
        opts.reduceOp = self._check_op(op)

        def launch(be: object, view: ViewGroup) -> object:
            inputs = [input_list[m] for m in view.members]
            return be.reduce_scatter([output], [inputs], opts)  # type: ignore[attr-defined]

        return self._run("reduce_scatter", launch, async_op)

    def barrier(self, async_op: bool = False) -> Work:
        return self._run("barrier", lambda be, _v: be.barrier(BarrierOptions()), async_op)

    def send(self, tensor: torch.Tensor, dst: int, async_op: bool = False) -> Work:
        self._check_tensor("tensor", tensor)
        self._check_rank("dst", dst, allow_self=False)
        launch: Launch = lambda be, view: be.send([tensor], view.index(dst), 0)  # noqa: E731
        return self._run("send", launch, async_op, peer=dst, p2p=True)

    def recv(self, tensor: torch.Tensor, src: int, async_op: bool = False) -> Work:
        self._check_tensor("tensor", tensor)
        self._check_rank("src", src, allow_self=False)
        launch: Launch = lambda be, view: be.recv([tensor], view.index(src), 0)  # noqa: E731
        return self._run("recv", launch, async_op, peer=src, p2p=True)

    # -- hints and knobs ----------------------------------------------------------------------

    def get_failed_ranks_hint(self, work: Work) -> torch.Tensor:
        """``work``'s hint: int32, shape ``(world_size,)``, 1 = failed in THIS operation.

        Waits for the operation, and on failure for the liveness decision (about
        ``liveness_window_periods * liveness_period_s``). The tensor is ``work``'s own buffer:
        valid while ``work`` is alive; ``clone()`` it to keep it longer.
        """
        if not isinstance(work, Work):
            raise TypeError(f"expected a Work from this group, got {type(work).__name__}")
        return work.failed_ranks_hint()

    def set_collective_timeout_us(self, us: int) -> None:
        """Deadline of later collectives, counted from issue (and the backends' own timeout)."""
        self._plane.set_timeouts(collective_s=_positive_us("collective timeout", us) / 1e6)

    def set_p2p_timeout_us(self, us: int) -> None:
        """Deadline of later send/recv operations, counted from issue."""
        self._plane.set_timeouts(p2p_s=_positive_us("p2p timeout", us) / 1e6)

    def extend_group_size_to(self, n: int) -> None:
        """Deprecated, and has no effect: the committed views decide the group."""
        warnings.warn(
            f"extend_group_size_to({n}) is deprecated and has no effect: membership follows the "
            "committed views (activate ranks through the coordinator instead)",
            DeprecationWarning,
            stacklevel=2,
        )

    # -- the one path every operation takes ---------------------------------------------------

    def _run(
        self,
        name: str,
        launch: Launch,
        async_op: bool,
        *,
        peer: int | None = None,
        p2p: bool = False,
    ) -> Work:
        plane = self._plane
        timeout_s = plane.p2p_timeout_s if p2p else plane.collective_timeout_s
        deadline = time.monotonic() + timeout_s
        while True:
            view = plane.view_for_op(name)
            runnable = view.active and (peer is None or peer in view.members)
            backend = view.backend(deadline) if runnable else None
            if backend is None and runnable and view.failure is None:
                continue  # superseded while we waited for its backend: run on the newer view
            break
        work = Work(
            f"{name} (rank {self.rank}, view {view.version})",
            view,
            plane.hint_pool,
            plane.closed,
            timeout_s,
        )
        if not view.active:
            return work._complete_locally(True)
        if peer is not None and peer not in view.members:
            return work._complete_locally(False, (peer,))
        inline = not async_op and plane.kind.name == "gloo"
        if backend is None or not (inline or view.register(work)):
            return work._fail_with_view()
        view.op_started()
        try:
            backend_work = launch(backend, view)
        except RuntimeError as e:  # e.g. gloo's send to a peer whose connection is gone
            view.op_ended()
            view.unregister(work)
            view.fail(f"{work.name} failed to start: {e}")
            return work._fail_with_view()
        if inline:
            work._wait_inline(backend_work)
        else:
            work._started(backend_work)
            if not async_op:
                work.wait()
        return work

    # -- argument checks (local misuse raises) ------------------------------------------------

    def _check_tensor(self, what: str, tensor: object) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{what} must be a torch.Tensor, got {type(tensor).__name__}")
        device = self._plane.device
        if tensor.device.type != device.type or (
            device.index is not None and tensor.device != device
        ):
            raise ValueError(f"{what} is on {tensor.device}, but this data plane runs on {device}")
        if tensor.is_sparse or not tensor.is_contiguous():
            raise ValueError(f"{what} must be a dense, contiguous tensor")

    def _check_list(
        self, what: str, tensors: Sequence[torch.Tensor], *, like: torch.Tensor
    ) -> None:
        if not isinstance(tensors, Sequence) or len(tensors) != self.world_size:
            got = len(tensors) if isinstance(tensors, Sequence) else type(tensors).__name__
            raise ValueError(
                f"{what} must have world_size={self.world_size} entries (one per rank), got {got}"
            )
        for i, t in enumerate(tensors):
            self._check_tensor(f"{what}[{i}]", t)
            if t.shape != like.shape or t.dtype != like.dtype:
                raise ValueError(
                    f"{what}[{i}] has shape {tuple(t.shape)} and dtype {t.dtype}; "
                    f"expected {tuple(like.shape)} and {like.dtype}"
                )

    def _check_rank(self, what: str, rank: int, *, allow_self: bool) -> None:
        if not isinstance(rank, int) or isinstance(rank, bool):
            raise TypeError(f"{what} must be an int rank, got {type(rank).__name__}")
        if not 0 <= rank < self.world_size:
            raise ValueError(f"{what}={rank} is out of range 0..{self.world_size - 1}")
        if not allow_self and rank == self.rank:
            raise ValueError(f"{what}={rank} is this rank itself")

    def _check_op(self, op: dist.ReduceOp) -> dist.ReduceOp:
        if op in _GLOO_UNSUPPORTED_OPS and self._plane.kind.name == "gloo":
            raise ValueError(f"gloo does not support {op}")
        return op


def _positive_us(what: str, us: int) -> int:
    if not isinstance(us, int) or isinstance(us, bool) or us <= 0:
        raise ValueError(f"{what} must be a positive number of microseconds, got {us!r}")
    return us
