"""A worker for the elastic DDP tests: a small float64 model, Adam, deterministic batches.

Driven by one JSON command per line on stdin, one JSON event per line on stdout. Commands:
``steps {n | until} [with_rank] [stall_s, stall_steps]`` (n training steps, or steps until
``until`` are committed, and in either case on until a committed step had ``with_rank`` among
its members; one ``step`` event each; the first ``stall_steps`` of them sleep ``stall_s`` before
the forward pass, in the training thread only, and the first ``vote_late_steps`` sleep
``vote_late_s`` between the backward pass and the optimizer step, so the other members wait
for this rank's vote), ``activate_self`` (wait until
HEALTHY, then propose this rank's activation), ``wait_view {active}``, ``close``.

Each ``step`` event carries what a test needs to check the step from outside: the batch's seed,
the parameters the step started from, the gradients it used (the mean over the members, as DDP
left them in ``.grad``), a digest of the parameters and the optimizer state afterwards, and the
rank's last heal (from whom, at how many committed steps).

With ``GPU_TEST_DEVICE=cuda:0`` in the environment (the GPU suite, ``tests/gpu``), the model
and its batches live on that GPU and the gradients are averaged over NCCL; several ranks then
share the GPU as ``tests/gpu/worker.py`` describes.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import sys
import time
import traceback
from typing import Any

import torch

from foldplane.agent import Agent
from foldplane.agent.ddp import DistributedDataParallel, ElasticOptimizer

IN, HIDDEN, OUT, BATCH = 4, 3, 1, 8
#: the GPU suite's device (None: the CPU, gloo)
GPU = os.environ.get("GPU_TEST_DEVICE") or None


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUT)
    ).double()


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(BATCH, IN, generator=g, dtype=torch.float64)
    return x, x.sum(dim=1, keepdim=True).sin()


def loss_of(model: torch.nn.Module, seed: int) -> torch.Tensor:
    x, y = batch(seed)
    device = next(model.parameters()).device
    return torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))


def flat(tensors: list[torch.Tensor]) -> list[float]:
    return torch.cat([t.detach().reshape(-1) for t in tensors]).tolist()


def digest(tensors: list[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in tensors:
        c = t.detach().cpu().contiguous()
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
    gpu: dict[str, Any] = {}
    if GPU is not None:
        from tests.gpu.worker import share_gpu

        share_gpu(int(os.environ["RANK"]), os.environ["FOLDPLANE_INCARNATION"])
        gpu = {"backend": "nccl", "device": GPU}
    agent = Agent(
        heartbeat_interval_s=0.25, collective_timeout_s=timeout_s, p2p_timeout_s=timeout_s, **gpu
    ).start()
    rank = agent.rank
    pg = agent.process_group()
    module = make_model(1000 + rank)  # different on every rank
    if GPU is not None:
        module = module.to(GPU)
    model = DistributedDataParallel(module, pg)
    opt = ElasticOptimizer(model, torch.optim.Adam(model.parameters(), lr=0.05))
    emit("started", rank=rank, incarnation=agent.incarnation)
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
                    seed = 100_000 * rank + iteration
                    opt.zero_grad()
                    model.begin_step()  # pins the view (and heals) before we read the params
                    before = flat(list(model.parameters()))
                    if done <= cmd.get("stall_steps", 0):  # a gray failure: alive, not stepping
                        time.sleep(cmd["stall_s"])
                    loss = loss_of(model, seed)
                    loss.backward()
                    grads = flat([p.grad for p in model.parameters()])
                    if done <= cmd.get("vote_late_steps", 0):  # a slow host: a late vote
                        time.sleep(cmd["vote_late_s"])
                    committed = opt.step()
                    joined = joined or (committed and with_rank in model.members)
                    params = list(model.parameters())
                    emit(
                        "step",
                        committed=committed,
                        version=model.view_version,
                        members=list(model.members),
                        steps=model.committed_steps,
                        index=model.step_index,
                        iteration=iteration,
                        seed=seed,
                        loss=loss.item(),
                        before=before,
                        grads=grads,
                        params=digest(params),
                        optim=digest(optimizer_tensors(opt.optimizer)),
                        failed=[] if committed else model.last_failed_ranks,
                        healed_from=[]
                        if model.last_heal is None
                        else list(model.last_heal.sources),
                        healed_steps=None if model.last_heal is None else model.last_heal.steps,
                    )
                emit("steps_done", steps=model.committed_steps)
            elif name == "activate_self":
                agent.wait_for_state("HEALTHY", timeout=60)
                proposal = agent.activate_ranks([rank])
                emit("proposal", status=proposal.get("status"), version=proposal.get("version"))
            elif name == "wait_view":
                view = agent.wait_for_view(
                    lambda v, c=cmd: list(v.active_ranks) == c["active"], timeout=60
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
