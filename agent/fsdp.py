"""Elastic HSDP: FSDP2 sharded inside each replica, replicated over the foldplane group.

>>> agent = Agent().start()                  # rank = this replica's index, in its shard's group
>>> mesh = hsdp_mesh(agent, shards=2, shard=s, replica_id=os.environ[REPLICA_ID_ENV])
>>> for layer in model.layers:
...     fully_shard(layer, mesh=mesh.device_mesh)
>>> fully_shard(model, mesh=mesh.device_mesh)
>>> model = ElasticFSDP(model, mesh)
>>> opt = ElasticOptimizer(model, torch.optim.AdamW(model.parameters()))
>>> for x, y in data:
...     opt.zero_grad()
...     loss_fn(model(x), y).backward()
...     opt.step()                           # True: committed on every replica

The shape (see ``docs/fsdp.md``): ``R`` replicas of ``S`` processes each. The processes of one
replica form a **shard group**, a plain fixed backend (gloo here) that lives and dies with the
replica. The processes with the same shard index ``s`` across the replicas form the foldplane
group ``G-s<s>`` (world size ``R``, rank = the replica's index): the **replicate** dimension,
the elastic one. Global ranks are ``replica * S + shard``.

- **A step runs on one view per shard index.** ``begin_step()`` (called by the first forward
  of a step) pins the installed view of this process's foldplane group; FSDP's all-reduce over
  the replicate dimension runs on it (``ReplicateGroup``), and its ``size()`` is the view's
  number of members, so FSDP divides the gradients by ``S * members``.
- **Every replica commits or skips the same steps, as a whole.** After the backward pass each
  shard rank votes whether its collectives succeeded on its own group
  (``agent.agreement.StepAgreement``: the decision is the same on all the view's members); then
  the shard ranks of a replica exchange their decisions and their views' members
  (``ReplicaExchange``, a store the replica hosts), and the replica steps only if every group
  committed and the members are the same in all of them. A replica that steps therefore knows
  that every group's view had the same members, each of which voted ok in every group and sees
  the same decisions: every replica of the view steps, or none does.
- **Healing.** Entering a view, each shard rank syncs its own shards (parameters and optimizer
  state, the local pieces of the DTensors) with ``agent.elastic.sync_state`` over its group: a
  replacement replica's shard ``s`` receives them from shard ``s`` of the replica with the most
  committed steps.
"""

from __future__ import annotations

import atexit
import logging
import os
import time
import weakref
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllreduceOptions
from torch.distributed import PrefixStore, TCPStore
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from .agreement import CLOSE_WAIT_S, Janitor
from .dataplane.group import ElasticProcessGroup
from .dataplane.plane import DataPlane
from .dataplane.view import ViewGroup
from .dataplane.work import Work
from .elastic import ElasticStep, sync_state

log = logging.getLogger("foldplane.fsdp")

#: The environment of an HSDP process: the replica's id (the same in all its processes, new for
#: a replacement replica), this process's shard index, and the number of shards per replica.
REPLICA_ID_ENV, SHARD_ENV, SHARDS_ENV = (
    "FOLDPLANE_REPLICA_ID",
    "FOLDPLANE_SHARD",
    "FOLDPLANE_SHARDS",
)
#: The backend name of the default group ``hsdp_mesh`` makes: it numbers the ranks, no more.
WORLD_BACKEND = "foldplane-world"
_DTENSOR = "__foldplane_dtensor__"


