"""Elastic DDP on a synthetic dataset: a worker that survives a peer's SIGKILL, heals a
replacement, and loses no sample of the epoch the peer died in.

Start a coordinator, then 4 workers under the launcher (which starts a replacement for a worker
that dies):

    python -m coordinator serve --db /tmp/train.db --port 8470 &
    python -m foldplane.agent.launch --coordinator http://127.0.0.1:8470 --group train --world-size 4 \\
        --nproc 4 --replace-failed examples/train_ddp.py --epochs 3 --kill-rank 2 --kill-at 20

Each rank reads its part of every epoch through ``ElasticSampler`` (the epochs facet's worker
part) and a ``DataLoader`` (``--workers`` loader processes). Rank 2 SIGKILLs itself at step 20. The
survivors skip the step that failed, retry its batch in a view without rank 2, and take over
what rank 2 had not reported processed (docs/data.md); the launcher reports the death and starts
a replacement, which asks to be activated and, entering the view, receives the model, the
optimizer state and the epoch number from a survivor, then a share of what is left of the epoch.

DDP runs in lockstep: every member takes part in every step's all-reduce. A rank whose part of
the epoch is used up while others still read takes **zero-weight steps** (a forward and backward
whose loss is 0, so its gradient adds nothing) until no member has a batch left and the epoch is
complete; the members agree on that through the same all-reduce (a one-element "still reading"
parameter whose averaged gradient is positive while any member reads). The loss of a batch is
its per-sample sum over the nominal ``--batch-size``, so a short last batch weighs what it holds.

After ``--epochs`` epochs, training goes on (at most ``--max-epochs``) until an epoch ends
with all 4 ranks in the view; then every rank stops at the same step and prints the digest of
its parameters: the same on all (a rank that trained no batch prints its loss as ``nan``). ``--record DIR`` writes, per batch and before it is marked
processed, ``{"epoch", "cursor", "indices"}`` to ``DIR/<rank>-<incarnation>.jsonl``.

``--checkpoint PATH``: the group's **checkpoint rank** (``agent.is_checkpoint_rank()``, which the
committed view names: the lowest active rank or the rank the group pins with
``checkpoint_rank``, failing over to the lowest live one) saves the model there at the end, or
when a ``shutdown_with_save`` directive stops training (the directive reaches that rank before
the others, and names it; a step that failed on a dead member is then the last: no view
follows it); ``if rank == 0`` would save nothing once rank 0 had died.

Compared with a torch DDP script, the lines that change are marked ``# foldplane``.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

import foldplane.agent.dataplane  # noqa: F401  # foldplane: registers the "foldplane" backend
from foldplane.agent.ddp import DistributedDataParallel, ElasticOptimizer  # foldplane
from foldplane.facets.epochs.worker import ElasticSampler  # foldplane

FEATURES, OUTPUTS = 16, 4


class SyntheticDataset(Dataset):
    """A map-style dataset: sample ``i`` is ``(x, y, i)``, y = a fixed random linear map of x
    plus noise, the same in every process."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.w = torch.linspace(-1.0, 1.0, FEATURES * OUTPUTS).reshape(FEATURES, OUTPUTS)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        g = torch.Generator().manual_seed(7919 * i + 1)
        x = torch.randn(FEATURES, generator=g)
        return x, torch.tanh(x @ self.w) + 0.01 * torch.randn(OUTPUTS, generator=g), i


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, OUTPUTS)
        )
        # foldplane: lockstep bookkeeping that travels with the model. The gradient of
        # ``reading`` is 1 on a rank that still reads (0 on one that waits), so after the step's
        # all-reduce it is positive while any member reads; it is never trained. The epoch is a
        # buffer, so a replacement healed from a survivor learns which epoch the group's next
        # step is in.
        self.reading = torch.nn.Parameter(torch.zeros(1))
        self.register_buffer("epoch", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def die_with_parent(_worker_id: int) -> None:
    """A loader worker ends when its trainer does, even by SIGKILL (Linux): an orphaned worker
    would keep the trainer's sockets (its gloo connections, its stdout) open, and can block
    for ever flushing batches to a queue nobody reads."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the trainer died before prctl: follow it now
            os._exit(1)


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        t = p.detach().contiguous()
        h.update(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()))
    return h.hexdigest()[:16]


class Trainer:
    def __init__(self, args: argparse.Namespace, rank: int, fp_agent: Any) -> None:
        self.args, self.rank, self.fp_agent = args, rank, fp_agent
        torch.manual_seed(rank)  # deliberately different: the first step shares rank 0's weights
        self.net = Net()
        self.model = DistributedDataParallel(self.net)  # foldplane: agent.ddp's, default group
        body = torch.optim.AdamW(self.net.body.parameters(), lr=args.lr)
        self.opt = ElasticOptimizer(self.model, body)  # foldplane
        # foldplane: the step that ends an epoch moves the epoch buffer on inside the step (the
        # optimizer runs once the step is committed, the state a heal carries is copied after
        # it), so a replacement healed between two epochs starts in the next one with the rest.
        body.register_step_pre_hook(self.end_of_epoch)
        self.dataset = SyntheticDataset(args.dataset_size)
        # foldplane: this rank's part of each epoch, following the coordinator's plan
        self.sampler = ElasticSampler(
            self.dataset, fp_agent, seed=args.seed, lookahead=args.lookahead
        )
        self.loader = DataLoader(
            self.dataset,
            batch_size=args.batch_size,
            sampler=self.sampler,
            num_workers=args.workers,
            persistent_workers=args.workers > 0,
            worker_init_fn=die_with_parent,
        )
        self.first: int | None = None
        self.stop = threading.Event()
        self.losses: list[float] = []
        self.skipped = 0
        self.record: IO[str] | None = None
        if args.record:
            path = Path(args.record) / f"{rank}-{fp_agent.incarnation}.jsonl"
            self.record = open(path, "a", buffering=1)  # noqa: SIM115 - closed in close()

    def run(self) -> None:
        model = self.model
        while True:  # foldplane: enter the view before reading; a replacement is healed here
            model.begin_step()
            if model.view_version is not None:
                break
            self.opt.step()  # not active yet: that was a local step, never committed
        self.first = model.committed_steps
        world = dist.get_world_size()
        while True:
            self.train_epoch(int(self.net.epoch))  # 0, or the survivors' epoch (healed)
            epoch = int(self.net.epoch)
            everyone = len(model.members) == world  # the same on every member: one view
            if epoch >= self.args.max_epochs or (epoch >= self.args.epochs and everyone):
                break
            if self.stop.is_set():
                break

    def save(self) -> None:
        """foldplane: the group's checkpoint rank saves, whichever rank that is now (the lowest
        active one, or the one the operator pinned; after its death, the next live one)."""
        if self.args.checkpoint is None or not self.fp_agent.is_checkpoint_rank():
            return
        state = {"model": self.net.state_dict(), "steps": self.model.committed_steps}
        torch.save(state, self.args.checkpoint)
        print(f"rank {self.rank}: saved the checkpoint to {self.args.checkpoint}", flush=True)

    def train_epoch(self, epoch: int) -> None:
        """One epoch in lockstep: a step per batch, zero-weight steps once this rank's part is
        used up, until no member reads and the epoch is complete."""
        model, sampler = self.model, self.sampler
        sampler.set_epoch(epoch)  # foldplane: every rank declares the same plan
        batches = iter(self.loader)
        pending = None  # a batch read but not yet trained in a committed step
        while True:
            if pending is None and batches is not None:
                pending = next(batches, None)
                if pending is None:  # the pass is over
                    batches = None
            if pending is None and len(sampler) > 0:  # given more meanwhile (a dead rank's)
                batches = iter(self.loader)
                continue
            reading = pending is not None or not sampler.epoch_complete
            model.zero_grad(set_to_none=True)
            model.begin_step()  # foldplane (optional): move to a newer view, heal joiners
            if pending is not None:
                x, y, _ = pending
                per_sample = torch.nn.functional.mse_loss(model(x), y, reduction="none")
                loss = per_sample.mean(dim=1).sum() / self.args.batch_size
            else:  # foldplane: nothing to read: take part in the step with weight 0
                loss = model(torch.zeros(1, FEATURES)).sum() * 0.0
                if reading:
                    time.sleep(0.01)  # waiting for more work or the epoch's end
            (loss + self.net.reading.sum() * float(reading)).backward()
            if not self.opt.step():  # foldplane: False when the step failed on some member
                self.skipped += 1  # the same batch is tried again in the next step (foldplane
                if self.stop.is_set():  # logs the skip, with the failed ranks, on every member)
                    return  # foldplane: shut down: no view follows the failed one
                continue
            if pending is not None:
                self.done_with(epoch, pending, loss.item() * self.args.batch_size / len(pending[2]))
                pending = None
            self.maybe_die()
            if int(self.net.epoch) > epoch or self.stop.is_set():
                return  # no member read: the step ended the epoch (or the group shuts down)

    def end_of_epoch(self, *_: Any) -> None:
        """The optimizer's step pre-hook: the reduced gradients are final here."""
        assert self.net.reading.grad is not None
        if float(self.net.reading.grad) == 0.0:  # no member reads, the epoch is complete
            self.net.epoch.add_(1)

    def done_with(self, epoch: int, batch: Any, loss: float) -> None:
        indices = [int(i) for i in batch[2]]
        if self.record is not None:
            cursor = self.sampler.processed + len(indices)
            self.record.write(json.dumps({"epoch": epoch, "cursor": cursor, "indices": indices}))
            self.record.write("\n")
        self.sampler.mark_processed(len(indices))  # foldplane: these samples are done
        self.losses.append(loss)
        step = self.model.committed_steps
        if step % 10 == 0:
            say(
                f"rank {self.rank}: epoch {epoch} step {step} loss {loss:.4f} "
                f"view {self.model.view_version} members {list(self.model.members)}"
            )

    def maybe_die(self) -> None:
        args = self.args
        if (
            self.rank == args.kill_rank
            and self.first == 0
            and self.model.committed_steps == args.kill_at
        ):
            say(f"rank {self.rank}: SIGKILL at step {args.kill_at}")
            os.kill(os.getpid(), signal.SIGKILL)


