"""The NCCL data plane on a GPU: per-operation cost, view builds, recovery from a SIGKILL, DDP.

Runs only where torch sees a CUDA device (elsewhere it returns no rows and says why). Four
worker processes, the store hosted here (as the coordinator hosts it). **All four share one
GPU**: each process sets its own ``NCCL_HOSTID``, so NCCL treats them as four hosts and moves
data over loopback sockets (a test arrangement: a production rank has a GPU of its own). Absolute
times are those of that arrangement; the ratios compare foldplane with plain torch in the same
processes, where the arrangement costs both sides alike.

Rows (names kept; figures recorded by ``scripts/gpu-check`` in docs/gpu-runs/):
- ``nccl all_reduce 4 KB latency`` and ``nccl all_reduce 64 MB``: one op until the CPU knows
  the result is there; foldplane (``pg.all_reduce(t, async_op=True).wait()``) against a plain
  ``ProcessGroupNCCL`` of the same four processes (``allreduce([t]).wait()`` then a current-stream
  synchronize), alternating op by op (ABBA). Ratio: foldplane / plain (lower is better).
- ``nccl view build 4 ranks``: from ``install_view`` to the view's communicator connected (its
  first all-reduce done), a fresh NCCL communicator per view.
- ``nccl recovery kill 1 of 4 -> first all_reduce on new view``: rank 3 is SIGKILLed while the
  others loop on 4 KB all-reduces; the survivors-only view is committed at the kill (as the
  launcher's death report lets the coordinator do within milliseconds). Time from the kill until
  the last survivor's first all-reduce on the new view succeeded. Baseline, in the same run: the
  survivors are told of the death at the kill itself (for free), abort their plain
  ``ProcessGroupNCCL``, build a new one over the survivors and all-reduce (torchft's and a
  restart-free torchrun user's recovery, minus detection).
- ``ddp step overhead cuda``: elastic DDP (``agent.ddp``) against torch's DDP on a plain NCCL
  group, same model, same processes, alternating step by step. Ratio: elastic / plain.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
import traceback
import uuid
from datetime import timedelta
from typing import Any

from .harness import Result, higher_is_better_ratio, median, percentile
from .kit.workers import abba

BENCH = "gpu"
WORLD = 4
SHARED_GPU_ENV = {
    "NCCL_SOCKET_IFNAME": "lo",
    "NCCL_IB_DISABLE": "1",
    "NCCL_P2P_DISABLE": "1",
    "NCCL_SHM_DISABLE": "1",
}
REPLY_S = 180.0
SYSTEMS = ("plain", "ours")  # plain torch, then foldplane, in the same processes


# -- the worker processes -------------------------------------------------------------------------


def _worker(conn: Any, rank: int, port: int, incarnation: str) -> None:
    os.environ.update(SHARED_GPU_ENV)
    os.environ["NCCL_HOSTID"] = f"foldplane-bench-{rank}-{incarnation[:8]}"
    import torch

    from ..agent.dataplane import DataPlane

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    dp = DataPlane(
        rank,
        WORLD,
        "127.0.0.1",
        port,
        incarnation=incarnation,
        backend="nccl",
        device=device,
        collective_timeout_s=60.0,
        p2p_timeout_s=60.0,
        liveness_period_s=0.05,
        liveness_window_periods=3,
    )
    state: dict[str, Any] = {"dp": dp, "pg": dp.process_group(), "rank": rank, "port": port}
    conn.send({"pid": os.getpid()})
    while True:
        cmd, args = conn.recv()
        try:
            if cmd == "close":
                dp.close()
                conn.send(None)
                return
            conn.send(_COMMANDS[cmd](state, conn, *args))
        except Exception as e:
            conn.send({"raised": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()})


def _plain_group(state: dict[str, Any], name: str, members: list[int]) -> Any:
    """A plain ``ProcessGroupNCCL`` over ``members``, connected (its first all-reduce done)."""
    import torch
    from torch.distributed import PrefixStore, ProcessGroupNCCL, TCPStore

    store = state.get("client")
    if store is None:
        store = state["client"] = TCPStore(
            "127.0.0.1", state["port"], is_master=False, timeout=timedelta(seconds=120)
        )
    opts = ProcessGroupNCCL.Options()
    opts._timeout = timedelta(seconds=60)
    pg = ProcessGroupNCCL(
        PrefixStore(f"plain/{name}/", store), members.index(state["rank"]), len(members), opts
    )
    pg.eager_connect_single_device(torch.device("cuda", 0))
    pg.allreduce([torch.zeros(1, device="cuda:0")]).wait()
    torch.cuda.current_stream().synchronize()
    return pg


def _install(
    state: dict[str, Any], conn: Any, version: int, members: list[int], probe: bool = True
) -> dict:
    """Install a view; ``probe``: time it until its communicator is connected (an all-reduce)."""
    import torch

    t0 = time.monotonic()
    state["dp"].install_view(version, members)
    if not probe or state["rank"] not in members:
        return {"build_s": None}
    t = torch.zeros(1, device="cuda:0")
    ok = state["pg"].all_reduce(t, async_op=True).wait()
    return {"build_s": time.monotonic() - t0, "ok": ok}


def _latency(state: dict[str, Any], conn: Any, numel: int, ops: int) -> dict:
    """ABBA: plain NCCL and foldplane all-reduces of ``numel`` floats, alternating."""
    import torch

    plain = state.get("plain")
    if plain is None:
        plain = state["plain"] = _plain_group(state, "latency", list(range(WORLD)))
    pg = state["pg"]
    t = torch.ones(numel, device="cuda:0")
    stream = torch.cuda.current_stream()

    def step(system: str, _n: int) -> None:
        if system == "plain":
            plain.allreduce([t]).wait()
        elif not pg.all_reduce(t, async_op=True).wait():
            raise RuntimeError("a foldplane all_reduce failed during the latency run")
        stream.synchronize()  # the CPU knows the result is there

    return _abba(ops, step)


def _abba(ops: int, step: Any) -> dict[str, list[float]]:
    """Warm both systems up, then ``ops`` steps of each, alternating (ABBA)."""
    for _ in abba(1, 5, SYSTEMS, step):
        pass
    times: dict[str, list[float]] = {"plain": [], "ours": []}
    for _block, system, seconds in abba(ops, 1, SYSTEMS, step):
        times[system] += seconds
    return times


def _in_background(state: dict[str, Any], fn: Any) -> dict:
    """Run ``fn`` in a thread (the worker keeps taking commands); ``result`` joins it."""
    import threading

    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except Exception as e:  # reported by ``result``
            box["value"] = {"raised": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}

    thread = threading.Thread(target=target, daemon=True)
    state["background"] = (thread, box)
    thread.start()
    return {"looping": True}


def _result(state: dict[str, Any], conn: Any) -> dict:
    thread, box = state.pop("background")
    thread.join(REPLY_S - 10)
    return box.get("value", {"raised": "the background loop did not end", "trace": ""})


def _loop(state: dict[str, Any], conn: Any, version: int) -> dict:
    """4 KB all-reduces in a loop until one on view ``version`` succeeded (when, wall clock)."""
    import torch

    pg = state["pg"]
    t = torch.ones(1024, device="cuda:0")

    def loop() -> dict:
        failed_at = None
        while True:
            ok = pg.all_reduce(t, async_op=True).wait()
            if ok and pg.version >= version:
                return {"recovered_at": time.time(), "failed_at": failed_at}
            if not ok:
                failed_at = failed_at or time.time()
                state["dp"].wait_for_view(lambda v: v.version >= version, 30.0)

    return _in_background(state, loop)


def _plain_loop(state: dict[str, Any], conn: Any) -> dict:
    """4 KB all-reduces on a plain group until ``plain_rebuild`` aborts it."""
    import torch

    plain = _plain_group(state, f"recovery-{uuid.uuid4().hex[:6]}", list(range(WORLD)))
    state["doomed"] = plain
    t = torch.ones(1024, device="cuda:0")

    def loop() -> dict:
        while "stop" not in state:
            plain.allreduce([t]).wait()
            torch.cuda.current_stream().synchronize()
        return {"stopped": True}

    return _in_background(state, loop)


def _plain_rebuild(state: dict[str, Any], conn: Any, name: str, members: list[int]) -> dict:
    """The baseline's recovery, told of the death: abort the old plain group (its stuck
    all-reduce returns), build one over ``members`` and all-reduce on it."""
    import torch

    state["stop"] = True
    doomed = state.pop("doomed")
    doomed.abort()
    state.setdefault("graveyard", []).append(doomed)  # never destroyed after an abort
    thread, _box = state.pop("background")
    thread.join(30)
    pg = _plain_group(state, name, members)
    t = torch.ones(1024, device="cuda:0")
    pg.allreduce([t]).wait()
    torch.cuda.current_stream().synchronize()
    return {"recovered_at": time.time()}


def _ddp(state: dict[str, Any], conn: Any, steps: int) -> dict:
    """ABBA steps of torch's DDP on a plain NCCL group and of the elastic DDP on foldplane."""
    import torch
    import torch.distributed as dist

    from ..agent.ddp import DistributedDataParallel as ElasticDDP
    from ..agent.ddp import ElasticOptimizer

    plain_backend = state.get("plain") or _plain_group(state, "ddp", list(range(WORLD)))
    group = dist.ProcessGroup(dist.HashStore(), state["rank"], WORLD)
    group._register_backend(torch.device("cuda"), dist.ProcessGroup.BackendType.NCCL, plain_backend)
    group._set_default_backend(dist.ProcessGroup.BackendType.NCCL)

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        layers: list[torch.nn.Module] = []
        for _ in range(4):
            layers += [torch.nn.Linear(1024, 1024), torch.nn.ReLU()]
        return torch.nn.Sequential(*layers).cuda()

    plain = torch.nn.parallel.DistributedDataParallel(model(), process_group=group)
    plain_opt = torch.optim.SGD(plain.parameters(), lr=0.01)
    elastic = ElasticDDP(model(), state["pg"])
    elastic_opt = ElasticOptimizer(elastic, torch.optim.SGD(elastic.parameters(), lr=0.01))
    x = torch.randn(256, 1024, device="cuda:0")

    systems = {"plain": (plain, plain_opt), "ours": (elastic, elastic_opt)}

    def step(system: str, _n: int) -> None:
        m, opt = systems[system]
        opt.zero_grad()
        m(x).square().mean().backward()
        opt.step()
        torch.cuda.synchronize()

    return _abba(steps, step)


