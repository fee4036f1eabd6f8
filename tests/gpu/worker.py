"""A real GPU worker for the GPU suite: a NCCL ``DataPlane`` driven over a pipe.

Like ``tests/dataplane/worker.py`` (the test process hosts the store and commits the views),
with CUDA tensors. Several ranks share the one GPU of a test machine: NCCL refuses two ranks of
one communicator on one device of one host, and decides "one host" from ``NCCL_HOSTID``, so each
process sets a value of its own before its first NCCL call and NCCL moves data between them over
loopback sockets. That is a test arrangement only: a production rank has a GPU of its own.

Every result is read with ``.tolist()`` right after ``wait()`` (or the synchronous call, or the
future), without any ``torch.cuda.synchronize()``: ``.tolist()`` copies on the caller's current
stream, so a value is right only if the operation was ordered before that stream's later work.
"""

from __future__ import annotations

import os
import time
from multiprocessing.connection import Connection
from typing import Any

#: What several NCCL ranks on one GPU need (each process adds its own ``NCCL_HOSTID``).
SHARED_GPU_ENV = {
    "NCCL_SOCKET_IFNAME": "lo",
    "NCCL_IB_DISABLE": "1",
    "NCCL_P2P_DISABLE": "1",
    "NCCL_SHM_DISABLE": "1",
}


def share_gpu(rank: int, incarnation: str) -> None:
    """Make this process a NCCL "host" of its own (before its first NCCL call)."""
    os.environ.update(SHARED_GPU_ENV)
    os.environ["NCCL_HOSTID"] = f"foldplane-test-{rank}-{incarnation[:8]}"


def main(
    conn: Connection,
    rank: int,
    world_size: int,
    port: int,
    incarnation: str,
    options: dict[str, Any],
) -> None:
    share_gpu(rank, incarnation)
    import torch

    from tests.dataplane.worker import serve

    options = dict(options)
    backend = options.pop("backend", "nccl")
    graphs: dict[str, Any] = {}
    serve(
        conn,
        rank,
        world_size,
        port,
        incarnation,
        {
            **options,
            "backend": backend,
            "device": torch.device("cuda", 0) if backend == "nccl" else None,
        },
        {
            "op": lambda pg, conn, *a: run_op(pg, rank, world_size, *a, conn=conn),
            "graph": lambda pg, conn, *a: run_graph(pg, rank, graphs, *a, conn=conn),
        },
    )


def _summary(t: Any) -> Any:
    """A tensor's values as (min, max) over each row of ``t.view(rows, -1)``, read on the
    current stream (``.tolist()``); a list of tensors, each summarised."""
    import torch

    if isinstance(t, list):
        return [_summary(x) for x in t]
    if not isinstance(t, torch.Tensor):
        return t
    flat = t.reshape(-1)
    return [flat.min().item(), flat.max().item()]


