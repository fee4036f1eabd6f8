"""Elastic HSDP (FSDP2): the step's overhead, and recovery from losing a whole replica.

Measured in one run, on one machine, on the shape of ``tests/fsdp/test_fsdp.py``: 2 replicas of
2 shard processes (4 gloo processes), a transformer of 2 encoder layers (width 128, 4 heads,
feed-forward 512, float32, each layer and the root ``fully_shard``-ed), AdamW, batches of
8 sequences of 32 tokens per process. The ``ddp`` run measures these rows too.

- **fsdp step overhead**: the same 4 processes hold two copies of the model, one
  ``fully_shard``-ed on a plain 2-D gloo mesh (``DeviceMesh.from_group`` over a gloo group per
  replica and a gloo group per shard index), the other on foldplane's ``hsdp_mesh`` (the same
  kind of shard group; the replicate dimension is the foldplane group of the shard index,
  wrapped in ``agent.fsdp.ElasticFSDP``). They alternate short blocks of steps (ABBA; 2 steps
  a block with --quick, 4 otherwise, the first 3 blocks a warm-up) and global rank 0 times each
  step (zero_grad, forward, backward, optimizer step; foldplane's includes the replica check
  and the commit agreement). The row is the ratio of the medians, foldplane / plain.
- **fsdp recovery**: the 4 processes train; both processes of replica 1 are SIGKILLed by
  their launchers (which report the deaths); the time from the kill until every survivor (both
  shards of replica 0) has committed a step without replica 1. Replica 0 skips the step that
  failed and carries on; nobody is restarted.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from typing import Any

from .harness import Result, median, percentile
from .kit.kills import time_recovery
from .kit.service import Service
from .kit.workers import Lines, abba, emit, say, start_agent

REPLICAS, SHARDS = 2, 2
DIM, LAYERS, BATCH, SEQ = 128, 2, 8, 32

_log = say("fsdp")


def _model(mesh: Any, seed: int = 0) -> Any:
    import torch
    from torch.distributed.fsdp import FSDPModule, fully_shard

    class Transformer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Linear(16, DIM)
            self.layers = torch.nn.ModuleList(
                torch.nn.TransformerEncoderLayer(DIM, 4, 4 * DIM, dropout=0.0, batch_first=True)
                for _ in range(LAYERS)
            )
            self.head = torch.nn.Linear(DIM, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.embed(x)
            for layer in self.layers:
                h = layer(h)
            return self.head(h).sum(dim=-1)

    torch.manual_seed(seed)
    model = Transformer()
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_force_sum_reduction_for_comms(True)  # gloo has no AVG
    return model


def _batch(step: int, rank: int) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(7919 * step + rank)
    x = torch.randn(BATCH, SEQ, 16, generator=g)
    return x, torch.tanh(x.sum(dim=-1) / 4)


def _train_step(
    model: Any, opt: Any, step: int, rank: int, split: list[float] | None = None
) -> bool:
    """One step; ``split`` gets the seconds of the optimizer step (with foldplane's agreement)."""
    import torch

    opt.zero_grad()
    x, y = _batch(step, rank)
    torch.nn.functional.mse_loss(model(x), y).backward()
    t0 = time.perf_counter()
    stepped = opt.step() is not False
    if split is not None:
        split.append(time.perf_counter() - t0)
    return stepped


class _Job:
    """``REPLICAS`` × ``SHARDS`` processes of ``mode``: a launcher per process."""

    def __init__(self, service: Service, mode: str, *args: str) -> None:
        self.name = service.next_name("fsdp")
        for s in range(SHARDS):
            service.create_group(f"{self.name}-s{s}", REPLICAS)
        self.lines = Lines()
        self.launchers: dict[tuple[int, int], Any] = {}
        for r in range(REPLICAS):
            replica_id = uuid.uuid4().hex
            for s in range(SHARDS):
                self.launchers[(r, s)] = service.launch(
                    [sys.executable, "-m", __name__, mode, *args], f"{self.name}-s{s}", [r],
                    self.lines.follow, relay=False,
                    env={"OMP_NUM_THREADS": "1", "FOLDPLANE_REPLICA_ID": replica_id,
                         "FOLDPLANE_SHARD": str(s), "FOLDPLANE_SHARDS": str(SHARDS),
                         "BENCH_PLAIN_PREFIX": self.name},
                )  # fmt: skip

    def kill_replica(self, replica: int) -> None:
        for s in range(SHARDS):
            self.launchers[(replica, s)].kill(replica)

    def stop(self) -> None:
        for launcher in self.launchers.values():
            launcher.stop(grace_s=5)


def _hsdp() -> tuple[Any, Any]:
    from ..agent.fsdp import environment, hsdp_mesh

    agent = start_agent()
    replica_id, shard, shards = environment()
    return agent, hsdp_mesh(agent, shards=shards, shard=shard, replica_id=replica_id)


# -- fsdp step overhead --------------------------------------------------------------------------


def _plain_mesh(agent: Any, mesh: Any) -> Any:
    """A plain gloo 2-D mesh over the same processes: a gloo group per replica and per shard."""
    from datetime import timedelta

    import torch
    from torch.distributed import PrefixStore, TCPStore
    from torch.distributed.device_mesh import DeviceMesh

    from ..agent.fsdp import plain_group, register_group

    plane = agent.data_plane
    host, port = plane.store_address
    client = TCPStore(host, port, is_master=False, timeout=timedelta(seconds=300),
                      wait_for_workers=False)  # fmt: skip
    base = f"bench-plain/{os.environ['BENCH_PLAIN_PREFIX']}"
    r, s, n = mesh.replica, mesh.shard, mesh.shards
    groups = []
    for name, index, size, ranks in (
        (f"{base}/replicate-{s}", r, mesh.replicas, [i * n + s for i in range(mesh.replicas)]),
        (f"{base}/shard-{r}", s, n, [r * n + i for i in range(n)]),
    ):
        store = PrefixStore(f"{name}/", client)
        group = plain_group(plane.kind.create(store, index, size, 300.0), store, index, size)
        register_group(group, "gloo", name, ranks)
        groups.append(group)
    layout = torch.arange(mesh.replicas * n, dtype=torch.int).view(mesh.replicas, n)
    return DeviceMesh.from_group(groups, "cpu", mesh=layout, mesh_dim_names=("replicate", "shard"))


def _fp_overhead_worker(blocks: int, steps: int) -> int:
    import torch

    from ..agent.ddp import ElasticOptimizer
    from ..agent.fsdp import ElasticFSDP

    agent, mesh = _hsdp()
    rank = mesh.replica * mesh.shards + mesh.shard
    plain = _model(_plain_mesh(agent, mesh))
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=1e-3)
    ours = ElasticFSDP(_model(mesh.device_mesh), mesh)
    ours_opt = ElasticOptimizer(ours, torch.optim.AdamW(ours.parameters(), lr=1e-3))  # type: ignore[arg-type]
    systems = {"plain": (plain, plain_opt), "foldplane": (ours, ours_opt)}
    opt_times: list[float] = []

    def step(name: str, n: int) -> None:
        _train_step(*systems[name], n, rank, opt_times)

    for b, name, times in abba(blocks, steps, list(systems), step):
        if rank == 0 and b > 2:  # the first blocks of each warm up
            emit(system=name, times=times, opt_times=opt_times[-steps:])
    if rank == 0:
        emit(finished=True, committed=ours.committed_steps, steps=blocks * steps)
    threading.Event().wait()  # the benchmark stops the workers
    return 0


