"""A real worker process for the data plane tests: a DataPlane driven over a pipe.

The test process plays the coordinator: it hosts the TCPStore, decides the views and sends
each worker commands (install a view, run an operation, inject a link failure); the worker
answers with plain values (outcome, hint, tensor contents), so assertions live in the tests.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import torch


def main(
    conn: Connection,
    rank: int,
    world_size: int,
    port: int,
    incarnation: str,
    options: dict[str, Any],
) -> None:
    serve(conn, rank, world_size, port, incarnation, options)


#: A command of a worker: ``handler(pg, conn, *args)`` returns the answer.
Handler = Callable[..., Any]


def serve(
    conn: Connection,
    rank: int,
    world_size: int,
    port: int,
    incarnation: str,
    options: dict[str, Any],
    commands: dict[str, Handler] | None = None,
) -> None:
    """A DataPlane driven over ``conn``: install, op, inject, evidence, close, and ``commands``
    (the GPU worker's own). An error goes back to the test by type and message."""
    from foldplane.agent.dataplane import DataPlane

    evidence: list[tuple[int, dict[int, str], list[int]]] = []
    dp = DataPlane(
        rank,
        world_size,
        "127.0.0.1",
        port,
        incarnation=incarnation,
        on_link_evidence=lambda v, peers, failed: evidence.append((v, dict(peers), list(failed))),
        **options,
    )
    pg = dp.process_group()
    handlers: dict[str, Handler] = {
        "install": lambda _pg, _conn, *a: dp.install_view(*a),
        "op": lambda pg, conn, *a: run_op(pg, rank, world_size, *a),
        "inject": lambda _pg, _conn, *a: dp.inject_link_failure(*a),
        # (backends built, reconfigures done) of the gloo backend views reconfigure, or None
        "gloo": lambda _pg, _conn: (
            None
            if dp.persistent_gloo is None
            else (dp.persistent_gloo.built, dp.persistent_gloo.reconfigured)
        ),
        **(commands or {}),
    }
    conn.send({"pid": os.getpid(), "incarnation": incarnation})
    while True:
        cmd, args = conn.recv()
        try:
            if cmd == "evidence":
                answer, evidence[:] = list(evidence), []
            elif cmd == "close":
                dp.close()
                conn.send(None)
                return
            elif cmd in handlers:
                answer = handlers[cmd](pg, conn, *args)
            else:
                raise ValueError(f"unknown command {cmd!r}")
            conn.send(answer)
        except Exception as e:  # the test sees the error, by type and message
            conn.send(
                {"raised": type(e).__name__, "message": str(e), "trace": traceback.format_exc()}
            )


def run_op(
    pg: Any, rank: int, world_size: int, name: str, kwargs: dict[str, Any]
) -> dict[str, Any]:
    """Run one operation with tensors that encode who sent what; report outcome, hint and data."""
    start = time.monotonic()
    out: Any
    if name == "all_reduce":
        t = torch.full((4,), float(rank + 1))
        work = pg.all_reduce(t, async_op=True)
        out = t
    elif name == "broadcast":
        t = torch.full((4,), float(rank))
        work = pg.broadcast(t, src=kwargs["src"], async_op=True)
        out = t
    elif name == "all_gather":
        outs = [torch.full((2,), -1.0) for _ in range(world_size)]
        work = pg.all_gather(outs, torch.full((2,), float(rank)), async_op=True)
        out = outs
    elif name == "reduce_scatter":
        inputs = [torch.full((2,), float(rank * 10 + j)) for j in range(world_size)]
        t = torch.full((2,), -1.0)
        work = pg.reduce_scatter(t, inputs, async_op=True)
        out = t
    elif name == "barrier":
        work = pg.barrier(async_op=True)
        out = None
    elif name == "send":
        t = torch.full((4,), float(100 + rank))
        work = pg.send(t, dst=kwargs["dst"], async_op=True)
        out = t
    elif name == "recv":
        t = torch.full((4,), -1.0)
        work = pg.recv(t, src=kwargs["src"], async_op=True)
        out = t
    else:
        raise ValueError(f"unknown op {name!r}")
    ok = work.wait()
    elapsed = time.monotonic() - start
    hint = pg.get_failed_ranks_hint(work)
    return {
        "ok": ok,
        "hint": hint.tolist(),
        "hint_dtype": str(hint.dtype),
        "out": _plain(out),
        "elapsed": elapsed,
        "version": pg.version,
    }


def _plain(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.tolist()
    if isinstance(x, list):
        return [_plain(v) for v in x]
    return x
