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

The group **is** a ``torch.distributed.ProcessGroup`` (``rank()``, ``size()`` = world size) and
its operations return :class:`Work`, a ``dist.Work``: ``dist.all_reduce(t, group=pg)`` and the
other ``dist.*`` collectives reach the c10d-style overrides below (``allreduce(tensors, opts)``,
...), and so do C++ callers such as DDP's reducer. Two methods serve both styles
(``broadcast``, ``reduce_scatter``, ``barrier``, ``send``, ``recv``): a list of tensors or an
options object as first argument is the c10d call, a tensor is the elastic one. A c10d call that
is synchronous (``opts.asyncOp`` False, or ``dist.send``/``dist.recv``) raises
:class:`PeerFailure` naming the failed ranks when a peer failed; an asynchronous one returns the
``Work`` as always (``wait()`` False, the hint). Nothing is ever raised into C++ for a peer's
failure, and no ``Work`` future ever completes with an exception.
"""

from __future__ import annotations

import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    GatherOptions,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
)

from .backend import BackendKind
from .cuda import CudaWatch, EndEvents
from .errors import DataPlaneError, PeerFailure
from .hint import HintPool
from .reconfigure import Reconfigurable, ReconfigurePlane, Request
from .work import CoalescedWork, Work

if TYPE_CHECKING:
    from .view import ViewGroup

ReduceOp = dist.ReduceOp
_GLOO_UNSUPPORTED_OPS = (ReduceOp.AVG, ReduceOp.PREMUL_SUM)

Launch = Callable[[object, "ViewGroup"], object]


BACKEND_NAME = "foldplane"


class GroupPlane(Protocol):
    """What the group needs from the data plane that owns it (``agent.dataplane.plane.DataPlane``,
    which constructs the group): this rank, the views, the timeouts, the hint buffers."""

    rank: int
    world_size: int
    device: torch.device
    kind: BackendKind
    hint_pool: HintPool
    closed: threading.Event
    collective_timeout_s: float
    p2p_timeout_s: float

    cuda_watch: CudaWatch
    end_events: EndEvents | None

    def hint_pool_for(self, device_type: str) -> HintPool: ...

    def current_view(self) -> ViewGroup | None: ...

    def view_for_op(self, op: str) -> ViewGroup: ...

    def set_timeouts(
        self, *, collective_s: float | None = None, p2p_s: float | None = None
    ) -> None: ...

    def build_subgroup(
        self, name: str, group_rank: int, group_size: int, timeout_s: float
    ) -> object: ...


class ElasticProcessGroup(Reconfigurable, dist.ProcessGroup):
    """The process group of one rank, following the committed views of its data plane.

    It answers torch's reconfigure API (``agent.dataplane.reconfigure``) in foldplane's model:
    a reconfigure makes its members the active ranks of a new view; ranks stay global."""

    def __init__(self, plane: GroupPlane) -> None:
        super().__init__(plane.rank, plane.world_size)
        self._plane = plane
        self._rank = plane.rank
        self.world_size = plane.world_size
        self._group_name = ""
        #: The ``Agent`` whose data plane this is (None for a data plane used on its own).
        self.agent: object | None = None
        self._capture_view: ViewGroup | None = None  # the view of the capture under way
        #: per thread: the operations issued since ``start_coalescing`` (None: no region open)
        self._coalescing = threading.local()
        self._graph_views: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    # -- what c10d asks of every process group ------------------------------------------------

    def getRank(self) -> int:  # noqa: N802 (c10d's name)
        return self._rank

    def getSize(self) -> int:  # noqa: N802
        """The world size: ranks are global. The view's members are ``active_ranks``."""
        return self.world_size

    def getBackendName(self) -> str:  # noqa: N802
        return BACKEND_NAME

    def getGroupName(self) -> str:  # noqa: N802
        return self._group_name

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._group_name = name

    @property
    def group_name(self) -> str:  # type: ignore[override]
        return self._group_name

    def name(self) -> str:  # type: ignore[override]
        return BACKEND_NAME

    @property
    def plane(self) -> GroupPlane:
        """The data plane that owns this group (a ``DataPlane``)."""
        return self._plane

    # -- torch's reconfigure (foldplane's model) -------------------------------------------------

    @property
    def _reconfigure_plane(self) -> ReconfigurePlane:
        return self._plane  # type: ignore[return-value]  (a DataPlane)

    def _take(self, view: object, request: Request) -> None:
        """The view committed: done once this data plane installed it (ranks stay global)."""
        version = int(view.version)  # type: ignore[attr-defined]
        installed = self._plane.wait_for_view(  # type: ignore[attr-defined]
            lambda v: v.version >= version, self._plane.backend_timeout_s
        )
        if installed is None or installed.version < version:
            raise DataPlaneError(
                f"rank {self._rank}: version {version} committed but this data plane did not "
                f"install it (installed: {None if installed is None else installed.version})"
            )

    # -- the current view ---------------------------------------------------------------------

    @property
    def version(self) -> int:
        """The version of the installed view (0 before the first one)."""
        view = self._plane.current_view()
        return 0 if view is None else view.version

    @property
    def active_ranks(self) -> tuple[int, ...]:
        """The installed view's members, in global rank order (ranks stay global in this
        model: a reconfigure's handle order numbers only the view's backend)."""
        view = self._plane.current_view()
        return () if view is None else tuple(sorted(view.members))

    # -- collectives (the elastic API: one tensor, global ranks, ``async_op``) ----------------

    def all_reduce(
        self,
        tensor: torch.Tensor,
        op: dist.ReduceOp = ReduceOp.SUM,
        async_op: bool = False,
        *,
        view: ViewGroup | None = None,
    ) -> Work:
        self._check_tensor("tensor", tensor, sparse_ok=True)  # gloo reduces sparse tensors
        opts = AllreduceOptions()
        opts.reduceOp = self._check_op(op, tensor)
        launch: Launch = lambda be, _v: be.allreduce([tensor], opts)  # noqa: E731
        return self._run("all_reduce", launch, async_op, result=[tensor], pinned=view)

    def broadcast(  # type: ignore[override]
        self,
        tensor: torch.Tensor | list[torch.Tensor],
        src: int | BroadcastOptions | None = None,
        async_op: bool = False,
        *,
        view: ViewGroup | None = None,
    ) -> Work:
        if isinstance(tensor, list):  # c10d: broadcast(tensors, opts)
            opts = src if isinstance(src, BroadcastOptions) else BroadcastOptions()
            one = _single("broadcast", tensor)
            work = self.broadcast(one, int(opts.rootRank), async_op=True)
            return self._c10d_outcome(work, opts)
        if src is None or isinstance(src, BroadcastOptions):
            raise TypeError("broadcast(tensor, src) needs src, a global rank")
        self._check_tensor("tensor", tensor)
        self._check_rank("src", src, allow_self=True)
        root = src

        def launch(be: object, v: ViewGroup) -> object:
            opts = BroadcastOptions()
            opts.rootRank = v.index(root)
            return be.broadcast([tensor], opts)  # type: ignore[attr-defined]

        return self._run("broadcast", launch, async_op, peer=src, result=[tensor], pinned=view)

    def all_gather(
        self,
        output_tensors: Sequence[torch.Tensor],
        tensor: torch.Tensor,
        async_op: bool = False,
        *,
        view: ViewGroup | None = None,
    ) -> Work:
        self._check_tensor("tensor", tensor)
        self._check_list("output_tensors", output_tensors, like=tensor)
        opts = AllgatherOptions()

        def launch(be: object, v: ViewGroup) -> object:
            outputs = [output_tensors[m] for m in v.members]
            return be.allgather([outputs], [tensor], opts)  # type: ignore[attr-defined]

        return self._run("all_gather", launch, async_op, result=list(output_tensors), pinned=view)

    def reduce_scatter(  # type: ignore[override]
        self,
        output: torch.Tensor | list[torch.Tensor],
        input_list: Sequence[torch.Tensor] | list[list[torch.Tensor]],
        op: dist.ReduceOp | ReduceScatterOptions = ReduceOp.SUM,
        async_op: bool = False,
    ) -> Work:
        if isinstance(output, list):  # c10d: reduce_scatter(outputs, input_lists, opts)
            opts = op if isinstance(op, ReduceScatterOptions) else ReduceScatterOptions()
            one = _single("reduce_scatter", output)
            inputs = _single("reduce_scatter", input_list)  # type: ignore[arg-type]
            work = self.reduce_scatter(one, inputs, opts.reduceOp, async_op=True)
            return self._c10d_outcome(work, opts)
        assert not isinstance(op, ReduceScatterOptions)
        self._check_tensor("output", output)
        self._check_list("input_list", input_list, like=output)  # type: ignore[arg-type]
        opts = ReduceScatterOptions()
        opts.reduceOp = self._check_op(op, output)

        def launch(be: object, view: ViewGroup) -> object:
            inputs = [input_list[m] for m in view.members]
            return be.reduce_scatter([output], [inputs], opts)  # type: ignore[attr-defined]

        return self._run("reduce_scatter", launch, async_op, result=[output])

    def reduce(  # type: ignore[override]
        self,
        tensor: torch.Tensor | list[torch.Tensor],
        dst: int | ReduceOptions | None = None,
        op: dist.ReduceOp = ReduceOp.SUM,
        async_op: bool = False,
    ) -> Work:
        """Reduce ``tensor`` of every member into ``dst``'s (a global rank, active in the view).

        The other members' tensors are left as the backend leaves them (gloo: unchanged).
        """
        if isinstance(tensor, list):  # c10d: reduce(tensors, opts)
            opts = dst if isinstance(dst, ReduceOptions) else ReduceOptions()
            one = _single("reduce", tensor)
            work = self.reduce(one, int(opts.rootRank), opts.reduceOp, async_op=True)
            return self._c10d_outcome(work, opts)
        if dst is None or isinstance(dst, ReduceOptions):
            raise TypeError("reduce(tensor, dst) needs dst, a global rank")
        self._check_tensor("tensor", tensor)
        self._check_rank("dst", dst, allow_self=True)
        reduce_op, root = self._check_op(op, tensor), dst

        def launch(be: object, v: ViewGroup) -> object:
            opts = ReduceOptions()
            opts.reduceOp, opts.rootRank = reduce_op, v.index(root)
            return be.reduce([tensor], opts)  # type: ignore[attr-defined]

        return self._run("reduce", launch, async_op, peer=dst, result=[tensor])

    def gather(  # type: ignore[override]
        self,
        tensor: torch.Tensor | list[list[torch.Tensor]],
        gather_list: Sequence[torch.Tensor] | list[torch.Tensor] | None = None,
        dst: int | GatherOptions = 0,
        async_op: bool = False,
    ) -> Work:
        """Gather every member's ``tensor`` into ``gather_list`` on ``dst`` (``world_size``
        entries there, one per global rank; those of ranks outside the view are left unchanged;
        None or empty on the other ranks)."""
        if isinstance(tensor, list):  # c10d: gather(output_lists, inputs, opts)
            opts = dst if isinstance(dst, GatherOptions) else GatherOptions()
            outputs = tensor[0] if tensor else []
            one = _single("gather", gather_list)  # type: ignore[arg-type]
            work = self.gather(one, outputs, int(opts.rootRank), async_op=True)
            return self._c10d_outcome(work, opts)
        assert not isinstance(dst, GatherOptions)
        self._check_tensor("tensor", tensor)
        self._check_rank("dst", dst, allow_self=True)
        root, is_root = dst, dst == self._rank
        if is_root:
            self._check_list("gather_list", gather_list or [], like=tensor)
        elif gather_list:
            raise ValueError(f"gather_list must be empty on rank {self._rank}, not dst={dst}")
        slots = list(gather_list or [])

        def launch(be: object, v: ViewGroup) -> object:
            opts = GatherOptions()
            opts.rootRank = v.index(root)
            outputs = [[slots[m] for m in v.members]] if is_root else []
            return be.gather(outputs, [tensor], opts)  # type: ignore[attr-defined]

        return self._run("gather", launch, async_op, peer=dst, result=slots or [tensor])

    def scatter(  # type: ignore[override]
        self,
        tensor: torch.Tensor | list[torch.Tensor],
        scatter_list: Sequence[torch.Tensor] | list[list[torch.Tensor]] | None = None,
        src: int | ScatterOptions = 0,
        async_op: bool = False,
    ) -> Work:
        """Scatter ``scatter_list`` (``world_size`` entries on ``src``, one per global rank;
        None or empty elsewhere) into each member's ``tensor``; entries of ranks outside the
        view are not sent."""
        if isinstance(tensor, list):  # c10d: scatter(outputs, input_lists, opts)
            opts = src if isinstance(src, ScatterOptions) else ScatterOptions()
            one = _single("scatter", tensor)
            inputs = scatter_list[0] if scatter_list else []
            work = self.scatter(one, inputs, int(opts.rootRank), async_op=True)  # type: ignore[arg-type]
            return self._c10d_outcome(work, opts)
        assert not isinstance(src, ScatterOptions)
        self._check_tensor("tensor", tensor)
        self._check_rank("src", src, allow_self=True)
        root, is_root = src, src == self._rank
        if is_root:
            self._check_list("scatter_list", scatter_list or [], like=tensor)  # type: ignore[arg-type]
        elif scatter_list:
            raise ValueError(f"scatter_list must be empty on rank {self._rank}, not src={src}")
        slots = list(scatter_list or [])

        def launch(be: object, v: ViewGroup) -> object:
            opts = ScatterOptions()
            opts.rootRank = v.index(root)
            inputs = [[slots[m] for m in v.members]] if is_root else []
            return be.scatter([tensor], inputs, opts)  # type: ignore[attr-defined]

        return self._run("scatter", launch, async_op, peer=src, result=[tensor])

    def barrier(  # type: ignore[override]
        self, async_op: bool | BarrierOptions = False, *, opts: BarrierOptions | None = None
    ) -> Work:
        if isinstance(async_op, BarrierOptions):
            opts = async_op
        if opts is not None:  # c10d: barrier(opts)
            return self._c10d_outcome(self.barrier(async_op=True), opts)
        launch: Launch = lambda be, _v: be.barrier(BarrierOptions())  # noqa: E731
        return self._run("barrier", launch, async_op)

    def send(  # type: ignore[override]
        self,
        tensor: torch.Tensor | list[torch.Tensor],
        dst: int,
        async_op: bool | int = False,
        *,
        view: ViewGroup | None = None,
    ) -> Work:
        if isinstance(tensor, list):  # c10d: send(tensors, dstRank, tag)
            work = self._p2p("send", _single("send", tensor), dst, int(async_op))
            return self._p2p_outcome(work, "send")
        self._check_tensor("tensor", tensor)
        self._check_rank("dst", dst, allow_self=False)
        return self._p2p("send", tensor, dst, 0, async_op=bool(async_op), view=view)

    def recv(  # type: ignore[override]
        self,
        tensor: torch.Tensor | list[torch.Tensor],
        src: int,
        async_op: bool | int = False,
        *,
        view: ViewGroup | None = None,
    ) -> Work:
        if isinstance(tensor, list):  # c10d: recv(tensors, srcRank, tag)
            work = self._p2p("recv", _single("recv", tensor), src, int(async_op))
            return self._p2p_outcome(work, "recv")
        self._check_tensor("tensor", tensor)
        self._check_rank("src", src, allow_self=False)
        return self._p2p("recv", tensor, src, 0, async_op=bool(async_op), view=view)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> Work:
        """``dist.recv(t)`` / ``dist.irecv(t)`` without ``src``: from whichever member sends.

        ``work._source_rank()`` is the sender's global rank once the receive has succeeded.
        """
        tensor = _single("recv_anysource", tensors)
        self._check_tensor("tensor", tensor)
        launch: Launch = lambda be, _v: be.recv_anysource([tensor], tag)  # noqa: E731
        work = self._run("recv_anysource", launch, True, p2p=True, result=[tensor])
        work._any_source = True
        return self._p2p_outcome(work, "recv")

    recvAnysource = recv_anysource  # noqa: N815 (the name torch 2.14's C++ looks up)

    def _p2p(
        self,
        name: str,
        tensor: torch.Tensor,
        peer: int,
        tag: int,
        *,
        async_op: bool = True,
        view: ViewGroup | None = None,
    ) -> Work:
        self._check_tensor("tensor", tensor)
        self._check_rank("dst" if name == "send" else "src", peer, allow_self=False)
        if name == "send":
            launch: Launch = lambda be, v: be.send([tensor], v.index(peer), tag)  # noqa: E731
        else:
            launch = lambda be, v: be.recv([tensor], v.index(peer), tag)  # noqa: E731
        return self._run(name, launch, async_op, peer=peer, p2p=True, result=[tensor], pinned=view)

    # -- the c10d entry points that have no elastic twin ---------------------------------------

    def allreduce(self, tensors: list[torch.Tensor], opts: AllreduceOptions | None = None) -> Work:
        opts = opts if opts is not None else AllreduceOptions()
        work = self.all_reduce(_single("allreduce", tensors), opts.reduceOp, async_op=True)
        return self._c10d_outcome(work, opts)

    def allgather(
        self,
        output_tensors: list[list[torch.Tensor]],
        input_tensors: list[torch.Tensor],
        opts: AllgatherOptions | None = None,
    ) -> Work:
        opts = opts if opts is not None else AllgatherOptions()
        outputs = _single("allgather", output_tensors)
        work = self.all_gather(outputs, _single("allgather", input_tensors), async_op=True)
        return self._c10d_outcome(work, opts)

    def allreduce_coalesced(
        self, tensors: list[torch.Tensor], opts: AllreduceCoalescedOptions | None = None
    ) -> Work:
        """``dist.all_reduce_coalesced``: several tensors reduced as one operation."""
        opts = opts if opts is not None else AllreduceCoalescedOptions()
        if not isinstance(tensors, list) or not tensors:
            raise ValueError("allreduce_coalesced takes a non-empty list of tensors")
        for i, t in enumerate(tensors):
            self._check_tensor(f"tensors[{i}]", t)
        inner = AllreduceCoalescedOptions()
        inner.reduceOp = self._check_op(opts.reduceOp, tensors[0])
        launch: Launch = lambda be, _v: be.allreduce_coalesced(tensors, inner)  # noqa: E731
        work = self._run("allreduce_coalesced", launch, True, result=list(tensors))
        return self._c10d_outcome(work, opts)

    def allgather_coalesced(
        self,
        output_lists: list[list[torch.Tensor]],
        input_tensors: list[torch.Tensor],
        opts: AllgatherOptions | None = None,
    ) -> Work:
        """``dist.all_gather_coalesced``: ``output_lists`` has ``world_size`` lists (one per
        global rank) of one slot per input; those of ranks outside the view are left unchanged."""
        opts = opts if opts is not None else AllgatherOptions()
        if not isinstance(input_tensors, list) or not input_tensors:
            raise ValueError("allgather_coalesced takes a non-empty list of input tensors")
        for i, t in enumerate(input_tensors):
            self._check_tensor(f"input_tensors[{i}]", t)
        if not isinstance(output_lists, list) or len(output_lists) != self.world_size:
            raise ValueError(
                f"output_lists must have world_size={self.world_size} lists (one per rank)"
            )
        for r, row in enumerate(output_lists):
            if not isinstance(row, list) or len(row) != len(input_tensors):
                raise ValueError(
                    f"output_lists[{r}] must have {len(input_tensors)} tensors, one per input"
                )
            for t, like in zip(row, input_tensors, strict=True):
                self._check_tensor(f"output_lists[{r}]", t)
                if t.shape != like.shape or t.dtype != like.dtype:
                    raise ValueError(
                        f"output_lists[{r}] has {tuple(t.shape)} {t.dtype}; expected "
                        f"{tuple(like.shape)} {like.dtype}"
                    )

        def launch(be: object, v: ViewGroup) -> object:
            outputs = [output_lists[m] for m in v.members]
            return be.allgather_coalesced(outputs, input_tensors, AllgatherOptions())  # type: ignore[attr-defined]

        result = [t for row in output_lists for t in row]
        work = self._run("allgather_coalesced", launch, True, result=result)
        return self._c10d_outcome(work, opts)

    def all_gather_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: AllgatherOptions | None = None
    ) -> Work:
        """``dist.all_gather_into_tensor``: ``output`` holds ``world_size`` slots of ``input``."""
        opts = opts if opts is not None else AllgatherOptions()
        slots = self._slots("output", output, input)
        return self._c10d_outcome(self.all_gather(slots, input, async_op=True), opts)

    _allgather_base = all_gather_single

    def reduce_scatter_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: ReduceScatterOptions | None = None
    ) -> Work:
        """``dist.reduce_scatter_tensor``: ``input`` holds ``world_size`` slots of ``output``."""
        opts = opts if opts is not None else ReduceScatterOptions()
        slots = self._slots("input", input, output)
        work = self.reduce_scatter(output, slots, opts.reduceOp, async_op=True)
        return self._c10d_outcome(work, opts)

    _reduce_scatter_base = reduce_scatter_single

    def all_gather_single_coalesced(
        self,
        outputs: list[torch.Tensor],
        inputs: list[torch.Tensor],
        opts: AllgatherOptions | None = None,
    ) -> Work:
        """Several ``all_gather_single`` as one operation (functional collectives'
        ``all_gather_into_tensor``, which DTensor's ``full_tensor()`` runs; the coalescing
        manager): ``outputs[i]`` holds ``world_size`` slots of ``inputs[i]``."""
        opts = opts if opts is not None else AllgatherOptions()
        if not isinstance(outputs, list) or not isinstance(inputs, list):
            raise TypeError("all_gather_single_coalesced takes two lists of tensors")
        if len(outputs) != len(inputs):
            raise ValueError(
                f"all_gather_single_coalesced: {len(outputs)} outputs for {len(inputs)} inputs"
            )
        slots = [
            self._slots(f"outputs[{i}]", o, x)
            for i, (o, x) in enumerate(zip(outputs, inputs, strict=True))
        ]
        rows = [[slot[r] for slot in slots] for r in range(self.world_size)]
        return self.allgather_coalesced(rows, list(inputs), opts)

    allgather_into_tensor_coalesced = all_gather_single_coalesced  # torch 2.13's name

    def reduce_scatter_single_coalesced(
        self,
        outputs: list[torch.Tensor],
        inputs: list[torch.Tensor],
        opts: ReduceScatterOptions | None = None,
    ) -> CoalescedWork:
        """Several ``reduce_scatter_single`` answered together (functional collectives'
        ``reduce_scatter_tensor``; the coalescing manager): ``inputs[i]`` holds
        ``world_size`` slots of ``outputs[i]``."""
        opts = opts if opts is not None else ReduceScatterOptions()
        if not isinstance(outputs, list) or not isinstance(inputs, list):
            raise TypeError("reduce_scatter_single_coalesced takes two lists of tensors")
        if len(outputs) != len(inputs):
            raise ValueError(
                f"reduce_scatter_single_coalesced: {len(outputs)} outputs for {len(inputs)} inputs"
            )
        slots = [
            self._slots(f"inputs[{i}]", x, o)
            for i, (o, x) in enumerate(zip(outputs, inputs, strict=True))
        ]
        op = opts.reduceOp
        works = [
            self.reduce_scatter(o, slot, op, async_op=True)
            for o, slot in zip(outputs, slots, strict=True)
        ]
        name = f"reduce_scatter_single_coalesced (rank {self._rank}, {len(works)} operations)"
        return self._c10d_outcome(CoalescedWork(name, works, self.world_size), opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced  # torch 2.13's name

    def alltoall(
        self,
        output_tensors: list[torch.Tensor],
        input_tensors: list[torch.Tensor],
        opts: AllToAllOptions | None = None,
    ) -> Work:
        """``dist.all_to_all``: ``input_tensors[r]`` goes to global rank ``r`` and
        ``output_tensors[r]`` comes from it (``world_size`` entries each, of one dtype; their
        sizes may differ); the entries of ranks outside the view are neither sent nor written."""
        opts = opts if opts is not None else AllToAllOptions()
        for what, tensors in (("output_tensors", output_tensors), ("input_tensors", input_tensors)):
            if not isinstance(tensors, list) or len(tensors) != self.world_size:
                got = len(tensors) if isinstance(tensors, list) else type(tensors).__name__
                raise ValueError(
                    f"{what} must have world_size={self.world_size} entries (one per rank), "
                    f"got {got}"
                )
            for i, t in enumerate(tensors):
                self._check_tensor(f"{what}[{i}]", t)
        outputs, inputs = list(output_tensors), list(input_tensors)
        _one_dtype("alltoall", outputs + inputs)

        def launch(be: object, v: ViewGroup) -> object:
            outs, ins = [outputs[m] for m in v.members], [inputs[m] for m in v.members]
            if len({t.numel() for t in outs + ins}) == 1:  # gloo's alltoall: equal sizes
                return be.alltoall(outs, ins, AllToAllOptions())  # type: ignore[attr-defined]
            return _all_to_all_flat(be, outs, ins)

        return self._c10d_outcome(self._run("alltoall", launch, True, result=outputs), opts)

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: AllToAllOptions | None = None,
    ) -> Work:
        """``dist.all_to_all_single``: ``input`` is cut along its first dimension into
        ``world_size`` chunks (``input_split_sizes``, or equal ones), chunk ``r`` going to global
        rank ``r``; ``output``'s chunks (``output_split_sizes``) come from each rank. The
        chunks of ranks outside the view are neither sent nor written."""
        opts = opts if opts is not None else AllToAllOptions()
        outputs = self._chunks("output", output, output_split_sizes)
        inputs = self._chunks("input", input, input_split_sizes)
        _one_dtype("all_to_all_single", [output, input])
        out_rows = [len(c) for c in outputs]
        in_rows = [len(c) for c in inputs]

        def launch(be: object, v: ViewGroup) -> object:
            if len(v.members) == self.world_size:  # the whole tensors, as torch's own call
                return be.alltoall_base(output, input, out_rows, in_rows, AllToAllOptions())  # type: ignore[attr-defined]
            outs, ins = [outputs[m] for m in v.members], [inputs[m] for m in v.members]
            return _all_to_all_flat(be, outs, ins)

        work = self._run("all_to_all_single", launch, True, result=[output])
        return self._c10d_outcome(work, opts)

    alltoall_base = all_to_all_single  # torch 2.13's name

    def _chunks(self, what: str, flat: torch.Tensor, splits: Sequence[int]) -> list[torch.Tensor]:
        """``flat`` cut along its first dimension into one chunk per global rank."""
        self._check_tensor(what, flat)
        rows = flat.shape[0] if flat.dim() else 0
        if not splits:
            if rows % self.world_size:
                raise ValueError(
                    f"{what}'s first dimension ({rows}) is not divisible by "
                    f"world_size={self.world_size}; give split sizes"
                )
            splits = [rows // self.world_size] * self.world_size
        if len(splits) != self.world_size or sum(splits) != rows or min(splits) < 0:
            raise ValueError(
                f"{what} split sizes {list(splits)} must be world_size={self.world_size} "
                f"sizes that add up to its first dimension ({rows})"
            )
        return list(flat.split(list(splits)))

    def _slots(self, what: str, flat: torch.Tensor, like: torch.Tensor) -> list[torch.Tensor]:
        self._check_tensor(what, flat)
        if flat.numel() != self.world_size * like.numel() or flat.dtype != like.dtype:
            raise ValueError(
                f"{what} must hold world_size={self.world_size} slots of {tuple(like.shape)} "
                f"{like.dtype}, got {tuple(flat.shape)} {flat.dtype}"
            )
        return [row.view(like.shape) for row in flat.view(self.world_size, -1).unbind(0)]

    def _c10d_outcome(self, work: Work, opts: object) -> Work:
        """A synchronous c10d call raises for a peer's failure (else torch would ignore it)."""
        if getattr(opts, "asyncOp", True):
            return work
        return self._raise_if_failed(work)

    def _p2p_outcome(self, work: Work, name: str) -> Work:
        """``dist.send``/``dist.recv`` are synchronous but pass no option: look at the caller."""
        if not _called_by_sync(name):
            return work
        return self._raise_if_failed(work)

    def _raise_if_failed(self, work: Work) -> Work:
        if work.wait():
            return work
        hint = work.failed_ranks_hint()
        failed = [r for r, bad in enumerate(hint.tolist()) if bad]
        raise PeerFailure(work.name, failed, hint.clone())

    # -- coalescing (torch's coalescing manager, batch_isend_irecv) ---------------------------

    #: ``dist.batch_isend_irecv`` (torch 2.14) coalesces through ``_get_backend(device)``
    supports_coalescing = True
    #: torch never splits this group's backend (``dist.split_group``: docs/torch-compat.md)
    supports_splitting = False

    def _get_backend(self, device: object) -> ElasticProcessGroup:
        """The group is its own backend on every device: torch 2.14 asks a group's backend
        whether it coalesces (``dist.batch_isend_irecv``, the abort of the default group),
        which a Python group does not register."""
        return self

    def supports_tensor_alloc(self, device: object) -> bool:
        """No allocator of its own (FSDP2 asks the backend): tensors are plain torch ones."""
        return False

    def start_coalescing(self, device: object) -> None:
        """Open a coalescing region on this thread (torch's ``_start_coalescing``): the
        operations issued until :meth:`end_coalescing` run as they are issued, and its
        :class:`CoalescedWork` answers for all of them.

        Regions do not nest: a region left open (torch's coalescing manager does not close it
        when its body raised) is replaced; its operations keep their own ``Work``."""
        self._coalescing.works = []

    def end_coalescing(self, device: object) -> CoalescedWork:
        """Close this thread's coalescing region: one handle on every operation issued in it
        (an empty region's succeeded)."""
        works = getattr(self._coalescing, "works", None)
        if works is None:
            raise DataPlaneError(
                f"end_coalescing on rank {self._rank} without start_coalescing on this thread"
            )
        self._coalescing.works = None
        name = f"coalesced (rank {self._rank}, {len(works)} operations)"
        return CoalescedWork(name, works, self.world_size)

    # -- CUDA graphs --------------------------------------------------------------------------

    @contextmanager
    def capture(self, graph: torch.cuda.CUDAGraph, **graph_kwargs: object) -> Iterator[None]:
        """Capture this group's CUDA operations into ``graph`` (``torch.cuda.graph(graph)``),
        recording the view they belong to, so that :meth:`replay` can follow each replay.

        The view's NCCL communicator must be built: run one CUDA operation on the view first
        (capture cannot build it). Nothing is allocated per operation inside the capture.
        """
        self._capture_view = None
        try:
            with torch.cuda.graph(graph, **graph_kwargs):  # type: ignore[arg-type]
                yield
            view = self._capture_view
        finally:
            self._capture_view = None
        if view is None:
            raise DataPlaneError("no CUDA operation of the foldplane group was captured")
        self._graph_views[graph] = view

    def _captured_view(self, view: ViewGroup) -> None:
        if self._capture_view is not None and self._capture_view is not view:
            raise DataPlaneError(
                f"the installed view changed from {self._capture_view.version} to "
                f"{view.version} during a CUDA graph capture; capture again"
            )
        self._capture_view = view

    def replay(self, graph: torch.cuda.CUDAGraph) -> Work:
        """Replay ``graph`` (captured with :meth:`capture`) on the current stream; its ``Work``
        fails like any operation when a member dies or hangs during the replay (the view's
        communicator is then aborted, which ends the graph's kernels): ``wait()`` False, the
        hint names the failed ranks.

        A graph captured on a view that is no longer installed cannot be replayed (its
        communicator belongs to the old view): ``DataPlaneError``, capture it again.
        """
        view = self._graph_views.get(graph)
        if view is None:
            raise DataPlaneError("this graph was not captured with pg.capture(graph)")
        plane = self._plane
        current = plane.current_view()
        if current is not view:
            raise DataPlaneError(
                f"the graph was captured on view {view.version}, and view "
                f"{None if current is None else current.version} is installed now: capture "
                "it again on the current view"
            )
        work = Work(
            f"graph replay (rank {self._rank}, view {view.version})",
            view,
            plane.hint_pool_for("cuda"),
            plane.closed,
            plane.collective_timeout_s,
        )
        if not view.register(work):
            return work._fail_with_view()
        view.op_started()
        graph.replay()
        work._started_replay(plane.device, plane.cuda_watch)
        return work

    # -- hints and knobs ----------------------------------------------------------------------

    def get_failed_ranks_hint(self, work: Work | CoalescedWork) -> torch.Tensor:
        """``work``'s hint: int32, shape ``(world_size,)``, 1 = failed in THIS operation.

        Waits for the operation, and on failure for the liveness decision (about
        ``liveness_window_periods * liveness_period_s``). The tensor is ``work``'s own buffer:
        valid while ``work`` is alive; ``clone()`` it to keep it longer.
        """
        if not isinstance(work, Work | CoalescedWork):
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
        result: list[torch.Tensor] | None = None,
        pinned: ViewGroup | None = None,
    ) -> Work:
        """Run one operation on the current view (or on ``pinned``, which must still be current).

        An operation pinned to a view that is no longer the installed one fails at once, and
        this rank leaves that view (its members are poisoned, so they fail fast too): the caller
        ran a step on that view and must not mix views within it.
        """
        plane = self._plane
        timeout_s = plane.p2p_timeout_s if p2p else plane.collective_timeout_s
        deadline = time.monotonic() + timeout_s
        device_type = result[0].device.type if result else "cpu"  # a barrier runs on gloo
        capturing = device_type == "cuda" and torch.cuda.is_current_stream_capturing()
        while True:
            view = plane.view_for_op(name)
            if pinned is not None and view is not pinned:
                view, newer = pinned, view
                pinned.leave(f"rank {self._rank} moved on to view {newer.version}")
            runnable = view.active and (peer is None or peer in view.members)
            backend = view.backend(deadline, device_type) if runnable else None
            if backend is None and runnable and view.failure is None:
                if pinned is not None:
                    pinned.leave(f"rank {self._rank} moved on from view {pinned.version}")
                    break
                continue  # superseded while we waited for its backend: run on the newer view
            break
        work = Work(
            f"{name} (rank {self._rank}, view {view.version})",
            view,
            # a captured operation's hint is never written by a replay: a CPU buffer (nothing
            # of the pool's device memory may be written by a graph once it is back in the pool)
            plane.hint_pool_for("cpu" if capturing else device_type),
            plane.closed,
            timeout_s,
            result,
        )
        region = getattr(self._coalescing, "works", None)
        if region is not None:
            region.append(work)
        if not view.active:
            return work._complete_locally(True)
        if peer is not None and peer not in view.members:
            return work._complete_locally(False, (peer,))
        if capturing and backend is not None:
            self._captured_view(view)
        inline = not async_op and device_type == "cpu"
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
        elif capturing:
            work._captured_in_graph(backend_work)
        elif device_type == "cuda":
            assert plane.end_events is not None
            work._started_cuda(backend_work, plane.device, plane.end_events, plane.cuda_watch)
            if not async_op:
                work.wait()
        else:
            work._started(backend_work)
            if not async_op:
                work.wait()
        return work

    # -- argument checks (local misuse raises) ------------------------------------------------

    def _check_tensor(self, what: str, tensor: object, *, sparse_ok: bool = False) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{what} must be a torch.Tensor, got {type(tensor).__name__}")
        device = self._plane.device
        if tensor.device.type == "cuda":
            if device.type != "cuda":
                raise ValueError(
                    f"{what} is on {tensor.device}, but this data plane serves CPU tensors only "
                    "(backend 'gloo'); create the agent with backend='nccl' for CUDA tensors"
                )
            if tensor.device.index is not None and tensor.device != device:
                raise ValueError(
                    f"{what} is on {tensor.device}, but this rank's GPU is {device} "
                    "(one GPU per rank: cuda:LOCAL_RANK)"
                )
        elif tensor.device.type != "cpu":
            raise ValueError(f"{what} is on {tensor.device}: the data plane serves CPU and CUDA")
        if tensor.is_sparse:
            if not sparse_ok:
                raise ValueError(f"{what} must be a dense, contiguous tensor")
        elif not tensor.is_contiguous():
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
            if t.shape != like.shape or t.dtype != like.dtype or t.device != like.device:
                raise ValueError(
                    f"{what}[{i}] has shape {tuple(t.shape)}, dtype {t.dtype} on {t.device}; "
                    f"expected {tuple(like.shape)}, {like.dtype} on {like.device}"
                )

    def _check_rank(self, what: str, rank: int, *, allow_self: bool) -> None:
        if not isinstance(rank, int) or isinstance(rank, bool):
            raise TypeError(f"{what} must be an int rank, got {type(rank).__name__}")
        if not 0 <= rank < self.world_size:
            raise ValueError(f"{what}={rank} is out of range 0..{self.world_size - 1}")
        if not allow_self and rank == self._rank:
            raise ValueError(f"{what}={rank} is this rank itself")

    def _check_op(self, op: dist.ReduceOp, tensor: torch.Tensor) -> dist.ReduceOp:
        # ``op == bad``, not ``op in``: an options object's ReduceOp equals the enum value
        # only from its own side.
        if tensor.device.type == "cpu" and any(op == bad for bad in _GLOO_UNSUPPORTED_OPS):
            raise ValueError(f"gloo does not support {op} (CPU tensors run on gloo)")
        return op


