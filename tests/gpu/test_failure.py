"""A death ends every survivor's NCCL operation fast, names the dead rank, and the next views work.

Rank 3 is SIGKILLed while ranks 0-2 wait in an all-reduce on the GPU. The survivors' ``wait()``
returns False well inside the collective timeout (30 s here) with the hint ``[0, 0, 0, 1]``; a
device-wide synchronize afterwards returns (the view's communicator was aborted on every
survivor, so no kernel is left hanging, and no survivor was killed by torch's own NCCL error
handling); the survivors-only view reduces; a replacement joins the next view.
"""

from __future__ import annotations

#: The survivors must know well before the 30 s deadline: NCCL's own error on the dead peer's
#: sockets, the liveness counters (0.3 s window), then the poison notice to every member.
FAST_S = 8.0


def _kill_while_waiting(cluster, victim: int, survivors: list[int], cmd: str, args: tuple) -> dict:
    cluster.start({r: (cmd, args) for r in survivors})
    for r in survivors:  # each has issued its operation and is waiting in it
        assert cluster._reply(r) == {"issued": True}
    cluster.kill(victim)
    return cluster.collect(survivors)


def test_sigkill_mid_all_reduce_fails_survivors_fast_and_the_next_views_reduce(gpu_cluster) -> None:
    cluster = gpu_cluster(4)
    cluster.commit([0, 1, 2, 3])
    warm = cluster.op([0, 1, 2, 3], "all_reduce", numel=1024)
    assert all(warm[r]["ok"] for r in range(4))

    survivors = [0, 1, 2]
    args = ("all_reduce", {"numel": 1 << 20, "announce": True, "device_sync": True})
    got = _kill_while_waiting(cluster, 3, survivors, "op", args)
    for r in survivors:
        assert got[r]["ok"] is False, got[r]
        assert got[r]["hint"] == [0, 0, 0, 1], got[r]
        assert got[r]["elapsed"] < FAST_S, got[r]
        assert got[r]["device_sync_s"] < FAST_S, got[r]  # no kernel left hanging

    cluster.commit(survivors)
    after = cluster.op(survivors, "all_reduce", numel=1 << 16)
    for r in survivors:
        assert after[r]["ok"] and after[r]["out"] == [6.0, 6.0], after[r]

    cluster.spawn(3)  # the replacement: a new incarnation, in the next view
    cluster.commit([0, 1, 2, 3])
    full = cluster.op([0, 1, 2, 3], "all_reduce", numel=1 << 16)
    for r in range(4):
        assert full[r]["ok"] and full[r]["out"] == [10.0, 10.0], full[r]


def test_a_death_during_a_cpu_operation_fails_the_cuda_side_of_the_view_too(gpu_cluster) -> None:
    cluster = gpu_cluster(4)
    cluster.commit([0, 1, 2, 3])
    both = cluster.op([0, 1, 2, 3], "all_reduce", numel=1024, device="cuda")
    assert all(both[r]["ok"] for r in range(4))
    survivors = [0, 1, 2]
    args = ("all_reduce", {"numel": 1 << 16, "device": "cpu", "announce": True})
    got = _kill_while_waiting(cluster, 3, survivors, "op", args)
    assert all(got[r]["ok"] is False and got[r]["hint"] == [0, 0, 0, 1] for r in survivors), got
    cuda = cluster.op(survivors, "all_reduce", numel=1024, device="cuda")
    for r in survivors:  # the same view: fails at once with the same hint
        assert cuda[r]["ok"] is False and cuda[r]["hint"] == [0, 0, 0, 1], cuda[r]
        assert cuda[r]["elapsed"] < FAST_S