def _shrink(state: dict[str, Any], conn: Any, on: bool) -> None:
    state["dp"].nccl_shrink = on


_COMMANDS = {
    "install": _install,
    "shrink": _shrink,
    "latency": _latency,
    "loop": _loop,
    "result": _result,
    "plain_loop": _plain_loop,
    "plain_rebuild": _plain_rebuild,
    "ddp": _ddp,
}


# -- the driver -----------------------------------------------------------------------------------


class _Cluster:
    def __init__(self) -> None:
        from torch.distributed import TCPStore

        self.store = TCPStore(
            "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60)
        )
        self.ctx = mp.get_context("spawn")
        self.procs: dict[int, Any] = {}
        self.conns: dict[int, Any] = {}
        self.version = 0
        for r in range(WORLD):  # all start at once; each answers once its data plane is up
            parent, child = self.ctx.Pipe()
            proc = self.ctx.Process(
                target=_worker, args=(child, r, self.store.port, uuid.uuid4().hex), daemon=True
            )
            proc.start()
            child.close()
            self.procs[r], self.conns[r] = proc, parent
        for r in range(WORLD):
            self.reply(r)

    def reply(self, rank: int) -> Any:
        conn = self.conns[rank]
        if not conn.poll(REPLY_S):
            raise RuntimeError(f"gpu bench: rank {rank} did not answer within {REPLY_S} s")
        got = conn.recv()
        if isinstance(got, dict) and "raised" in got:
            raise RuntimeError(f"gpu bench: rank {rank}: {got['raised']}\n{got['trace']}")
        return got

    def call(self, ranks: list[int], cmd: str, *args: Any) -> dict[int, Any]:
        for r in ranks:
            self.conns[r].send((cmd, args))
        return {r: self.reply(r) for r in ranks}

    def commit(self, members: list[int]) -> dict[int, Any]:
        self.version += 1
        return self.call(sorted(self.procs), "install", self.version, members)

    def kill(self, rank: int) -> float:
        proc = self.procs.pop(rank)
        self.conns.pop(rank).close()
        t = time.time()
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        return t

    def close(self) -> None:
        for r in list(self.procs):
            try:
                self.conns[r].send(("close", ()))
                self.conns[r].poll(15)
            except OSError:
                pass
            self.procs[r].join(5)
            if self.procs[r].is_alive():
                self.procs[r].kill()


