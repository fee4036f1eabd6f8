"""An unchanged torch script: ``init_process_group("gloo")`` from torchrun's variables, one
all-reduce, one JSON line (``rank``, ``world``, ``sum``, ``master``), a clean end. Nothing of
foldplane in it: the launcher's ``MASTER_ADDR``/``MASTER_PORT`` are what let it run."""

import json
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(4) * (dist.get_rank() + 1)
dist.all_reduce(t)
master = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
line = {"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": t[0].item()}
# one write per line (the newline with it): workers share a pipe, and with
# PYTHONUNBUFFERED print() writes the newline apart, so lines could interleave
print(json.dumps({**line, "master": master}) + "\n", end="", flush=True)
dist.destroy_process_group()