def _overhead(service: Service, blocks: int, steps: int) -> dict[str, Any]:
    job = _Job(service, "fp-overhead", str(blocks), str(steps))
    try:
        got: dict[str, Any] = {}

        def done(line: dict[str, Any]) -> bool:
            if "times" in line:
                got.setdefault(line["system"], []).extend(line["times"])
                got.setdefault(f"{line['system']}_opt", []).extend(line["opt_times"])
            if "finished" in line:
                got["committed"] = line["committed"]
                got["steps"] = line["steps"]
            return "finished" in line

        job.lines.until(done, 1200, "the fsdp overhead run")
        return got
    finally:
        job.stop()


# -- fsdp recovery -------------------------------------------------------------------------------


def _fp_train_worker() -> int:
    import torch

    from ..agent.ddp import ElasticOptimizer
    from ..agent.fsdp import ElasticFSDP

    agent, mesh = _hsdp()
    rank = mesh.replica * mesh.shards + mesh.shard
    model = ElasticFSDP(_model(mesh.device_mesh), mesh)
    opt = ElasticOptimizer(model, torch.optim.AdamW(model.parameters(), lr=1e-3))  # type: ignore[arg-type]
    step = 0
    while True:
        step += 1
        committed = _train_step(model, opt, step, rank)
        emit(replica=mesh.replica, shard=mesh.shard, committed=committed,
              members=list(model.members), t=time.time())  # fmt: skip