class _Done(dist.Work):
    """An operation with nothing to do (an inactive rank, or a step that failed already)."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        super().__init__()
        self._tensors = tensors

    def wait(self, timeout: timedelta | None = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(self._tensors)
        return future


class _World(dist.ProcessGroup):
    """The default group of an HSDP process: the global numbering (``replica * S + shard``).

    DeviceMesh needs a default group to find this process's coordinate; nothing runs on it
    (a collective on it raises: torch finds no backend).
    """

    def __init__(self, rank: int, size: int) -> None:
        super().__init__(rank, size)
        self._group_name = ""

    def getBackendName(self) -> str:  # noqa: N802 (c10d's name)
        return WORLD_BACKEND

    def getGroupName(self) -> str:  # noqa: N802
        return self._group_name

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._group_name = name

    def name(self) -> str:  # type: ignore[override]
        return WORLD_BACKEND


class ReplicateGroup(dist.ProcessGroup):
    """The replicate dimension of an HSDP mesh: the foldplane group, on one step's view.

    ``rank()`` is the replica's index; ``size()`` is the number of members of the pinned view
    (1 while none is), which FSDP divides the summed gradients by. ``allreduce`` runs on the
    pinned view and never raises for a peer's failure: it marks the step failed (``ok``) and
    the step is then skipped on every replica. On an inactive rank, or once the step failed,
    it leaves the tensor as it is.
    """

    def __init__(self, elastic: ElasticProcessGroup) -> None:
        super().__init__(elastic.rank(), elastic.size())
        self.elastic = elastic
        self._group_name = ""
        self.view: ViewGroup | None = None
        self.ok = True
        self.works: list[Work] = []

    def pin(self, view: ViewGroup | None) -> None:
        """The view of the next step's all-reduces (None: a local step, never committed)."""
        self.view, self.ok, self.works = view, view is not None, []

    def getRank(self) -> int:  # noqa: N802 (c10d's name)
        return self.elastic.rank()

    def getSize(self) -> int:  # noqa: N802
        return 1 if self.view is None else len(self.view.members)

    def getBackendName(self) -> str:  # noqa: N802
        return self.elastic.getBackendName()

    def getGroupName(self) -> str:  # noqa: N802
        return self._group_name

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._group_name = name

    @property
    def group_name(self) -> str:  # type: ignore[override]
        return self._group_name

    def name(self) -> str:  # type: ignore[override]
        return self.elastic.getBackendName()

    def allreduce(
        self, tensors: list[torch.Tensor], opts: AllreduceOptions | None = None
    ) -> dist.Work:
        opts = opts if opts is not None else AllreduceOptions()
        if len(tensors) != 1:
            raise ValueError(f"allreduce takes one tensor per process, got {len(tensors)}")
        if self.view is None or not self.ok:
            return _Done(tensors)
        # FSDP's all-reduce is synchronous: wait here (inside gloo, no thread hop), and never
        # raise for a peer's failure (the elastic call returns the failed Work).
        work = self.elastic.all_reduce(tensors[0], opts.reduceOp, async_op=False, view=self.view)
        self.works.append(work)
        if not work.wait():
            self.ok = False
        return work


class ReplicaExchange:
    """The processes of one replica swap a small row each step, through a store the replica
    hosts: its shard-0 process runs a ``TCPStore`` at the data plane's address
    (``DataPlane.gloo_hostname``), and the others dial it.

    Why not a collective on the shard group: a gloo operation hops from the caller to a
    worker thread and to the transport's thread and back, and on loaded cores each hop waits
    for one; a store call is a request and an answer from the calling thread (the step's
    cost is ``fsdp step overhead`` in ``python -m benchmarks fsdp``). Why a store of the
    replica's own: it fails with the replica, as the shard group does, and never with the coordinator
    (whose restart a step survives by skipping, not by losing a replica).

    Round ``n`` is every process's ``n``-th call: each sets ``<n>/<shard>`` and reads every
    shard's key of round ``n`` (waiting for them); its key of round ``n - 1`` is deleted then,
    off the step's path, since every process has read round ``n - 1`` before it sets round
    ``n``. A process whose peers do not come within ``timeout_s`` (dead, as a lost replica's
    are) gets a ``RuntimeError`` naming them, as a shard group's operation would.

    ``close`` (``HSDPMesh.close``, or an exit hook if the program did not) stops the janitor's
    thread, bounded: one still in a store call as the interpreter shuts down aborts the process.
    """

    def __init__(self, store: Any, janitor_store: Any, shard: int, shards: int) -> None:
        self.shard = shard
        self.shards = shards
        self._store = store
        self._janitor = Janitor(janitor_store)
        self._round = 0
        atexit.register(_close_exchange_at_exit, weakref.ref(self))

    def close(self, timeout: float = CLOSE_WAIT_S) -> bool:
        """Stop the janitor's thread and wait up to ``timeout`` s for it: True if it ended."""
        if self._janitor.close(timeout):
            return True
        log.warning("shard %d: the exchange's janitor is still in a store call", self.shard)
        return False

    @classmethod
    def open(
        cls, rendezvous: dist.Store, host: str, shard: int, shards: int, timeout_s: float
    ) -> ReplicaExchange:
        """Host (shard 0) or dial the replica's store; its address goes through
        ``rendezvous``, the replica's prefix of the coordinator's store."""
        timeout = timedelta(seconds=timeout_s)
        if shard == 0:
            store = TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=timeout)
            port = store.port
            rendezvous.set("exchange", f"{host} {port}")
        else:
            address = rendezvous.get("exchange").decode()  # waits for shard 0
            host, port_text = address.rsplit(" ", 1)
            port = int(port_text)
            store = TCPStore(host, port, is_master=False, timeout=timeout)
        janitor = TCPStore(host, port, is_master=False, timeout=timeout)
        return cls(store, janitor, shard, shards)

    def all_gather(self, row: torch.Tensor) -> torch.Tensor:
        """Every process's ``row`` (int64, the same length in all), shard by shard, as one
        flat tensor."""
        n = self._round
        self._round += 1
        keys = [f"fsdp-round/{n}/{s}" for s in range(self.shards)]
        self._store.set(keys[self.shard], row.to(torch.int64).contiguous().numpy().tobytes())
        try:
            values = self._store.multi_get(keys)
        except RuntimeError as exc:
            raise RuntimeError(
                f"shard {self.shard}: round {n} of the replica's exchange failed; "
                f"{self._absent(keys)}: {exc}"
            ) from exc
        if n > 0:
            self._janitor.forget(f"fsdp-round/{n - 1}/{self.shard}")
        return torch.frombuffer(bytearray(b"".join(values)), dtype=torch.int64)

    def _absent(self, keys: list[str]) -> str:
        try:
            absent = [s for s, key in enumerate(keys) if not self._store.check([key])]
        except RuntimeError:
            return "the replica's store (shard 0's process) is unreachable"
        return f"shards {absent} never came" if absent else "every shard came"


