"""Elastic HSDP on synthetic data: replicas of FSDP2 shards that survive losing a whole replica.

Start a coordinator, then one command per replica (on its own machine, in real life); each
starts the replica's ``--shards`` processes, one per shard index:

    python -m coordinator serve --db /tmp/train.db --port 8470 &
    for r in 0 1; do
        python examples/train_fsdp.py --coordinator http://127.0.0.1:8470 --group hsdp \\
            --replicas 2 --shards 2 --replica $r --steps 40 --kill-replica 1 --kill-at 15 &
    done; wait

Each process trains a small transformer with ``fully_shard`` on a ("replicate", "shard") mesh:
the shard dimension is the replica's own gloo group, the replicate dimension the foldplane
group ``hsdp-s<shard>`` (one per shard index, a rank per replica). Both processes of replica 1
SIGKILL themselves at step 15 (after the backward pass, before the step is agreed): the other
replica skips that step and trains on alone. Replica 1's command sees its processes die, and
(``--replace``, on by default) starts a replacement replica: new processes, a new shard group,
which ask to be activated and, entering the view, receive each shard's parameters and Adam
state from the same shard of the surviving replica. Training goes on past ``--steps`` until a
step has been committed by both replicas together; then every process stops at that same step
and prints the digest of its shards: the same for the same shard index on every replica.

Compared with an FSDP2 script, the lines that change are marked ``# foldplane``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import hashlib
import os
import signal
import subprocess
import sys
import time
import uuid

import torch
from torch.distributed.fsdp import FSDPModule, fully_shard

from foldplane.agent import Agent  # foldplane
from foldplane.agent.ddp import ElasticOptimizer  # foldplane
from foldplane.agent.fsdp import (  # foldplane
    REPLICA_ID_ENV,
    SHARD_ENV,
    SHARDS_ENV,
    ElasticFSDP,
    hsdp_mesh,
)


class TinyTransformer(torch.nn.Module):
    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(8, dim)
        self.layers = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(dim, 4, 2 * dim, dropout=0.0, batch_first=True)
            for _ in range(2)
        )
        self.head = torch.nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h).sum(dim=-1)


def synthetic_batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Global rank ``rank``'s batch of step ``step``: a fixed smooth function of the sequence."""
    g = torch.Generator().manual_seed(7919 * step + rank)
    x = torch.randn(8, 12, 8, generator=g)
    return x, torch.tanh(x.sum(dim=-1) / 3) + 0.01 * torch.randn(8, 12, generator=g)


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        t = p.to_local().detach().contiguous()
        h.update(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()))
    return h.hexdigest()[:16]


