"""One refit member in its own process, driven over a pipe by the test (playing the control
plane: it hands out plans as JSON, bootstraps and lane counts)."""

from __future__ import annotations

import hashlib
import time
import traceback
import warnings
from typing import Any


def build_model(seed: int) -> Any:
    """A small transformer-shaped model: embedding, fused qkv (bfloat16), projections, norm."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    model = nn.ModuleDict(
        {
            "embed": nn.Embedding(64, 32),
            "qkv": nn.Linear(32, 96),
            "proj": nn.Linear(32, 32),
            "up": nn.Linear(32, 128, bias=False),
            "down": nn.Linear(128, 32),
            "norm": nn.LayerNorm(32),
        }
    )
    model["qkv"].to(torch.bfloat16)
    with torch.no_grad():
        model["norm"].weight.normal_()
        model["norm"].bias.normal_()
    return model


def full_state(seed: int) -> dict[str, Any]:
    return {k: v.detach().clone() for k, v in build_model(seed).state_dict().items()}


def tensor_hash(t: Any) -> str:
    import torch

    return hashlib.sha256(
        t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    ).hexdigest()


def main(conn: Any, side: str, slot: int) -> None:
    warnings.filterwarnings("ignore")
    from foldplane.agent.refit import (
        RefitClosed,
        RefitError,
        RefitFailed,
        RefitStore,
        empty_shards,
        local_shards,
        open_world,
    )
    from foldplane.wire.refit import decode_plan

    hosted: RefitStore | None = None
    world = None
    tensors: dict[str, Any] = {}
    conn.send("up")
    while True:
        cmd, *args = conn.recv()
        try:
            if cmd == "bootstrap":
                hosted = hosted or RefitStore()
                conn.send(hosted.bootstrap("gloo"))
            elif cmd == "open":
                plan_json, bootstrap, lanes, seed, options = args
                plan = decode_plan(plan_json)
                if side == "publisher":
                    tensors = local_shards(full_state(seed), plan, "publisher", slot)
                else:
                    tensors = empty_shards(plan, "subscriber", slot)
                    for t in tensors.values():
                        t.fill_(7)  # anything but the weights
                try:
                    world = open_world(plan, side, slot, bootstrap, lanes, **options)
                    conn.send(("opened",))
                except RefitError as e:
                    conn.send(("refused", type(e).__name__, str(e)))
            elif cmd == "transfer":
                assert world is not None
                conn.send(("started",))
                try:
                    report = world.transfer(tensors)
                    hashes = {n: tensor_hash(t) for n, t in tensors.items()}
                    conn.send(("ok", report.bytes_sent, report.bytes_received, hashes))
                except RefitFailed as e:
                    failed_at = time.time()
                    dead = [(p.side, p.slot) for p in e.dead]
                    conn.send(("failed", str(e), dead, failed_at))
            elif cmd == "reuse":
                assert world is not None
                try:
                    world.transfer(tensors)
                    conn.send(("reused",))
                except RefitClosed as e:
                    conn.send(("closed", str(e)))
            elif cmd == "close":
                if world is not None:
                    world.close()
                conn.send(("closed",))
            elif cmd == "stop":
                if world is not None:
                    world.close()
                conn.send(("stopped",))
                return
        except Exception:  # the test shows it
            conn.send(("error", traceback.format_exc()))