@dataclass(frozen=True)
class HSDPMesh:
    """A 2-D mesh ``("replicate", "shard")``, its two groups, and the replica's exchange."""

    device_mesh: DeviceMesh
    replicate: ReplicateGroup
    shard_group: dist.ProcessGroup
    replica: int
    replicas: int
    shard: int
    shards: int
    exchange: ReplicaExchange

    def close(self, timeout: float = CLOSE_WAIT_S) -> bool:
        """Stop the exchange's thread (``ReplicaExchange.close``): True if it ended in time."""
        return self.exchange.close(timeout)


def _close_exchange_at_exit(ref: weakref.ref[ReplicaExchange]) -> None:
    """Close an exchange the program left open (its thread must end before the interpreter)."""
    exchange = ref()
    if exchange is not None:
        exchange.close()


def hsdp_mesh(
    agent: Any,
    *,
    shards: int,
    shard: int,
    replica_id: str,
    timeout_s: float = 60.0,
) -> HSDPMesh:
    """The HSDP mesh of this process: ``agent``'s foldplane group × its replica's shard group.

    ``agent`` is a started ``Agent`` of the group of shard index ``shard`` (its rank is the
    replica's index). The shard group is built on the coordinator's store under
    ``replica_id``, which the ``shards`` processes of one replica share (and a replacement
    replica gets anew); it rendezvouses with them, so all of them call this together.
    Makes the default group (the global numbering) if there is none.
    """
    if not 0 <= shard < shards:
        raise ValueError(f"shard {shard} is out of range for {shards} shards")
    agent.wait_for_view(timeout=timeout_s)
    plane = _data_plane(agent, timeout_s)
    elastic = plane.process_group()
    replicas, replica = elastic.size(), elastic.rank()
    _ensure_world(replica * shards + shard, replicas * shards)
    shard_ranks = [replica * shards + i for i in range(shards)]
    rendezvous = _replica_rendezvous(plane, replica_id, timeout_s)
    # The shard group's ops wait for the slowest shard's view changes: a generous backstop.
    replica_timeout_s = max(timeout_s, 4 * plane.collective_timeout_s)
    shard_group = plain_group(
        plane.kind.create(rendezvous, shard, shards, replica_timeout_s), rendezvous, shard, shards
    )
    exchange = ReplicaExchange.open(
        rendezvous, plane.gloo_hostname, shard, shards, replica_timeout_s
    )
    device_type = plane.kind.primary_device_type  # cuda for an explicit "nccl" agent
    shard_backend = plane.kind.backend_name(device_type)
    register_group(shard_group, shard_backend, f"hsdp/{replica_id}/shard", shard_ranks)
    replicate = ReplicateGroup(elastic)
    register_group(
        replicate,
        elastic.getBackendName(),
        f"hsdp/{agent.group}/replicate",
        [r * shards + shard for r in range(replicas)],
    )
    mesh = torch.arange(replicas * shards, dtype=torch.int).view(replicas, shards)
    device_mesh = DeviceMesh.from_group(
        [replicate, shard_group],
        device_type,
        mesh=mesh,
        mesh_dim_names=("replicate", "shard"),
    )
    return HSDPMesh(device_mesh, replicate, shard_group, replica, replicas, shard, shards, exchange)


