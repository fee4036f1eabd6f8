"""A refit worker: a real Agent of the trainer or generator group, the refit's control plane
through the refits facet's worker part (``facets/refits/worker.py``) and its data plane
through ``agent.refit``.

Arguments: ``OUT KEYS [DIE_AT RANK [SIDE]]``. For each transfer key in ``KEYS`` (comma-separated) the
worker joins the refit's current epoch with its slot (its rank) and the plan's digest, shares
the bootstrap (publisher slot 0 hosts the store and offers it with its join), takes the
transfer's running attempt, moves its shards and reports; an attempt that fails (a dead member,
an epoch that moved) is joined again and retried until the transfer completes. The trainers'
weights for key ``k`` are ``tests.refit.worker.full_state(seed_of(k))``; a generator writes
what it received as tensor digests, one JSON line per event to stdout (with the wall clock,
``at``). With ``DIE_AT`` equal to a key, ``SIDE`` (``subscriber``, the default, or
``publisher``) slot ``RANK`` SIGKILLs itself in that transfer's first attempt, once its world is
open and before it moves a byte (the others are then mid-transfer); only once (a marker file in
``OUT``), so its replacement, started with the same arguments, lives. Publisher slot 0 hosts the
world's store: its death takes the store with it. Every world follows the coordinator's verdict
on its epoch (``RefitClient.verdict``). A replacement (its rank
not active when it starts) activates itself once HEALTHY.

With ``GPU_TEST_DEVICE=cuda:0`` (the GPU suite, ``tests/gpu``) the worlds are NCCL worlds and the
shards live on that GPU; the six processes share it as ``tests/gpu/worker.py`` describes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
import zlib

from foldplane.agent import Agent
from foldplane.agent.refit import RefitError, RefitStore, empty_shards, local_shards, open_world
from foldplane.facets.refits.worker import RefitEpochMoved, RefitRefused, TransferFailed
from foldplane.wire.refit import MeshSpec, digest, make_plan, megatron_layout
from tests.refit.worker import full_state, tensor_hash

TRAINER = MeshSpec(name="trainer", size=2, tp=2)
GENERATOR = MeshSpec(name="generator", size=4, tp=4)
#: the GPU suite's device (None: the CPU, gloo worlds)
GPU = os.environ.get("GPU_TEST_DEVICE") or None


def emit(event: str, **fields: object) -> None:
    # one write per line (the newline with it): workers share a pipe, and with
    # PYTHONUNBUFFERED print() writes the newline apart, so lines could interleave
    print(json.dumps({"event": event, "at": time.time(), **fields}) + "\n", end="", flush=True)


def seed_of(key: str) -> int:
    return zlib.crc32(key.encode()) % 10_000


def the_plan():
    from foldplane.agent.refit import roles_from_modules, tensors_of
    from tests.refit.worker import build_model

    model = build_model(0)
    roles = roles_from_modules(
        model,
        column=[model["embed"], model["qkv"], model["up"]],
        row=[model["proj"], model["down"]],
        rest="replicated",
    )
    shapes = tensors_of(model.state_dict())
    return make_plan(
        megatron_layout(TRAINER, shapes, roles),
        megatron_layout(GENERATOR, shapes, roles),
        misc=("norm.weight", "norm.bias"),
    )


def _first(out_dir: str) -> bool:
    """True for exactly one process ever (the file is created atomically): the victim dies
    once, and its replacement, started with the same arguments, lives."""
    try:
        os.close(os.open(os.path.join(out_dir, "died"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def main() -> int:
    out_dir, keys = sys.argv[1], sys.argv[2].split(",")
    die_at, victim = (sys.argv[3], int(sys.argv[4])) if len(sys.argv) > 4 else (None, -1)
    victim_side = sys.argv[5] if len(sys.argv) > 5 else "subscriber"
    if GPU is not None:
        from tests.gpu.worker import share_gpu

        share_gpu(int(os.environ["RANK"]), os.environ["FOLDPLANE_INCARNATION"])
    world_backend = "gloo" if GPU is None else "nccl"
    agent = Agent(heartbeat_interval_s=0.25, backend="gloo")
    agent.start()
    side = "publisher" if agent.group == "train" else "subscriber"
    slot = agent.rank
    emit("started", rank=slot, side=side, incarnation=agent.incarnation)
    view = agent.wait_for_view(timeout=300)
    if not view.is_active(agent.rank):
        agent.wait_for_state("HEALTHY", timeout=60)
        agent.activate_ranks([agent.rank], wait_s=60)
        emit("activated")
    plan = the_plan()
    client = agent.refit("rl")
    store = RefitStore() if (side, slot) == ("publisher", 0) else None
    world, world_epoch = None, None
    for key in keys:
        while True:
            make = (lambda: store.bootstrap(world_backend)) if store else None
            # publisher slot 0 offers the bootstrap with its join: it comes with the admission
            admitted = client.join(slot=slot, digest=digest(plan), timeout=300, make_bootstrap=make)
            try:
                boot = client.bootstrap(admitted, make=make)
                t = client.transfer(admitted, key)
            except RefitEpochMoved:
                continue
            if t.status == "completed":
                emit("skipped", key=key)
                break
            try:
                if world is None or world.closed or world_epoch != admitted.epoch:
                    if world is not None:
                        world.close()
                    world = open_world(
                        plan,
                        side,
                        slot,
                        boot,
                        admitted.lanes,
                        timeout_s=30,
                        device=GPU,
                        verdict=client.verdict(admitted),
                    )
                    world_epoch = admitted.epoch
                if (key, side, slot) == (die_at, victim_side, victim) and _first(out_dir):
                    emit("dying", key=key, attempt=t.attempt)
                    os.kill(os.getpid(), signal.SIGKILL)
                if side == "publisher":
                    tensors = local_shards(full_state(seed_of(key)), plan, side, slot)
                    if GPU is not None:
                        tensors = {n: v.to(GPU) for n, v in tensors.items()}
                else:
                    tensors = empty_shards(plan, side, slot, device=GPU or "cpu")
                world.transfer(tensors)
                client.report(t, ok=True)
                client.wait_transfer(t, timeout=120)
            except (RefitError, RefitRefused) as exc:
                emit("attempt_failed", key=key, attempt=t.attempt, epoch=t.epoch, why=str(exc))
                if not isinstance(exc, (RefitEpochMoved, TransferFailed)):
                    with contextlib.suppress(RefitRefused):  # already failed, or moved on
                        client.report(t, ok=False, detail=str(exc))
                continue
            hashes = (
                {n: tensor_hash(v.cpu()) for n, v in tensors.items()}
                if side == "subscriber"
                else {}
            )
            emit("transferred", key=key, attempt=t.attempt, epoch=t.epoch, hashes=hashes)
            break
    if world is not None:
        world.close()
    emit("done")
    agent.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
