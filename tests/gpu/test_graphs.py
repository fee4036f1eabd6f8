"""A collective of the foldplane group captured in a CUDA graph: replayed right, failures reported.

What is supported (docs/gpu.md): ``pg.capture(graph)`` around the capture (the view's NCCL
communicator must exist: one operation on the view first), ``pg.replay(graph)`` to replay it
with a ``Work`` that fails like any operation; a graph captured on a view that is no longer
installed is refused (its communicator belongs to the old view): capture it again.
"""

from __future__ import annotations

FAST_S = 8.0


def test_capture_replay_kill_and_recapture(gpu_cluster) -> None:
    cluster = gpu_cluster(4)
    cluster.commit([0, 1, 2, 3])
    ranks = [0, 1, 2, 3]
    got = cluster.call_all({r: ("graph", ("capture", {})) for r in ranks})
    assert all(got[r]["captured"] for r in ranks), got
    for round_ in range(3):
        got = cluster.call_all({r: ("graph", ("replay", {"round": round_})) for r in ranks})
        expected = float(sum(r + 1 + round_ for r in ranks))
        for r in ranks:
            assert got[r]["ok"] and got[r]["out"] == [expected, expected], (round_, got[r])

    survivors = [0, 1, 2]
    cluster.start(
        {r: ("graph", ("replay", {"announce": True, "device_sync": True})) for r in survivors}
    )
    for r in survivors:
        assert cluster._reply(r) == {"issued": True}
    cluster.kill(3)
    got = cluster.collect(survivors)
    for r in survivors:
        assert got[r]["ok"] is False and got[r]["hint"] == [0, 0, 0, 1], got[r]
        assert got[r]["elapsed"] < FAST_S and got[r]["device_synced"], got[r]

    cluster.commit(survivors)
    got = cluster.call_all({r: ("graph", ("replay", {})) for r in survivors})
    assert all("view 1" in got[r]["refused"] for r in survivors), got
    got = cluster.call_all({r: ("graph", ("capture", {})) for r in survivors})
    got = cluster.call_all({r: ("graph", ("replay", {})) for r in survivors})
    for r in survivors:
        assert got[r]["ok"] and got[r]["out"] == [6.0, 6.0], got[r]