def _data_plane(agent: Any, timeout_s: float) -> DataPlane:
    """The agent's data plane, once connected (``agent.process_group()`` would also register
    the group with torch as the default group, which here is the numbering one)."""
    deadline = time.monotonic() + timeout_s
    while agent.data_plane is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {agent.rank}: no data plane after {timeout_s} s")
        time.sleep(0.05)
    return cast(DataPlane, agent.data_plane)


def _ensure_world(rank: int, size: int) -> None:
    if dist.is_initialized():
        if (dist.get_rank(), dist.get_world_size()) != (rank, size):
            raise ValueError(
                f"the default group is rank {dist.get_rank()} of {dist.get_world_size()}; "
                f"the HSDP mesh needs rank {rank} of {size} (replica * shards + shard)"
            )
        return
    if WORLD_BACKEND not in dist.Backend.backend_list:
        dist.Backend.register_backend(
            WORLD_BACKEND, lambda _store, r, n, _timeout: _World(r, n), devices=["cpu", "cuda"]
        )
    dist.init_process_group(WORLD_BACKEND, store=dist.HashStore(), rank=rank, world_size=size)


def _replica_rendezvous(plane: DataPlane, replica_id: str, timeout_s: float) -> dist.Store:
    """The replica's prefix of the coordinator's store, where its fixed shard group (a plain
    backend of the data plane's kind) and its exchange meet."""
    host, port = plane.store_address
    client = TCPStore(
        host, port, is_master=False, timeout=timedelta(seconds=timeout_s), wait_for_workers=False
    )
    return PrefixStore(f"foldplane-hsdp/{replica_id}/", client)


def plain_group(backend: Any, store: dist.Store, rank: int, size: int) -> dist.ProcessGroup:
    """A ``dist.ProcessGroup`` over a gloo or NCCL ``backend`` (``dist.*`` calls reach it)."""
    gloo = isinstance(backend, dist.ProcessGroupGloo)
    kind = dist.ProcessGroup.BackendType.GLOO if gloo else dist.ProcessGroup.BackendType.NCCL
    group = dist.ProcessGroup(store, rank, size)
    group._set_default_backend(kind)
    group._register_backend(torch.device("cpu" if gloo else "cuda"), kind, backend)
    return group


def register_group(pg: dist.ProcessGroup, backend: str, name: str, global_ranks: list[int]) -> None:
    """Make ``pg`` known to torch (``dist.*(group=pg)``, DeviceMesh) with its global ranks
    (``global_ranks[i]`` is the group's rank ``i``), under the unique ``name``."""
    from torch.distributed import distributed_c10d as c10d

    pg._set_group_name(name)
    config = f"{'cuda' if backend == 'nccl' else 'cpu'}:{backend}"
    ranks = {g: i for i, g in enumerate(global_ranks)}
    if hasattr(c10d, "_register_pg_in_world"):  # torch >= 2.13
        c10d._register_pg_in_world(
            pg,
            backend_name=backend,
            store=dist.HashStore(),
            group_name=name,
            backend_config=config,
            rank_mapping=ranks,
            add_to_default_tag=True,
        )
        return
    # torch 2.11 and 2.12 have no helper: the same tables, as their new_group fills them
    world = c10d._world
    world.pg_map[pg] = (backend, dist.HashStore())
    world.pg_names[pg] = name
    c10d._register_process_group(name, pg)
    world.pg_backend_config[pg] = config
    world.pg_group_ranks[pg] = ranks
    tag = f"ptd:{name}"
    world.tags_to_pg.setdefault("", []).append(pg)
    world.tags_to_pg.setdefault(tag, []).append(pg)
    world.pg_to_tag[pg] = tag


