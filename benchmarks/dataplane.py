"""The data plane's cost: a 1 MB all_reduce across 4 gloo processes, ours versus raw torch.

Both run in the same 4 processes, over the same TCPStore (hosted here, as the coordinator
hosts it), alternating op by op (ABBA) so that the shared machine's noise hits both alike:
- **raw**: ``init_process_group("gloo")`` and ``dist.all_reduce`` (the baseline);
- **foldplane**: ``DataPlane`` + ``install_view`` + ``ElasticProcessGroup.all_reduce``, reading
  the hint of every op (``get_failed_ranks_hint``), as a careful training loop would.
Target: at most 3% over raw (ratio = raw median / ours >= 0.97).

A second part measures a failure: a rank is SIGKILLed while the 3 others are in an all_reduce;
reported are the time from the kill until the survivors' ``wait()`` returns False (fail fast),
until the hint is decided, and until the first all_reduce in the next view succeeds.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
import uuid
import warnings
from datetime import timedelta
from typing import Any

from .harness import Result, lower_is_better_ratio, median, percentile

WORLD = 4
NUMEL = 262_144  # 1 MB of float32
BENCH = "dataplane"


def _overhead_worker(rank: int, port: int, ops: int, out: Any) -> None:
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist
    from torch.distributed import PrefixStore, TCPStore

    from ..agent.dataplane import DataPlane

    store = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=PrefixStore("raw/", store), rank=rank, world_size=WORLD)
    dp = DataPlane(rank, WORLD, "127.0.0.1", port, incarnation=uuid.uuid4().hex)
    dp.install_view(1, list(range(WORLD)))
    pg = dp.process_group()
    t = torch.ones(NUMEL)

    def raw() -> None:
        dist.all_reduce(t)

    def ours() -> None:
        work = pg.all_reduce(t)
        if not work.wait():
            raise RuntimeError(f"all_reduce failed: {pg.get_failed_ranks_hint(work).tolist()}")
        pg.get_failed_ranks_hint(work)

    times: dict[str, list[float]] = {"raw": [], "ours": []}
    for _ in range(20):  # warm both paths up
        raw()
        ours()
    # ABBA, op by op: both paths see the same moment of a noisy shared machine, in both orders.
    for i in range(ops):
        for name, fn in (
            (("raw", raw), ("ours", ours)) if i % 2 == 0 else (("ours", ours), ("raw", raw))
        ):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    out.put((rank, times))
    dp.close()
    dist.destroy_process_group()


def _failure_worker(rank: int, port: int, conn: Any) -> None:
    warnings.filterwarnings("ignore")
    import torch

    from ..agent.dataplane import DataPlane

    dp = DataPlane(
        rank, WORLD, "127.0.0.1", port, incarnation=uuid.uuid4().hex, collective_timeout_s=10.0
    )
    pg = dp.process_group()
    conn.send("up")
    while True:
        cmd, arg = conn.recv()
        if cmd == "install":
            dp.install_view(*arg)
            conn.send(None)
        elif cmd == "all_reduce":
            work = pg.all_reduce(torch.ones(NUMEL), async_op=True)
            ok = work.wait()
            returned = time.time()
            hint = pg.get_failed_ranks_hint(work).tolist()
            conn.send({"ok": ok, "returned": returned, "decided": time.time(), "hint": hint})
        elif cmd == "stop":
            dp.close()
            conn.send(None)
            return


def _measure_overhead(quick: bool) -> list[Result]:
    from torch.distributed import TCPStore

    ops = 200 if quick else 1000
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_overhead_worker, args=(r, store.port, ops, out)) for r in range(WORLD)
    ]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(30)
    # Rank 0's per-op times (every rank waits for the slowest, so one rank's view suffices).
    raw_ms = [s * 1e3 for s in results[0]["raw"]]
    ours_ms = [s * 1e3 for s in results[0]["ours"]]
    raw_med, ours_med = median(raw_ms), median(ours_ms)
    return [
        Result(
            BENCH,
            "all_reduce 1 MB, 4 gloo processes",
            "ms",
            ours_med,
            p99=percentile(ours_ms, 99),
            baseline="raw torch.distributed",
            baseline_median=raw_med,
            ratio=lower_is_better_ratio(ours_med, raw_med),
            target=">= 0.97x (at most 3% overhead)",
            extra={"ops": len(ours_ms), "raw_p99": percentile(raw_ms, 99)},
        )
    ]


def _measure_failure(quick: bool) -> list[Result]:
    from torch.distributed import TCPStore

    cycles = 2 if quick else 6
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    procs: dict[int, Any] = {}
    conns: dict[int, Any] = {}

    def spawn(rank: int) -> None:
        parent, child = ctx.Pipe()
        procs[rank] = ctx.Process(
            target=_failure_worker, args=(rank, store.port, child), daemon=True
        )
        procs[rank].start()
        conns[rank] = parent

    def call(ranks: list[int], cmd: str, arg: Any = None) -> dict[int, Any]:
        for r in ranks:
            conns[r].send((cmd, arg))
        return {r: conns[r].recv() for r in ranks}

    for r in range(WORLD):
        spawn(r)
    for r in range(WORLD):
        conns[r].recv()
    version = 0
    fail_fast, decided, recovered = [], [], []
    for cycle in range(cycles):
        victim = WORLD - 1 - cycle % WORLD
        survivors = [r for r in range(WORLD) if r != victim]
        version += 1
        call(list(range(WORLD)), "install", (version, list(range(WORLD))))
        assert all(r["ok"] for r in call(list(range(WORLD)), "all_reduce").values())
        for r in survivors:
            conns[r].send(("all_reduce", None))
        time.sleep(0.05)  # let the survivors enter the op
        killed = time.time()
        os.kill(procs[victim].pid, signal.SIGKILL)
        procs[victim].join(10)
        got = {r: conns[r].recv() for r in survivors}
        if any(g["ok"] or g["hint"].index(1) != victim for g in got.values()):
            raise RuntimeError(f"cycle {cycle}: survivors did not blame rank {victim}: {got}")
        fail_fast.append(max(g["returned"] for g in got.values()) - killed)
        decided.append(max(g["decided"] for g in got.values()) - killed)
        version += 1
        call(survivors, "install", (version, survivors))
        res = call(survivors, "all_reduce")
        if not all(g["ok"] for g in res.values()):
            raise RuntimeError(f"cycle {cycle}: the view without rank {victim} failed: {res}")
        recovered.append(max(g["returned"] for g in res.values()) - killed)
        spawn(victim)
        conns[victim].recv()
    call(list(range(WORLD)), "stop")
    ms = lambda xs: [x * 1e3 for x in xs]  # noqa: E731
    extra = {"cycles": cycles, "liveness_window_s": 0.3}
    return [
        Result(
            BENCH,
            "kill -> survivors' wait() returns False",
            "ms",
            median(ms(fail_fast)),
            p99=max(ms(fail_fast)),
            target="tens of ms, not the gloo timeout (10 s here)",
            extra=extra,
        ),
        Result(
            BENCH,
            "kill -> hint decided on every survivor",
            "ms",
            median(ms(decided)),
            p99=max(ms(decided)),
            extra=extra,
        ),
        Result(
            BENCH,
            "kill -> first all_reduce ok in the next view",
            "ms",
            median(ms(recovered)),
            p99=max(ms(recovered)),
            extra={
                **extra,
                "note": "the view is committed at once here; a coordinator adds its barrier",
            },
        ),
    ]


def run(quick: bool) -> list[Result]:
    return _measure_overhead(quick) + _measure_failure(quick)
