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

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.ddp import _Foldplane, _fp_agent
from benchmarks.harness import Result, median, percentile
from benchmarks.recovery import _Lines

ROOT = Path(__file__).resolve().parents[1]
REPLICAS, SHARDS = 2, 2
DIM, LAYERS, BATCH, SEQ = 128, 2, 8, 32


def _emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def _log(text: str) -> None:
    print(f"# fsdp: {text}", file=sys.stderr, flush=True)


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

    def __init__(self, fp: _Foldplane, mode: str, *args: str) -> None:
        from agent.launch import Launcher

        fp.groups += 1
        self.name = f"fsdp{fp.groups}"
        for s in range(SHARDS):
            fp.client.create_group(f"{self.name}-s{s}", REPLICAS, formation_timeout_s=300.0)
        self.lines = _Lines()
        self.launchers: dict[tuple[int, int], Any] = {}
        for r in range(REPLICAS):
            replica_id = uuid.uuid4().hex
            for s in range(SHARDS):
                launcher = Launcher(
                    [sys.executable, __file__, mode, *args],
                    coordinator=fp.url,
                    group=f"{self.name}-s{s}",
                    ranks=[r],
                    stdout=subprocess.PIPE,
                    stderr=fp.workers_log,
                    relay=False,
                    env={
                        **os.environ,
                        "FOLDPLANE_TOKEN": "",
                        "OMP_NUM_THREADS": "1",
                        "FOLDPLANE_REPLICA_ID": replica_id,
                        "FOLDPLANE_SHARD": str(s),
                        "FOLDPLANE_SHARDS": str(SHARDS),
                        "BENCH_PLAIN_PREFIX": self.name,
                    },
                )
                launcher.on_spawn = lambda worker: self.lines.follow(worker.process)
                launcher.start()
                self.launchers[(r, s)] = launcher

    def kill_replica(self, replica: int) -> None:
        for s in range(SHARDS):
            self.launchers[(replica, s)].kill(replica)

    def stop(self) -> None:
        for launcher in self.launchers.values():
            launcher.stop(grace_s=5)


def _hsdp() -> tuple[Any, Any]:
    from agent.fsdp import environment, hsdp_mesh

    agent = _fp_agent()
    replica_id, shard, shards = environment()
    return agent, hsdp_mesh(agent, shards=shards, shard=shard, replica_id=replica_id)


# -- fsdp step overhead --------------------------------------------------------------------------


def _plain_mesh(agent: Any, mesh: Any) -> Any:
    """A plain gloo 2-D mesh over the same processes: a gloo group per replica and per shard."""
    from datetime import timedelta

    import torch
    from torch.distributed import PrefixStore, TCPStore
    from torch.distributed.device_mesh import DeviceMesh

    from agent.fsdp import plain_group, register_group

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

    from agent.ddp import ElasticOptimizer
    from agent.fsdp import ElasticFSDP

    agent, mesh = _hsdp()
    rank = mesh.replica * mesh.shards + mesh.shard
    plain = _model(_plain_mesh(agent, mesh))
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=1e-3)
    ours = ElasticFSDP(_model(mesh.device_mesh), mesh)
    ours_opt = ElasticOptimizer(ours, torch.optim.AdamW(ours.parameters(), lr=1e-3))  # type: ignore[arg-type]
    systems = {"plain": (plain, plain_opt), "foldplane": (ours, ours_opt)}
    step = 0
    for b in range(blocks):
        order = ["plain", "foldplane"] if b % 2 == 0 else ["foldplane", "plain"]
        for name in order:
            model, opt = systems[name]
            times: list[float] = []
            opt_times: list[float] = []
            for _ in range(steps):
                step += 1
                t0 = time.perf_counter()
                _train_step(model, opt, step, rank, opt_times)
                times.append(time.perf_counter() - t0)
            if rank == 0 and b > 2:  # the first blocks of each warm up
                _emit(system=name, times=times, opt_times=opt_times)
    if rank == 0:
        _emit(finished=True, committed=ours.committed_steps, steps=step // 2)
    threading.Event().wait()  # the benchmark stops the workers
    return 0


def _overhead(fp: _Foldplane, blocks: int, steps: int) -> dict[str, Any]:
    job = _Job(fp, "fp-overhead", str(blocks), str(steps))
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

    from agent.ddp import ElasticOptimizer
    from agent.fsdp import ElasticFSDP

    agent, mesh = _hsdp()
    rank = mesh.replica * mesh.shards + mesh.shard
    model = ElasticFSDP(_model(mesh.device_mesh), mesh)
    opt = ElasticOptimizer(model, torch.optim.AdamW(model.parameters(), lr=1e-3))  # type: ignore[arg-type]
    step = 0
    while True:
        step += 1
        committed = _train_step(model, opt, step, rank)
        _emit(replica=mesh.replica, shard=mesh.shard, committed=committed,
              members=list(model.members), t=time.time())  # fmt: skip


def _recovery_trial(fp: _Foldplane) -> float:
    job = _Job(fp, "fp-train")
    try:
        counts: dict[tuple[int, int], int] = {}

        def warm(line: dict[str, Any]) -> bool:
            if line.get("committed"):
                key = (line["replica"], line["shard"])
                counts[key] = counts.get(key, 0) + 1
            return len(counts) == REPLICAS * SHARDS and min(counts.values()) >= 5

        job.lines.until(warm, 600, "the fsdp warm-up")
        t_kill = time.time()
        job.kill_replica(1)
        recovered: dict[int, float] = {}

        def back(line: dict[str, Any]) -> bool:
            if line.get("replica") == 0 and line.get("committed") and line["members"] == [0]:
                recovered.setdefault(line["shard"], line["t"])
            return len(recovered) == SHARDS

        job.lines.until(back, 300, "every survivor committing without replica 1")
        return max(recovered.values()) - t_kill
    finally:
        job.stop()


# -- the benchmark -------------------------------------------------------------------------------


def run(quick: bool) -> list[Result]:
    blocks, steps = (20, 2) if quick else (40, 4)
    kills = 1 if quick else 3
    results: list[Result] = []
    fp = _Foldplane()
    try:
        times = _overhead(fp, blocks, steps)
        ours, plain = median(times["foldplane"]), median(times["plain"])
        ours_opt, plain_opt = median(times["foldplane_opt"]), median(times["plain_opt"])
        _log(f"foldplane HSDP {ours * 1e3:.2f} ms (optimizer step and agreement "
             f"{ours_opt * 1e3:.2f} ms), plain gloo HSDP {plain * 1e3:.2f} ms (optimizer step "
             f"{plain_opt * 1e3:.2f} ms)")  # fmt: skip
        results.append(
            Result(
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
            )
        )  # fmt: skip
        samples = []
        for k in range(kills):
            try:
                samples.append(_recovery_trial(fp))
            except Exception as exc:  # said, never dropped silently
                _log(f"recovery trial {k} failed: {exc}\n{fp.tail()}")
                continue
            _log(f"recovery trial {k}: {samples[-1]:.3f} s")
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
    finally:
        fp.close()
    return results


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "fp-overhead":
        raise SystemExit(_fp_overhead_worker(int(sys.argv[2]), int(sys.argv[3])))
    if mode == "fp-train":
        raise SystemExit(_fp_train_worker())
    raise SystemExit(f"unknown mode {mode!r}")