class ElasticFSDP(ElasticStep):
    """A ``fully_shard``-ed module on an ``HSDPMesh``, trained step by agreed step.

    Wraps the module (``model(x)`` calls it; ``module`` is the FSDP module). ``name`` keeps
    the store keys of two models of one group apart. ``committed_steps``, ``view_version``,
    ``members``, ``step_index`` and ``last_failed_ranks`` say where training stands, as in
    ``agent.ddp`` (the step is ``agent.elastic.ElasticStep``'s).
    """

    #: A move found while ``begin_step`` waits is made at the next step, once the processes of
    #: the replica have compared their views again (see ``begin_step``).
    moves_while_waiting = False

    def __init__(
        self,
        module: torch.nn.Module,
        mesh: HSDPMesh,
        *,
        name: str = "fsdp",
        inactive_wait_s: float = 1.0,
        view_wait_s: float | None = None,
    ) -> None:
        self.module = module
        self.mesh = mesh
        self.elastic = mesh.replicate.elastic
        # ``committed_steps``: steps this replica has committed (the same on every replica).
        self._init_step(self.elastic, f"fsdp/{name}", inactive_wait_s, view_wait_s)
        # The view installed when the last step ended, and whether the whole replica had one of
        # the same members then: the next ``begin_step`` starts from it, with no gather of its own.
        self._next: tuple[ViewGroup, bool] | None = None
        # Before FSDP's own pre-forward (prepend), which all-gathers the parameters: a heal
        # must land in the shards before they are gathered.
        module.register_forward_pre_hook(lambda _m, _a: self.begin_step(), prepend=True)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def parameters(self) -> Any:
        return self.module.parameters()

    # -- one step --------------------------------------------------------------------------------

    def begin_step(self) -> None:
        """Pin the view of the next step: move to a newer view (healing joiners) if there is one.

        A replica's processes move together: first they compare, through the replica's
        exchange, the members of the view each one's group had installed when the last step
        ended (exchanged with that step's decision in ``should_commit``, so a step costs no
        round of its own here; the first step exchanges them itself). If those differ (one
        shard index's group has committed a change that another's has not yet), none of them
        moves: each runs the step on the view it is in (a local step if it is in none), and the
        agreement skips or commits it as usual. Else the rules are ``agent.elastic``'s, one
        move per step (``moves_while_waiting`` is False): a process leaves its old view and
        heals into the new one (``sync_state``); after a failed view it waits up to
        ``view_wait_s`` (the collective timeout by default) for the next one and runs this step
        on the failed view (skipped); an inactive process waits up to ``inactive_wait_s`` to be
        activated and runs a local step, never committed. A move found while waiting is made at
        the next step, after the replica has compared again.

        Why: a heal is a collective with the other replicas, and the step's shard-group
        collectives wait for every process of the replica. A process that healed into a view
        its shard peer had not seen yet waited for that peer's step, while the other replica's
        process it was healing with waited in turn for its own shard peer: a cycle that ended
        only at the collective timeout, and left the views failed with nobody dead.
        """
        if self._in_step:
            return
        plane = self._plane
        current = plane.view_for_op("begin_step")  # raises on a closed plane
        if self._next is not None:  # compared at the end of the last step
            current, sees = self._next
            self._next = None
        else:
            sees = self._replica_sees(current)
        if not sees:
            held = self._view if self._view is not None and self._view.failure is None else None
            self._start(held)  # the replica compares again at the next step
            return
        self._begin(current)

    def _replica_sees(self, view: ViewGroup) -> bool:
        """True if every process of this replica has installed a view of the same members."""
        rows = self.mesh.exchange.all_gather(self._members_row(view.members))
        rows = rows.view(self.mesh.shards, -1)
        return bool((rows == rows[0]).all())

    def _members_row(self, members: tuple[int, ...]) -> torch.Tensor:
        """``members`` as a row of one flag per replica, for comparing across the shard group."""
        row = torch.zeros(self.mesh.replicas, dtype=torch.int64)
        row[list(members)] = 1
        return row

    # -- one step: ``ElasticStep``'s parts ---------------------------------------------------------

    def _heal_into(self, view: ViewGroup) -> bool:
        steps = sync_state(self.elastic, view, self.committed_steps, self)
        if steps is None:
            return False
        self.committed_steps = steps
        return True

    def _pin(self, view: ViewGroup | None) -> None:
        self.mesh.replicate.pin(view)

    def _collectives_outcome(self, view: ViewGroup | None) -> tuple[bool, list[Work]]:
        replicate = self.mesh.replicate
        ok = view is not None and replicate.ok and all(w.wait() for w in replicate.works)
        works = replicate.works
        replicate.pin(None)
        return ok, works

    def _decide(self, view: ViewGroup | None, agreed: bool) -> bool:
        """The replica steps only if the group of every shard index committed the step, on
        views of the same members (else a replica could step in one group and not another).
        The same exchange carries the members of the view each process has installed now, for
        the next step's comparison (``begin_step``)."""
        replicas = self.mesh.replicas
        installed = self._plane.view_for_op("should_commit")
        mine = torch.cat(
            (
                torch.tensor([int(agreed)], dtype=torch.int64),
                self._members_row(() if view is None else view.members),
                self._members_row(installed.members),
            )
        )
        rows = self.mesh.exchange.all_gather(mine).view(self.mesh.shards, -1)
        step_rows, next_rows = rows[:, : 1 + replicas], rows[:, 1 + replicas :]
        self._next = (installed, bool((next_rows == next_rows[0]).all()))
        return bool(step_rows[:, 0].all()) and bool((step_rows == step_rows[0]).all())

    def _say_skipped(self, view: ViewGroup) -> None:
        log.warning(
            "rank %d (shard %d): step %d of view %d skipped on every replica",
            self._plane.rank,
            self.mesh.shard,
            self._index - 1,
            view.version,
        )

    # -- healing: this process's shards ----------------------------------------------------------

    def state_for_healing(self) -> dict[str, Any]:
        """This process's shards of the parameters and of every attached optimizer's state."""
        return {
            "params": [_local(p) for p in self.module.parameters()],
            "optimizers": [_local_state(o.state_dict()) for o in self._optimizers],
        }

    def load_healed_state(self, state: dict[str, Any]) -> None:
        params = list(self.module.parameters())
        if len(state["params"]) != len(params):
            raise ValueError(
                f"the healing member sent {len(state['params'])} parameters, "
                f"this rank has {len(params)}"
            )
        with torch.no_grad():
            for p, shard in zip(params, state["params"], strict=True):
                _local(p).copy_(shard)
        if len(state["optimizers"]) != len(self._optimizers):
            raise ValueError(
                f"the healing member has {len(state['optimizers'])} optimizer(s) attached, "
                f"this rank {len(self._optimizers)}"
            )
        for optimizer, saved in zip(self._optimizers, state["optimizers"], strict=True):
            owned = [p for g in optimizer.param_groups for p in g["params"]]
            optimizer.load_state_dict(_dtensor_state(saved, owned))


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t.detach()


