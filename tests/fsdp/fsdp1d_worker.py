"""A worker for the one-dimensional FSDP test: ``fully_shard`` over the whole foldplane group.

``dist.init_process_group("foldplane")`` from the launcher's environment, then
``init_device_mesh("cpu", (world_size,))`` (and ``DeviceMesh.from_group`` on the default
group: the same ranks), a float64 MLP sharded over it, Adam, ``steps`` steps on per-rank
batches; after each step one ``step`` event with this rank's shards of the parameters (dim 0,
in rank order: the parameters are their concatenation) and its batch seed. (``full_tensor()``
is not used: DTensor's redistribution goes through C++ functional collectives, whose
``all_gather_into_tensor`` does not reach a Python process group: "No backend type
associated with device type cpu".)
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard

import foldplane.agent.dataplane  # noqa: F401  (registers the "foldplane" backend)

IN, HIDDEN, BATCH = 4, 8, 6


def make_model() -> torch.nn.Module:
    torch.manual_seed(7)
    return torch.nn.Sequential(
        torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, 1)
    ).double()


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(BATCH, IN, generator=g, dtype=torch.float64)
    return x, x.sum(dim=1, keepdim=True).sin()


def emit(event: str, **fields: Any) -> None:
    # one write per line (the newline with it): workers share a pipe, and with
    # PYTHONUNBUFFERED print() writes the newline apart, so lines could interleave
    print(json.dumps({"event": event, **fields}) + "\n", end="", flush=True)


def main() -> int:
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    dist.init_process_group("foldplane")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    same = DeviceMesh.from_group(dist.group.WORLD, "cpu")
    emit("mesh", ranks=mesh.mesh.tolist(), from_group=same.mesh.tolist(), size=mesh.size())
    model = make_model()
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    for step in range(steps):
        seed = 1000 * rank + step
        opt.zero_grad()
        x, y = batch(seed)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        shards = [p.to_local().tolist() for p in model.parameters()]
        emit("step", step=step, seed=seed, shards=shards)
    dist.barrier()
    dist.group.WORLD.agent.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