def run_op(
    pg: Any,
    rank: int,
    world_size: int,
    name: str,
    kw: dict[str, Any],
    *,
    conn: Connection,
) -> dict[str, Any]:
    """One operation; ``kw``: ``device`` (cuda|cpu), ``mode`` (async|sync|future|then),
    ``numel``, ``announce`` (send ``{"issued": True}`` before waiting), ``device_sync``
    (``torch.cuda.synchronize()`` after the hint, to prove no kernel is left hanging)."""
    import torch

    device = torch.device("cuda", 0) if kw.get("device", "cuda") == "cuda" else torch.device("cpu")
    n = int(kw.get("numel", 1 << 18))
    mode = kw.get("mode", "async")
    async_op = mode != "sync"
    torch.cuda.synchronize()  # inputs ready and idle GPU before the clock starts
    start = time.monotonic()
    if name == "all_reduce":
        out = torch.full((n,), float(rank + 1), device=device)
        work = pg.all_reduce(out, async_op=async_op)
    elif name == "broadcast":
        out = torch.full((n,), float(rank), device=device)
        work = pg.broadcast(out, src=kw["src"], async_op=async_op)
    elif name == "all_gather":
        out = [torch.full((n,), -1.0, device=device) for _ in range(world_size)]
        work = pg.all_gather(out, torch.full((n,), float(rank), device=device), async_op=async_op)
    elif name == "reduce_scatter":
        inputs = [torch.full((n,), float(rank * 10 + j), device=device) for j in range(world_size)]
        out = torch.full((n,), -1.0, device=device)
        work = pg.reduce_scatter(out, inputs, async_op=async_op)
    elif name == "allreduce_coalesced":
        out = [torch.full((n,), float(rank + 1 + i), device=device) for i in range(3)]
        work = pg.allreduce_coalesced(out)
        if mode == "sync":
            work.wait()
    elif name == "send":
        out = torch.full((n,), float(100 + rank), device=device)
        work = pg.send(out, dst=kw["dst"], async_op=async_op)
    elif name == "recv":
        out = torch.full((n,), -1.0, device=device)
        work = pg.recv(out, src=kw["src"], async_op=async_op)
    elif name == "barrier":
        out = None
        work = pg.barrier(async_op=async_op)
    else:
        raise ValueError(f"unknown op {name!r}")
    if kw.get("announce"):
        conn.send({"issued": True})
    if mode == "future":
        work.get_future().wait()
        ok = work.wait()
    elif mode == "then":  # a callback's result, computed on the caller's stream
        doubled = work.get_future().then(lambda f: [t * 2 for t in f.value()]).wait()
        ok = work.wait()
        out = doubled if isinstance(out, list) else doubled[0]
    else:
        ok = work.wait()
    after = None
    if ok and kw.get("enqueue_after") and isinstance(out, torch.Tensor):
        after = _summary(out * 3)  # work enqueued after wait() sees the result
    summary = _summary(out)  # read before anything else touches the stream
    elapsed = time.monotonic() - start
    hint = pg.get_failed_ranks_hint(work)
    answer = {
        "ok": ok,
        "hint": hint.tolist(),
        "hint_device": str(hint.device),
        "out": summary,
        "after": after,
        "elapsed": elapsed,
        "version": pg.version,
    }
    if kw.get("device_sync"):
        t0 = time.monotonic()
        torch.cuda.synchronize()
        answer["device_sync_s"] = time.monotonic() - t0
    return answer


def run_graph(
    pg: Any, rank: int, graphs: dict[str, Any], action: str, kw: dict[str, Any], *, conn: Connection
) -> dict[str, Any]:
    """CUDA graphs: ``capture`` an all-reduce of a static tensor, ``replay`` it with new input."""
    import torch

    from foldplane.agent.dataplane import DataPlaneError

    if action == "capture":
        x = torch.zeros(int(kw.get("numel", 1 << 16)), device="cuda:0")
        warm = pg.all_reduce(x, async_op=True)  # the view's communicator exists before capture
        warm.wait()
        graph = torch.cuda.CUDAGraph()
        with pg.capture(graph):  # torch.cuda.graph(graph), with the view recorded
            pg.all_reduce(x, async_op=True).wait()
        graphs["g"] = (graph, x)
        return {"captured": True, "version": pg.version}
    graph, x = graphs["g"]
    x.fill_(float(rank + 1 + kw.get("round", 0)))
    start = time.monotonic()
    try:
        work = pg.replay(graph)
    except DataPlaneError as e:
        return {"refused": str(e)}
    if kw.get("announce"):
        conn.send({"issued": True})
    ok = work.wait()
    summary = _summary(x)
    elapsed = time.monotonic() - start
    hint = pg.get_failed_ranks_hint(work)
    out = {"ok": ok, "out": summary, "hint": hint.tolist(), "elapsed": elapsed}
    if kw.get("device_sync"):
        torch.cuda.synchronize()
        out["device_synced"] = True
    return out