def _local_state(state_dict: dict[str, Any]) -> dict[str, Any]:
    """An optimizer's state dict with each DTensor replaced by ``(_DTENSOR, local shard)``."""
    state = {
        index: {
            k: (_DTENSOR, v.to_local()) if isinstance(v, DTensor) else v for k, v in per.items()
        }
        for index, per in state_dict["state"].items()
    }
    return {**state_dict, "state": state}


def _dtensor_state(state_dict: dict[str, Any], params: list[torch.Tensor]) -> dict[str, Any]:
    """The inverse of ``_local_state``: each shard becomes a DTensor laid out like its param."""

    def back(v: Any, p: torch.Tensor) -> Any:
        if isinstance(v, tuple) and len(v) == 2 and v[0] == _DTENSOR:
            assert isinstance(p, DTensor)
            return DTensor.from_local(
                v[1], p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride()
            )
        return v

    state = {
        index: {k: back(v, params[int(index)]) for k, v in per.items()}
        for index, per in state_dict["state"].items()
    }
    return {**state_dict, "state": state}


def environment() -> tuple[str, int, int]:
    """``(replica_id, shard, shards)`` from ``FOLDPLANE_REPLICA_ID``/``_SHARD``/``_SHARDS``."""
    missing = [n for n in (REPLICA_ID_ENV, SHARD_ENV, SHARDS_ENV) if not os.environ.get(n)]
    if missing:
        raise ValueError(f"an HSDP process needs {', '.join(missing)} in its environment")
    return os.environ[REPLICA_ID_ENV], int(os.environ[SHARD_ENV]), int(os.environ[SHARDS_ENV])


__all__ = [
    "REPLICA_ID_ENV",
    "SHARDS_ENV",
    "SHARD_ENV",
    "ElasticFSDP",
    "HSDPMesh",
    "ReplicateGroup",
    "environment",
    "hsdp_mesh",
    "plain_group",
    "register_group",
]