def train(args: argparse.Namespace) -> int:
    shard, shards = int(os.environ[SHARD_ENV]), int(os.environ[SHARDS_ENV])
    fp_agent = Agent().start(timeout_s=120)  # foldplane: the group of this shard index
    replica = fp_agent.rank
    fp_agent.wait_for_view(timeout=120)
    if not fp_agent.is_active():  # foldplane: a replacement asks to be activated
        fp_agent.wait_for_state("HEALTHY", timeout=120)
        fp_agent.activate_ranks([replica])
    mesh = hsdp_mesh(fp_agent, shards=shards, shard=shard, replica_id=os.environ[REPLICA_ID_ENV])

    torch.manual_seed(replica)  # deliberately different: the first step shares replica 0's
    model = TinyTransformer()
    for layer in model.layers:
        fully_shard(layer, mesh=mesh.device_mesh)
    fully_shard(model, mesh=mesh.device_mesh)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_force_sum_reduction_for_comms(True)  # gloo has no AVG
    model = ElasticFSDP(model, mesh)  # foldplane
    opt = ElasticOptimizer(model, torch.optim.AdamW(model.parameters(), lr=args.lr))  # foldplane

    # Stop on what every process of this replica knows alike: steps committed (a replica
    # commits as a whole) and the members of the last committed step (the same for its shards).
    first, losses, skipped, iterations, everyone = None, [], 0, 0, False
    name = f"replica {replica} shard {shard}"
    while (model.committed_steps < args.steps or not everyone) and iterations < args.max_steps:
        iterations += 1
        opt.zero_grad()
        model.begin_step()  # foldplane (optional): move to a newer view and heal first
        first = model.committed_steps if first is None else first
        x, y = synthetic_batch(replica * shards + shard, model.committed_steps)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        if replica == args.kill_replica and first == 0 and model.committed_steps == args.kill_at:
            print(f"{name}: SIGKILL at step {args.kill_at}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if opt.step():  # foldplane: False when the step failed somewhere (every replica skips)
            losses.append(loss.item())
            everyone = len(model.members) == mesh.replicas
            if model.committed_steps % 10 == 0:
                print(f"{name}: step {model.committed_steps} loss {loss.item():.4f}", flush=True)
        else:
            skipped += 1
            print(f"{name}: step skipped; hint {model.last_failed_ranks}", flush=True)
    print(
        f"{name}: done at step {model.committed_steps} (joined at {first}, {skipped} skipped); "
        f"loss {losses[0]:.4f} -> {losses[-1]:.4f}; shards {digest(model.module)}",
        flush=True,
    )
    fp_agent.close()
    return 0


def run_replica(args: argparse.Namespace) -> int:
    """Start the replica's processes; when one dies, the replica is lost: stop the rest, and
    start a replacement replica (new processes, a new id) if ``--replace``."""
    from foldplane.agent.client import CoordinatorClient, CoordinatorError

    client = CoordinatorClient(args.coordinator)
    for shard in range(args.shards):
        client.create_group(f"{args.group}-s{shard}", args.replicas)
    lives = 1 + int(args.replace)
    for life in range(lives):
        replica_id = uuid.uuid4().hex
        procs, incarnations = [], []
        for shard in range(args.shards):
            env = {k: v for k, v in os.environ.items() if not k.startswith("FOLDPLANE_")}
            env.update(
                FOLDPLANE_COORDINATOR=args.coordinator,
                FOLDPLANE_GROUP=f"{args.group}-s{shard}",
                FOLDPLANE_RANK=str(args.replica),
                FOLDPLANE_INCARNATION=(incarnation := uuid.uuid4().hex),
                **{REPLICA_ID_ENV: replica_id, SHARD_ENV: str(shard), SHARDS_ENV: str(args.shards)},
            )
            argv = sys.argv[1:] if life == 0 else [*sys.argv[1:], "--replacement"]
            procs.append(subprocess.Popen([sys.executable, __file__, *argv], env=env))
            incarnations.append(incarnation)
        while True:
            codes = [p.poll() for p in procs]
            if all(c == 0 for c in codes):
                return 0
            if any(c not in (None, 0) for c in codes):
                break
            time.sleep(0.2)
        print(f"replica {args.replica}: a process ended ({codes}); the replica is lost", flush=True)
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for shard, incarnation in enumerate(incarnations):  # no need to wait for heartbeats
            with contextlib.suppress(CoordinatorError):  # 409: known already
                client.report_death(f"{args.group}-s{shard}", args.replica, incarnation)
    return 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--coordinator", default="http://127.0.0.1:8470")
    p.add_argument("--group", default="hsdp", help="the groups are <group>-s<shard>")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--replica", type=int, default=0, help="the replica this command runs")
    p.add_argument("--steps", type=int, default=40, help="train until this many steps committed")
    p.add_argument("--max-steps", type=int, default=400, help="stop anyway after this many")
    p.add_argument("--kill-replica", type=int, default=None, help="this replica SIGKILLs itself")
    p.add_argument("--kill-at", type=int, default=15, help="...once this many steps committed")
    p.add_argument("--replace", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--replacement", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--lr", type=float, default=0.003)
    args = p.parse_args()
    if args.replacement:
        args.kill_replica = None
    return train(args) if os.environ.get(SHARD_ENV) else run_replica(args)


if __name__ == "__main__":
    raise SystemExit(main())