def _single(op: str, tensors: list) -> object:
    if not isinstance(tensors, list) or len(tensors) != 1:
        got = len(tensors) if isinstance(tensors, list) else type(tensors).__name__
        raise ValueError(f"{op}: the foldplane group takes exactly one tensor (list), got {got}")
    return tensors[0]


def _one_dtype(op: str, tensors: list[torch.Tensor]) -> None:
    dtypes = sorted({str(t.dtype) for t in tensors})
    if len(dtypes) > 1:
        raise ValueError(f"{op}: every tensor must have one dtype, got {', '.join(dtypes)}")


def _all_to_all_flat(
    be: object, outputs: list[torch.Tensor], inputs: list[torch.Tensor]
) -> _ThenCopy:
    """One all-to-all of the view's members whose chunks differ in size or do not lie side by
    side: their inputs copied into one flat tensor, gloo's ``alltoall_base`` with the chunks'
    sizes, and each output copied from the flat result once it arrived."""
    flat_in = torch.cat([t.reshape(-1) for t in inputs])
    flat_out = flat_in.new_empty(sum(t.numel() for t in outputs))
    out_sizes, in_sizes = [t.numel() for t in outputs], [t.numel() for t in inputs]
    work = be.alltoall_base(flat_out, flat_in, out_sizes, in_sizes, AllToAllOptions())  # type: ignore[attr-defined]

    def copy_out() -> None:
        for out, piece in zip(outputs, flat_out.split(out_sizes), strict=True):
            out.view(-1).copy_(piece)

    return _ThenCopy(work, copy_out)


