"""One torchft replica group of one process, as torchft's users write it: torchft's ``Manager`` over
torch's native gloo group (``ProcessGroupGloo(..., enable_reconfigure=True)``, torch >= 2.14),
torchft's ``DistributedDataParallel``, a quorum per step and ``should_commit`` before the
optimizer steps (what torchft's ``OptimizerWrapper`` does), training a small model. It finds
its lighthouse through ``TORCHFT_LIGHTHOUSE``, as torchft's managers do.

``python -m tests.lighthouse.replica REPLICA STORE_HOST:PORT [--steps N] [--step-s S]``: the
native group rendezvouses on the job's store (one that outlives the replica groups); it prints
one JSON line per step it took part in: ``replica``, ``pid``, ``step`` (the manager's, after
the step), ``committed``, ``participants``, ``quorum_id``, ``healing`` (it was just healed),
``digest`` (of the model's parameters), ``t`` (wall clock).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from datetime import timedelta


def digest(model: object) -> str:
    import torch

    h = hashlib.sha256()
    for tensor in model.state_dict().values():  # type: ignore[attr-defined]
        h.update(tensor.detach().to(torch.float64).numpy().round(9).tobytes())
    return h.hexdigest()[:16]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("replica", type=int)
    p.add_argument("store", help="the job's store, HOST:PORT")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--step-s", type=float, default=0.05)
    args = p.parse_args(argv)

    import torch
    import torch.distributed as dist
    from torch import nn, optim
    from torchft import DistributedDataParallel, Manager

    host, _, port = args.store.rpartition(":")
    job_store = dist.TCPStore(host, int(port), is_master=False, wait_for_workers=False)
    native = dist.PrefixStore("native/0", job_store)
    pg = dist.ProcessGroup(native, args.replica, args.replicas)
    backend = dist.ProcessGroupGloo(native, args.replica, args.replicas, enable_reconfigure=True)
    pg._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    pg._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, backend)
    # the replica group's own store (its manager's address): it lives as long as the group
    own = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    inner = optim.SGD(model.parameters(), lr=0.05)

    def state_dict() -> dict[str, object]:
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    def load_state_dict(state: dict[str, dict[str, object]]) -> None:
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])

    manager = Manager(
        pg=pg,
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"train{args.replica}",
        store_addr="127.0.0.1",
        store_port=own.port,
        rank=0,
        world_size=1,
        hostname="127.0.0.1",
        use_async_quorum=False,
        timeout=timedelta(seconds=10),
        quorum_timeout=timedelta(seconds=60),
        connect_timeout=timedelta(seconds=10),
    )
    ddp = DistributedDataParallel(manager, model)
    loss_fn = nn.MSELoss()
    generator = torch.Generator().manual_seed(args.replica)
    healed_at = None
    try:
        while manager.current_step() < args.steps:
            before = manager.current_step()
            manager.start_quorum()  # heals this replica group if it is behind
            inner.zero_grad()
            if healed_at is None and manager.current_step() > before + 1:
                healed_at = manager.current_step()
            x = torch.randn(16, 8, generator=generator)
            loss = loss_fn(ddp(x), torch.zeros(16, 4))
            loss.backward()
            committed = manager.should_commit()
            if committed:
                inner.step()
            line = {
                "replica": args.replica,
                "pid": os.getpid(),
                "step": manager.current_step(),
                "committed": committed,
                "participants": manager.num_participants(),
                "quorum_id": manager._quorum_id,
                "healing": healed_at == manager.current_step() - int(committed),
                "digest": digest(model),
                "t": time.time(),
            }
            # one write per line (the newline with it): workers share a pipe, and with
            # PYTHONUNBUFFERED print() writes the newline apart, so lines could interleave
            print(json.dumps(line) + "\n", end="", flush=True)
            time.sleep(args.step_s)
    finally:
        manager.shutdown(wait=False)
        pg.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
