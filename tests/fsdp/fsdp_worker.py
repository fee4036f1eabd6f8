"""A worker for the elastic HSDP tests: one shard of one replica of a small transformer.

Started by the launcher with ``FOLDPLANE_REPLICA_ID``, ``FOLDPLANE_SHARD`` and
``FOLDPLANE_SHARDS`` set; its agent's group is its shard index's, its rank the replica's.
Driven by one JSON command per line on stdin, one JSON event per line on stdout. Commands:
``steps {n | until} [with_rank] [die_at] [stall_s, stall_steps]`` (as
``tests/agent/ddp_worker.py``: n steps, or steps until ``until`` are committed, and on until a
committed step had replica ``with_rank`` among its members; one ``step`` event each; with
``die_at`` the process SIGKILLs itself after the backward pass of the first step begun with
``die_at`` steps committed, before it votes; the first ``stall_steps`` steps sleep ``stall_s``
before the forward pass, in the training thread only: a gray failure, alive but not stepping),
``activate_self``, ``close``.

A ``step`` event carries the digests of this process's parameter shards and optimizer state
after the step: the same on every replica for the same shard index.

With ``GPU_TEST_DEVICE=cuda:0`` (the GPU suite, ``tests/gpu``) the model is sharded on that GPU:
the shard group and the replicas' all-reduce run on NCCL, several processes sharing the GPU as
``tests/gpu/worker.py`` describes.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import signal
import sys
import time
import traceback
from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule, fully_shard

from foldplane.agent import Agent
from foldplane.agent.ddp import ElasticOptimizer
from foldplane.agent.fsdp import ElasticFSDP, environment, hsdp_mesh

DIM, SEQ, BATCH = 16, 6, 4
#: the GPU suite's device (None: the CPU, gloo)
GPU = os.environ.get("GPU_TEST_DEVICE") or None


class TinyTransformer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(4, DIM)
        self.layers = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(DIM, 2, 32, dropout=0.0, batch_first=True)
            for _ in range(2)
        )
        self.head = torch.nn.Linear(DIM, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h).sum(dim=-1)  # not a view: FSDP hooks the output


def make_model(seed: int, mesh: Any) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = TinyTransformer()
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_force_sum_reduction_for_comms(True)  # gloo has no AVG
    return model


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(BATCH, SEQ, 4, generator=g)
    return x, x.sum(dim=-1).sin()


def digest(tensors: list[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in tensors:
        c = (t.to_local() if hasattr(t, "to_local") else t).detach().cpu().contiguous()
        h.update(ctypes.string_at(c.data_ptr(), c.numel() * c.element_size()))
    return h.hexdigest()


def optimizer_tensors(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    out = []
    for group in opt.param_groups:
        for p in group["params"]:
            for _key, value in sorted(opt.state.get(p, {}).items()):
                out.append(value if torch.is_tensor(value) else torch.tensor(float(value)))
    return out


def emit(event: str, **fields: Any) -> None:
    # one write per line (the newline with it): workers share a pipe, and with
    # PYTHONUNBUFFERED print() writes the newline apart, so lines could interleave
    print(json.dumps({"event": event, **fields}) + "\n", end="", flush=True)


def main() -> int:
    timeout_s = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    replica_id, shard, shards = environment()
    gpu: dict[str, Any] = {}
    if GPU is not None:
        from tests.gpu.worker import share_gpu

        share_gpu(int(os.environ["RANK"]), os.environ["FOLDPLANE_INCARNATION"])
        gpu = {"backend": "nccl", "device": GPU}
    agent = Agent(
        heartbeat_interval_s=0.25, collective_timeout_s=timeout_s, p2p_timeout_s=timeout_s, **gpu
    ).start()
    replica = agent.rank
    mesh = hsdp_mesh(agent, shards=shards, shard=shard, replica_id=replica_id)
    # Every replica initialises differently: the first view heals them to replica 0's.
    model = ElasticFSDP(make_model(1000 + replica, mesh.device_mesh), mesh)
    opt = ElasticOptimizer(model, torch.optim.Adam(model.parameters(), lr=0.01))  # type: ignore[arg-type]
    emit("started", replica=replica, shard=shard, incarnation=agent.incarnation)
    iteration = 0
    for line in sys.stdin:
        cmd = json.loads(line)
        name = cmd["cmd"]
        try:
            if name == "steps":
                n, until, with_rank = cmd.get("n"), cmd.get("until"), cmd.get("with_rank")
                done = 0
                joined = with_rank is None
                while (
                    (n is not None and done < n)
                    or (until is not None and model.committed_steps < until)
                    or not joined
                ):
                    done += 1
                    iteration += 1
                    seed = 100_000 * (replica * shards + shard) + iteration
                    opt.zero_grad()
                    x, y = batch(seed)
                    if GPU is not None:
                        x, y = x.to(GPU), y.to(GPU)
                    if done <= cmd.get("stall_steps", 0):
                        model.begin_step()  # the view is pinned: the stall is on it
                        time.sleep(cmd["stall_s"])
                    loss = torch.nn.functional.mse_loss(model(x), y)
                    loss.backward()
                    if cmd.get("die_at") is not None and model.committed_steps >= cmd["die_at"]:
                        os.kill(os.getpid(), signal.SIGKILL)
                    committed = opt.step()
                    joined = joined or (committed and with_rank in model.members)
                    emit(
                        "step",
                        committed=committed,
                        version=model.view_version,
                        members=list(model.members),
                        steps=model.committed_steps,
                        index=model.step_index,
                        iteration=iteration,
                        loss=loss.item(),
                        params=digest(list(model.parameters())),
                        optim=digest(optimizer_tensors(opt.optimizer)),
                        failed=[] if committed else model.last_failed_ranks,
                        t=time.time(),
                    )
                emit("steps_done", steps=model.committed_steps)
            elif name == "activate_self":
                agent.wait_for_state("HEALTHY", timeout=60)
                proposal = agent.activate_ranks([replica])
                emit("proposal", status=proposal.get("status"), version=proposal.get("version"))
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
