"""A worker whose group is registered with ``torch.distributed`` (``c10d.adopt``), so that
torch's own callers reach it: functional collectives, DTensor, the coalescing manager,
``batch_isend_irecv``. Each command runs one caller and answers plain values."""

from __future__ import annotations

from multiprocessing.connection import Connection
from typing import Any

import torch
import torch.distributed as dist

from tests.dataplane import worker


def main(
    conn: Connection,
    rank: int,
    world_size: int,
    port: int,
    incarnation: str,
    options: dict[str, Any],
) -> None:
    worker.serve(
        conn, rank, world_size, port, incarnation, options,
        commands={"adopt": adopt, "call": call},
    )  # fmt: skip


def adopt(pg: Any, _conn: Connection) -> str:
    from foldplane.agent.dataplane import c10d

    c10d.adopt(pg)
    return pg.group_name


def call(pg: Any, _conn: Connection, name: str) -> Any:
    return CALLERS[name](pg, pg.rank(), pg.size())


def _funcol(pg: Any, rank: int, size: int) -> dict[str, list]:
    """Functional collectives: C++ ops that find the group by name and call its overrides."""
    import torch.distributed._functional_collectives as funcol

    gathered = funcol.all_gather_tensor(torch.full((2,), float(rank)), 0, pg)
    reduced = funcol.reduce_scatter_tensor(torch.arange(2.0 * size) + rank, "sum", 0, pg)
    swapped = funcol.all_to_all_single(torch.arange(float(size)) + 10 * rank, None, None, pg)
    return {
        "all_gather_tensor": funcol.wait_tensor(gathered).tolist(),
        "reduce_scatter_tensor": funcol.wait_tensor(reduced).tolist(),
        "all_to_all_single": funcol.wait_tensor(swapped).tolist(),
    }


def _dtensor(pg: Any, rank: int, size: int) -> dict[str, list]:
    """DTensor over a one-dimensional mesh of the group: its redistributions run on the C++
    functional collectives."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = DeviceMesh.from_group(pg, "cpu")
    whole = torch.arange(4.0 * size).view(2 * size, 2)
    rows = distribute_tensor(whole, mesh, [Shard(0)])
    columns = rows.redistribute(mesh, [Shard(1)])  # an all-to-all
    return {
        "full_tensor": rows.full_tensor().view(-1).tolist(),
        "replicated": rows.redistribute(mesh, [Replicate()]).to_local().view(-1).tolist(),
        "column_shard": columns.to_local().reshape(-1).tolist(),
    }


def _coalescing_manager(pg: Any, rank: int, size: int) -> dict[str, Any]:
    """torch's coalescing manager with a device: its start and end reach the group from C++."""
    ts = [torch.ones(2), torch.full((1,), float(rank))]
    with dist._coalescing_manager(group=pg, device=torch.device("cpu")):
        for t in ts:
            dist.all_reduce(t, group=pg)
    gathered = [torch.zeros(2 * size), torch.zeros(size)]
    with dist._coalescing_manager(group=pg, device=torch.device("cpu"), async_ops=True) as cm:
        for out, x in zip(gathered, [torch.full((2,), float(rank)), torch.ones(1)], strict=True):
            dist.all_gather_into_tensor(out, x, group=pg)
    cm.wait()
    return {
        "all_reduce": [t.tolist() for t in ts],
        "all_gather": [t.tolist() for t in gathered],
        "works": [type(w).__name__ for w in cm.works],
    }


def _batch_p2p(pg: Any, rank: int, size: int) -> dict[str, Any]:
    """A ring of sends and receives in one batch."""
    got = torch.zeros(2)
    ops = [
        dist.P2POp(dist.isend, torch.full((2,), float(rank)), (rank + 1) % size, group=pg),
        dist.P2POp(dist.irecv, got, (rank - 1) % size, group=pg),
    ]
    works = dist.batch_isend_irecv(ops)
    return {"waited": [w.wait() for w in works], "got": got.tolist()}


def _all_to_all(pg: Any, rank: int, size: int) -> dict[str, list]:
    outs = [torch.zeros(q + 1) for q in range(size)]  # from rank q: q + 1 values
    dist.all_to_all(outs, [torch.full((rank + 1,), 10.0 * rank + q) for q in range(size)], group=pg)
    single = torch.zeros(size)
    dist.all_to_all_single(single, torch.arange(float(size)) + 10 * rank, group=pg)
    return {"all_to_all": [t.tolist() for t in outs], "all_to_all_single": single.tolist()}


CALLERS = {
    "funcol": _funcol,
    "dtensor": _dtensor,
    "coalescing_manager": _coalescing_manager,
    "batch_isend_irecv": _batch_p2p,
    "all_to_all": _all_to_all,
}
