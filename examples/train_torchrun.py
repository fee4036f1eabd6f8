"""A plain torchrun training script: torch's DDP, nothing of foldplane in it.

It is the script docs/torchrun.md runs unchanged under ``torchrun --rdzv-backend foldplane``
(and under torch's own ``c10d``, for the benchmark's comparison):

    python -m coordinator serve --db /tmp/rdzv.db --port 8470 &
    torchrun --nnodes 1:4 --nproc-per-node 2 --max-restarts 3 \\
        --rdzv-backend foldplane --rdzv-endpoint http://127.0.0.1:8470 --rdzv-id job-1 \\
        examples/train_torchrun.py --steps 200 --checkpoint /tmp/job-1.pt

(on one machine, start a second torchrun with the same line for a second node, and give both
``--local-addr 127.0.0.1``). ``init_process_group`` reads torchrun's ``MASTER_ADDR``,
``MASTER_PORT``, ``RANK`` and ``WORLD_SIZE``; ``--backend`` is ``nccl`` where a GPU is seen,
else ``gloo``. Rank 0 saves a checkpoint (step, model, optimizer) after every step; a restarted
worker (torchrun's ``TORCHELASTIC_RESTART_COUNT`` > 0) resumes from it, so a worker's death
costs the steps since the last checkpoint, never the run.

Each step prints one JSON line (``rank``, ``world``, ``step``, ``restart``, ``pid``, ``t``,
``loss``), which the tests and the benchmark read.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--checkpoint", default=None, help="save and resume here (rank 0 saves)")
    p.add_argument("--backend", default="nccl" if torch.cuda.is_available() else "gloo")
    p.add_argument("--step-pause", type=float, default=0.0, help="seconds between steps")
    args = p.parse_args()

    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    if args.backend == "nccl":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    net.to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    step = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint, map_location=device)
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step = state["step"]
    model = DistributedDataParallel(
        net, device_ids=[device.index] if device.index is not None else None
    )

    while step < args.steps:
        g = torch.Generator().manual_seed(step * 1000 + rank)
        x = torch.randn(32, 16, generator=g).to(device)
        y = x.sum(dim=1, keepdim=True).to(device)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        step += 1
        if rank == 0 and args.checkpoint:
            tmp = f"{args.checkpoint}.tmp"
            state = {"step": step, "model": net.state_dict(), "optimizer": opt.state_dict()}
            torch.save(state, tmp)
            os.replace(tmp, args.checkpoint)
        line = {"rank": rank, "world": world, "step": step, "restart": restart}
        line |= {"pid": os.getpid(), "t": time.time(), "loss": round(loss.item(), 6)}
        # one write per line (the newline with it): workers share a pipe, and with
        # PYTHONUNBUFFERED print() writes the newline apart, so lines could interleave
        print(json.dumps(line) + "\n", end="", flush=True)
        if args.step_pause:
            time.sleep(args.step_pause)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
