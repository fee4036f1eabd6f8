"""A worker started without the launcher, as torchrun, Slurm or Kubernetes start one: it forms
its group, all-reduces, lives through a view change that leaves an all-reduce behind on the old
view, and exits. Its exit code is the test's answer (``tests/agent/test_clean_exit.py``).

The identity comes from ``FOLDPLANE_*``; the group has three ranks. Each process forks a child
that lives as long as it does and holds copies of its sockets, as a ``DataLoader`` worker does:
a peer's connections then stay open until that peer's whole process tree has exited.

1. Two all-reduces on view 1 (every rank).
2. Ranks 0 and 1 start a third one that rank 2 never joins: it can only end by an error.
3. Rank 2 proposes its own deactivation; view 2 is ``[0, 1]``; ranks 0 and 1 all-reduce on it.
4. Every rank closes its agent and returns 0; the all-reduce left on view 1 is still waiting on
   rank 2's connections, which close when rank 2's process tree exits, about when the others
   exit too.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch

from foldplane.agent import Agent


def hold_sockets_in_a_child() -> None:
    """Fork a child that holds this process's descriptors until this process exits (it reads
    the pipe whose write end only this process holds, and leaves open until its exit)."""
    read_end, write_end = os.pipe()
    if os.fork() == 0:
        os.close(write_end)
        os.read(read_end, 1)  # EOF once the parent is gone
        os._exit(0)
    os.close(read_end)


def all_reduce(pg: Any, expected: float, what: str) -> None:
    tensor = torch.ones(4096)
    ok = pg.all_reduce(tensor, async_op=True).wait()
    if not ok or tensor[0].item() != expected:
        raise SystemExit(f"{what}: ok={ok}, got {tensor[0].item()}, expected {expected}")


def main() -> int:
    timeout_s = float(sys.argv[1]) if len(sys.argv) > 1 else 30.0
    agent = Agent(
        heartbeat_interval_s=0.25, collective_timeout_s=timeout_s, p2p_timeout_s=timeout_s
    ).start()
    rank = agent.rank
    pg = agent.process_group()
    agent.wait_for_view(lambda v: v.version == 1, timeout=60)
    all_reduce(pg, 3, "the first all-reduce on view 1")
    hold_sockets_in_a_child()
    all_reduce(pg, 3, "the second all-reduce on view 1")
    store = agent.data_plane.control_store()
    if rank < 2:
        view = agent.data_plane.current_view()
        left_behind = pg.all_reduce(torch.ones(4096), async_op=True, view=view)  # noqa: F841
        store.set(f"exit-worker/issued/{rank}", "1")
        agent.wait_for_view(lambda v: list(v.active_ranks) == [0, 1], timeout=60)
        all_reduce(pg, 2, "the all-reduce on view 2")
        store.set(f"exit-worker/done/{rank}", "1")
    else:
        store.wait(["exit-worker/issued/0", "exit-worker/issued/1"])
        proposal = agent.deactivate_ranks([2])
        if proposal.get("status") != "applied":
            raise SystemExit(f"rank 2's deactivation: {proposal}")
        store.wait(["exit-worker/done/0", "exit-worker/done/1"])
    agent.close()
    print(f"rank {rank}: closed", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