def _recovery_trial() -> tuple[float, float]:
    """One kill each way: (foldplane's recovery, the baseline's), seconds from the kill."""
    survivors = [0, 1, 2]
    c = _Cluster()
    try:
        c.commit(list(range(WORLD)))
        c.call(list(range(WORLD)), "loop", c.version + 1)
        killed = c.kill(3)
        c.version += 1
        c.call(survivors, "install", c.version, survivors, False)
        done = c.call(survivors, "result")
        ours = max(d["recovered_at"] for d in done.values()) - killed
    finally:
        c.close()
    c = _Cluster()
    try:
        c.call(list(range(WORLD)), "plain_loop")
        killed = c.kill(3)
        got = c.call(survivors, "plain_rebuild", uuid.uuid4().hex[:6], survivors)
        theirs = max(g["recovered_at"] for g in got.values()) - killed
    finally:
        c.close()
    return ours, theirs


def run(quick: bool) -> list[Result]:
    import torch

    if not torch.cuda.is_available():
        print("# gpu: skipped: torch sees no CUDA device", flush=True)
        return []
    results: list[Result] = []
    setting = {"ranks": WORLD, "gpus": 1, "transport": "loopback sockets (NCCL_HOSTID per process)"}
    c = _Cluster()
    try:
        builds = c.commit(list(range(WORLD)))
        first_build = [b["build_s"] for b in builds.values()]
        fresh4: list[float] = []
        shrink43: list[float] = []
        fresh3: list[float] = []
        for _ in range(2 if quick else 4):
            got = c.commit([0, 1, 2])  # survivors only: shrinks the 4-rank communicator
            shrink43 += [g["build_s"] for g in got.values() if g["build_s"] is not None]
            got = c.commit(list(range(WORLD)))  # a rank comes back: a fresh communicator
            fresh4 += [g["build_s"] for g in got.values()]
        c.call(list(range(WORLD)), "shrink", False)
        for _ in range(2 if quick else 4):
            got = c.commit([0, 1, 2])
            fresh3 += [g["build_s"] for g in got.values() if g["build_s"] is not None]
            got = c.commit(list(range(WORLD)))
            fresh4 += [g["build_s"] for g in got.values()]
        c.call(list(range(WORLD)), "shrink", True)
        results.append(
            Result(
                BENCH,
                "nccl view build 4 ranks",
                "s",
                median(fresh4),
                percentile(fresh4, 99),
                baseline="shrink 4 -> 3 (ncclCommShrink)",
                baseline_median=median(shrink43) if shrink43 else None,
                target="reported: install -> communicator connected (first all_reduce done)",
                extra={
                    **setting,
                    "first_view_s": median(first_build),
                    "fresh_4_s": fresh4,
                    "shrink_4_to_3_s": shrink43,
                    "fresh_3_s": fresh3,
                },
            )
        )
        for label, numel, ops, target in (
            ("nccl all_reduce 4 KB latency", 1024, 50 if quick else 200, "<= 1.2"),
            ("nccl all_reduce 64 MB", 16 << 20, 6 if quick else 20, "<= 1.02"),
        ):
            got = c.call(list(range(WORLD)), "latency", numel, ops)
            ours = median([t for g in got.values() for t in g["ours"]])
            plain = median([t for g in got.values() for t in g["plain"]])
            results.append(
                Result(
                    BENCH,
                    label,
                    "x",
                    ours / plain,
                    baseline="plain ProcessGroupNCCL (same processes, ABBA)",
                    target=target,
                    extra={**setting, "foldplane_ms": ours * 1e3, "plain_ms": plain * 1e3},
                )
            )
        got = c.call(list(range(WORLD)), "ddp", 10 if quick else 40)
        ours = median([t for g in got.values() for t in g["ours"]])
        plain = median([t for g in got.values() for t in g["plain"]])
        results.append(
            Result(
                BENCH,
                "ddp step overhead cuda",
                "x",
                ours / plain,
                baseline="torch DDP on a plain NCCL group (same processes, ABBA)",
                target="<= 1.05",
                extra={**setting, "foldplane_ms": ours * 1e3, "plain_ms": plain * 1e3},
            )
        )
    finally:
        c.close()
    trials = [_recovery_trial() for _ in range(2 if quick else 3)]
    ours = [t[0] for t in trials]
    theirs = [t[1] for t in trials]
    results.append(
        Result(
            BENCH,
            "nccl recovery kill 1 of 4 -> first all_reduce on new view",
            "s",
            median(ours),
            max(ours),
            baseline="abort + new ProcessGroupNCCL + first all_reduce",
            baseline_median=median(theirs),
            ratio=higher_is_better_ratio(median(theirs), median(ours)),
            target="<= 0.2 s and >= 5x",
            extra={
                **setting,
                "samples": ours,
                "baseline_samples": theirs,
            },
        )
    )
    return results