class _ThenCopy:
    """A backend operation followed by a copy into the caller's tensors: its end (``wait``,
    ``get_future``) is the copy's, which runs once, only after the operation succeeded."""

    def __init__(self, work: object, copy: Callable[[], None]) -> None:
        self._work = work
        self._copy = copy
        self._lock = threading.Lock()
        self._copied = False

    def _copy_once(self) -> None:
        with self._lock:
            if not self._copied:
                self._copied = True
                self._copy()

    def wait(self, timeout: object = None) -> bool:
        done = self._work.wait() if timeout is None else self._work.wait(timeout)  # type: ignore[attr-defined]
        self._copy_once()
        return done

    def is_completed(self) -> bool:
        return self._work.is_completed()  # type: ignore[attr-defined]

    def get_future(self) -> torch.futures.Future:
        def copied(fut: torch.futures.Future) -> object:
            value = fut.value()  # raises the operation's error: no copy then
            self._copy_once()
            return value

        return self._work.get_future().then(copied)  # type: ignore[attr-defined]


_C10D = "torch.distributed.distributed_c10d"


def _called_by_sync(name: str) -> bool:
    """True if ``dist.send``/``dist.recv`` (synchronous) called us, not ``dist.isend``/``irecv``."""
    frame = sys._getframe(2)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module == _C10D and frame.f_code.co_name == name:
            return True
        if not module.startswith("torch.") and module != __name__:
            return False  # reached the caller's code: no synchronous dist.* call above us
        frame = frame.f_back
    return False


def _positive_us(what: str, us: int) -> int:
    if not isinstance(us, int) or isinstance(us, bool) or us <= 0:
        raise ValueError(f"{what} must be a positive number of microseconds, got {us!r}")
    return us