def say(text: str) -> None:
    """One write per line: the ranks share the launcher's stdout, and print() writes a line
    and its newline apart, so two ranks' lines could run together."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=3, help="train at least this many epochs")
    p.add_argument(
        "--max-epochs",
        type=int,
        default=30,
        help="past --epochs, train on until an epoch ends with every rank, at most this many",
    )
    p.add_argument("--dataset-size", type=int, default=4096)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    p.add_argument("--lookahead", type=int, default=512, help="the plan's read-ahead window")
    p.add_argument("--seed", type=int, default=0, help="the epochs' shuffle seed")
    p.add_argument("--kill-rank", type=int, default=None, help="this rank SIGKILLs itself...")
    p.add_argument("--kill-at", type=int, default=20, help="...once this many steps committed")
    p.add_argument("--record", default=None, help="write the samples each rank processed here")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument(
        "--checkpoint",
        default=None,
        help="the group's checkpoint rank saves the model here at the end (and on shutdown)",
    )
    args = p.parse_args()

    dist.init_process_group("foldplane")  # foldplane: instead of "gloo"/"nccl"
    rank = dist.get_rank()
    fp_agent = dist.group.WORLD.agent  # foldplane: the coordinator's view of this rank
    if not fp_agent.is_active():  # foldplane: a replacement asks to be activated
        fp_agent.wait_for_state("HEALTHY", timeout=120)
        proposal = fp_agent.activate_ranks([rank])
        if proposal.get("status") not in ("applied", "applied_with_dropped_ranks"):
            say(f"rank {rank}: not activated ({proposal}); leaving")
            fp_agent.close()
            return 0

    t = Trainer(args, rank, fp_agent)

    def shut_down(reason: str, detail: str) -> None:
        """foldplane: a shutdown_with_save directive stops every rank at its next step; it
        reaches the rank that saves (its ``checkpoint_rank``) first."""
        t.stop.set()
        saver = fp_agent.shutdown_directive.checkpoint_rank
        say(f"rank {rank}: shutdown_with_save ({reason}); checkpoint rank {saver}")

    fp_agent.on_shutdown_with_save = shut_down
    t.run()
    t.save()
    first, last = (t.losses[0], t.losses[-1]) if t.losses else (float("nan"),) * 2
    say(
        f"rank {rank}: done at step {t.model.committed_steps} (joined at {t.first}, {t.skipped} "
        f"skipped); loss {first:.4f} -> {last:.4f}; params {digest(t.net)}"
    )
    if t.record is not None:
        t.record.close()
    fp_agent.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