def _recovery_trial(service: Service) -> float:
    job = _Job(service, "fp-train")
    try:
        counts: dict[tuple[int, int], int] = {}

        def warm(line: dict[str, Any]) -> bool:
            if line.get("committed"):
                key = (line["replica"], line["shard"])
                counts[key] = counts.get(key, 0) + 1
            return len(counts) == REPLICAS * SHARDS and min(counts.values()) >= 5

        job.lines.until(warm, 600, "the fsdp warm-up")

        def without_replica_1(line: dict[str, Any], _: float) -> int | None:
            back = line.get("replica") == 0 and line.get("committed") and line["members"] == [0]
            return line["shard"] if back else None

        return time_recovery(
            job.lines, lambda: job.kill_replica(1), set(range(SHARDS)), without_replica_1, 300,
            "every survivor committing without replica 1",
        ).seconds  # fmt: skip
    finally:
        job.stop()


# -- the benchmark -------------------------------------------------------------------------------


def run(quick: bool) -> list[Result]:
    blocks, steps = (20, 2) if quick else (40, 4)
    kills = 1 if quick else 3
    with Service(store=True, name="fsdp").start() as service:
        times = _overhead(service, blocks, steps)
        samples = []
        for k in range(kills):
            try:
                samples.append(_recovery_trial(service))
            except Exception as exc:  # said, never dropped silently
                _log(f"recovery trial {k} failed: {exc}\n{service.tail('workers.log')}")
                continue
            _log(f"recovery trial {k}: {samples[-1]:.3f} s")
    results = [_overhead_row(times)]
    if samples:
        results.append(
            Result(
                "fsdp", "fsdp recovery", "s", median(samples), p99=percentile(samples, 99),
                extra={"samples_s": [round(s, 3) for s in samples],
                       "trials": kills,
                       "what": "SIGKILL of replica 1 (both shards) -> both shards of "
                               "replica 0 committed a step without it"},
            )
        )  # fmt: skip
    return results


def _overhead_row(times: dict[str, Any]) -> Result:
    ours, plain = median(times["foldplane"]), median(times["plain"])
    ours_opt, plain_opt = median(times["foldplane_opt"]), median(times["plain_opt"])
    _log(f"foldplane HSDP {ours * 1e3:.2f} ms (optimizer step and agreement "
         f"{ours_opt * 1e3:.2f} ms), plain gloo HSDP {plain * 1e3:.2f} ms (optimizer step "
         f"{plain_opt * 1e3:.2f} ms)")  # fmt: skip
    return Result(
        "fsdp", "fsdp step overhead", "x", ours / plain,
        baseline="fully_shard on a plain 2-D gloo mesh, same processes (ABBA)",
        baseline_median=1.0, target="<= 1.05",
        extra={"foldplane_step_ms": round(ours * 1e3, 3),
               "plain_step_ms": round(plain * 1e3, 3),
               "foldplane_opt_step_ms": round(ours_opt * 1e3, 3),
               "plain_opt_step_ms": round(plain_opt * 1e3, 3),
               "steps_each": len(times["foldplane"]),
               "foldplane_committed": f"{times['committed']}/{times['steps']}",
               "shape": f"{REPLICAS} replicas x {SHARDS} shards"},
    )  # fmt: skip


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "fp-overhead":
        raise SystemExit(_fp_overhead_worker(int(sys.argv[2]), int(sys.argv[3])))
    if mode == "fp-train":
        raise SystemExit(_fp_train_worker())
    raise SystemExit(f"unknown mode {mode!r}")
