"""Elastic DDP on synthetic data: a worker that survives a peer's SIGKILL and heals a replacement.

Start a coordinator, then 4 workers under the launcher (which starts a replacement for a worker
that dies):

    python -m coordinator serve --db /tmp/train.db --port 8470 &
    python -m agent.launch --coordinator http://127.0.0.1:8470 --group train --world-size 4 \\
        --nproc 4 --replace-failed examples/train_ddp.py --steps 60 --kill-rank 2 --kill-at 20

Rank 2 SIGKILLs itself at step 20. The survivors skip the step that failed, carry on in a view
without it, and keep training; the launcher reports the death and starts a replacement, which
asks to be activated and, entering the view, receives the model and the optimizer state from a
survivor. Training goes on past step 60 until a step has been committed by all 4 ranks together
(waiting at most ``--wait-s`` seconds for that); then every rank stops at that same step and
prints the digest of its parameters: the same on all.

Compared with a torch DDP script, the lines that change are marked ``# foldplane``.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import signal
import time

import torch
import torch.distributed as dist

import agent.dataplane  # noqa: F401  # foldplane: registers the "foldplane" backend
from agent.ddp import DistributedDataParallel, ElasticOptimizer  # foldplane


def synthetic_batch(rank: int, step: int, size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s shard of step ``step``: y = a fixed random linear map of x, plus noise."""
    g = torch.Generator().manual_seed(7919 * step + rank)
    x = torch.randn(size, 16, generator=g)
    w = torch.linspace(-1.0, 1.0, 16 * 4).reshape(16, 4)
    return x, torch.tanh(x @ w) + 0.01 * torch.randn(size, 4, generator=g)


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        t = p.detach().contiguous()
        h.update(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()))
    return h.hexdigest()[:16]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=60, help="train until this many steps committed")
    p.add_argument("--kill-rank", type=int, default=None, help="this rank SIGKILLs itself...")
    p.add_argument("--kill-at", type=int, default=20, help="...once this many steps committed")
    p.add_argument(
        "--wait-s",
        type=float,
        default=120.0,
        help="past --steps, how long to train on for every rank to be back, then stop anyway",
    )
    p.add_argument("--lr", type=float, default=0.01)
    args = p.parse_args()

    dist.init_process_group("foldplane")  # foldplane: instead of "gloo"/"nccl"
    rank = dist.get_rank()
    fp_agent = dist.group.WORLD.agent  # foldplane: the coordinator's view of this rank
    if rank not in fp_agent.view.active_ranks:  # foldplane: a replacement asks to be activated
        fp_agent.wait_for_state("HEALTHY", timeout=120)
        proposal = fp_agent.activate_ranks([rank])
        if proposal.get("status") not in ("applied", "applied_with_dropped_ranks"):
            print(f"rank {rank}: not activated ({proposal}); leaving", flush=True)
            fp_agent.close()
            return 0

    torch.manual_seed(rank)  # deliberately different: the first step shares rank 0's weights
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    model = DistributedDataParallel(model)  # foldplane: agent.ddp's, on the default group
    opt = ElasticOptimizer(model, torch.optim.AdamW(model.parameters(), lr=args.lr))  # foldplane

    world, give_up_at = dist.get_world_size(), None
    first, losses, skipped = None, [], 0
    while model.committed_steps < args.steps or len(model.members) < world:
        if model.committed_steps >= args.steps:  # done, but not every rank is back yet
            give_up_at = give_up_at or time.monotonic() + args.wait_s
            if time.monotonic() > give_up_at:
                break
        opt.zero_grad()
        model.begin_step()  # foldplane (optional): move to a newer view and heal before reading
        first = model.committed_steps if first is None else first
        x, y = synthetic_batch(rank, model.committed_steps)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        if opt.step():  # foldplane: False when the step failed on some member (all skip it)
            losses.append(loss.item())
            if model.committed_steps % 10 == 0:
                print(
                    f"rank {rank}: step {model.committed_steps} loss {loss.item():.4f} "
                    f"view {model.view_version} members {list(model.members)}",
                    flush=True,
                )
        else:
            skipped += 1
            print(f"rank {rank}: step skipped; hint {model.last_failed_ranks}", flush=True)
        if rank == args.kill_rank and first == 0 and model.committed_steps == args.kill_at:
            print(f"rank {rank}: SIGKILL at step {args.kill_at}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    print(
        f"rank {rank}: done at step {model.committed_steps} (joined at {first}, {skipped} "
        f"skipped); loss {losses[0]:.4f} -> {losses[-1]:.4f}; params {digest(model.module)}",
        flush=True,
    )
    fp_agent.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
