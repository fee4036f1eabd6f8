"""A worker for the ``torch.distributed`` tests: ``dist.init_process_group("foldplane")``.

The agent comes from the ``FOLDPLANE_*`` environment the launcher sets. Driven by one JSON
command per line on stdin; answers with one JSON event per line on stdout.

Commands: ``collectives`` (every ``dist.*`` call once, the results), ``sync_all_reduce`` (a
synchronous ``dist.all_reduce``: what it raised), ``async_all_reduce`` (Mooncake's snippet: the
hint), ``wait_view {active, min_version}``, ``close``.
"""

from __future__ import annotations

import json
import sys
import traceback
from typing import Any

import torch
import torch.distributed as dist

import foldplane.agent.dataplane  # noqa: F401  (registers the "foldplane" backend)
from foldplane.agent.dataplane import PeerFailure


def emit(event: str, **fields: Any) -> None:
    # one write per line (the newline with it): workers share a pipe, and with
    # PYTHONUNBUFFERED print() writes the newline apart, so lines could interleave
    print(json.dumps({"event": event, **fields}) + "\n", end="", flush=True)


def collectives(rank: int, world: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    out["all_reduce"] = t.tolist()
    t = torch.full((2,), float(rank + 1))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    out["all_reduce_max"] = t.tolist()
    b = torch.full((2,), float(rank * 10))
    dist.broadcast(b, src=world - 1)
    out["broadcast"] = b.tolist()
    gathered = [torch.zeros(2) for _ in range(world)]
    dist.all_gather(gathered, torch.full((2,), float(rank)))
    out["all_gather"] = [g.tolist() for g in gathered]
    flat = torch.zeros(world * 2)
    dist.all_gather_into_tensor(flat, torch.full((2,), float(rank + 1)))
    out["all_gather_into_tensor"] = flat.tolist()
    rs = torch.zeros(2)
    dist.reduce_scatter_tensor(rs, torch.arange(world * 2, dtype=torch.float32) + rank)
    out["reduce_scatter_tensor"] = rs.tolist()
    rs_list = torch.zeros(1)
    dist.reduce_scatter(rs_list, [torch.full((1,), float(rank + i)) for i in range(world)])
    out["reduce_scatter"] = rs_list.tolist()
    dist.barrier()
    if rank == 0:
        dist.send(torch.full((2,), 42.0), dst=1)
        out["recv"] = None
    elif rank == 1:
        got = torch.zeros(2)
        dist.recv(got, src=0)
        out["recv"] = got.tolist()
    work = dist.all_reduce(torch.ones(1), async_op=True)
    out["async_type"] = type(work).__name__
    out["async_ok"] = work.wait()
    out["rank"], out["world_size"] = dist.get_rank(), dist.get_world_size()
    out["backend"] = dist.get_backend()
    out["group_name_set"] = bool(dist.group.WORLD.group_name)
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import DeviceMesh

    mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
    out["mesh"] = [mesh.size(), mesh.get_rank()]
    reduced = funcol.all_reduce(torch.full((2,), float(rank + 1)), "sum", mesh)
    out["funcol_all_reduce"] = funcol.wait_tensor(reduced).tolist()
    out["split_group"] = split_group_outcome()
    return out


def split_group_outcome() -> str:
    """What ``dist.split_group`` does here: the error torch raises, or ``"split"``."""
    try:
        dist.split_group(split_ranks=[[r] for r in range(dist.get_world_size())])
    except (RuntimeError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "split"


def main() -> int:
    dist.init_process_group("foldplane")
    pg = dist.group.WORLD
    rank, world = dist.get_rank(), dist.get_world_size()
    emit("started", rank=rank, world_size=world, group_type=type(pg).__name__)
    agent = pg.agent
    for line in sys.stdin:
        cmd = json.loads(line)
        name = cmd["cmd"]
        try:
            if name == "collectives":
                emit(name, **collectives(rank, world))
            elif name == "sync_all_reduce":
                emit("issued", version=pg.version)
                try:
                    dist.all_reduce(torch.ones(4))
                except PeerFailure as exc:
                    emit(
                        name,
                        raised=type(exc).__name__,
                        message=str(exc),
                        failed=exc.failed_ranks,
                        is_runtime_error=isinstance(exc, RuntimeError),
                    )
                else:
                    emit(name, raised=None)
            elif name == "async_all_reduce":
                tensor = torch.ones(4)
                work = dist.all_reduce(tensor, async_op=True)
                work.wait()
                failed = pg.get_failed_ranks_hint(work)
                emit(name, ok=work.is_success(), hint=failed.tolist(), version=pg.version)
            elif name == "wait_view":
                view = agent.wait_for_view(
                    lambda v, c=cmd: (
                        v.version >= int(c.get("min_version", 1))
                        and (c.get("active") is None or list(v.active_ranks) == c["active"])
                    ),
                    timeout=60,
                )
                emit("view", version=view.version, active=list(view.active_ranks))
            elif name == "close":
                agent.close()
                emit("closed")
                return 0
        except Exception as exc:
            emit("error", cmd=name, error=f"{type(exc).__name__}: {exc}", tb=traceback.format_exc())
    agent.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
