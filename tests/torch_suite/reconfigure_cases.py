"""The rank side of ``test_reconfigure.py``: torch's reconfigure contract, case by case, run by
each of the 3 rank processes on one backend (``"gloo"`` with ``enable_reconfigure=True``, or
``"foldplane"`` with it, over a real coordinator), and the foldplane-only cases.

Every rank runs the same case function; handles and barriers go through a ``TCPStore`` that the
test serves for the case (torch's reconfigure exchanges handles out of band; on gloo it is the
bootstrap store its reconfigures rendezvous on). A case asserts what the rank sees; the test
collects each rank's outcome.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

WORLD = 3
TIMEOUT = timedelta(seconds=60)
#: How long a read of a case's store waits (as a FileStore's reads do by default).
STORE = timedelta(seconds=300)


@dataclass
class Rank:
    """One rank's side of a case."""

    backend: str
    rank: int
    store: dist.Store

    @property
    def foldplane(self) -> bool:
        return self.backend == "foldplane"

    def init(self, *, reconfigure: bool = True) -> dist.ProcessGroup:
        """torch's ``init_process_group(..., enable_reconfigure=True)`` on this backend: gloo
        on the test's store; foldplane from the ``FOLDPLANE_*`` environment alone."""
        if self.foldplane:
            dist.init_process_group("foldplane", timeout=TIMEOUT, enable_reconfigure=reconfigure)
        else:
            dist.init_process_group(
                "gloo",
                rank=self.rank,
                world_size=WORLD,
                store=self.store,
                timeout=TIMEOUT,
                enable_reconfigure=reconfigure,
            )
        pg = c10d._get_default_group()
        assert dist._supports_reconfigure() is True
        return pg

    def handles(self, key: str) -> list[str]:
        """Every rank's handle, by rank (each rank posts its own and reads the others')."""
        self.store.set(f"{key}/{self.rank}", dist._get_reconfigure_handle())
        return [self.store.get(f"{key}/{r}").decode() for r in range(WORLD)]

    def barrier(self, key: str) -> None:
        self.store.set(f"{key}/{self.rank}", "1")
        for r in range(WORLD):
            self.store.get(f"{key}/{r}")

    def reconfigure(self, uuid: int, handles: list[str] | set[str]) -> None:
        dist._reconfigure(uuid, handles, timeout=TIMEOUT).wait()

    def reconfigured(self, name: str, uuid: int) -> list[str]:
        """Init, every rank reconfigures into the whole group; the handles after it."""
        self.init()
        self.reconfigure(uuid, self.handles(f"{name}/init"))
        assert (dist.get_world_size(), dist.get_rank()) == (WORLD, self.rank)
        return self.handles(f"{name}/post")

    def assert_sum(self, expected: float) -> None:
        """Each rank adds (its rank in the group + 1)."""
        t = torch.full((4,), dist.get_rank() + 1.0)
        dist.all_reduce(t)
        assert t.tolist() == [expected] * 4, (t.tolist(), expected)

    def close(self) -> None:
        agent = getattr(c10d._get_default_group(), "agent", None) if dist.is_initialized() else None
        if dist.is_initialized():
            dist.destroy_process_group()
        if agent is not None:
            agent.close()


# -- torch's cases, one function each -----------------------------------------------------------


def basic(r: Rank) -> None:
    r.reconfigured("basic", 100)


def then_all_reduce(r: Rank) -> None:
    r.reconfigured("all_reduce", 200)
    r.assert_sum(6.0)


def ring_send_recv(r: Rank) -> None:
    r.reconfigured("ring", 300)
    me = dist.get_rank()
    right, left = (me + 1) % WORLD, (me - 1) % WORLD
    out, got = torch.full((4,), me + 1.0), torch.zeros(4)
    if me % 2 == 0:
        works = [dist.isend(out, right), dist.irecv(got, left)]
    else:
        works = [dist.irecv(got, left), dist.isend(out, right)]
    for w in works:
        w.wait()
    assert got.tolist() == [left + 1.0] * 4, got


def shrink_last(r: Rank) -> None:
    handles = r.reconfigured("shrink_last", 400)
    if r.rank == WORLD - 1:  # left out: it does not call
        r.barrier("shrink_last/done")
        assert (dist.get_world_size(), dist.get_rank()) == (WORLD, r.rank)
        return
    r.reconfigure(401, handles[: WORLD - 1])
    assert (dist.get_world_size(), dist.get_rank()) == (WORLD - 1, r.rank)
    r.assert_sum(3.0)
    t = torch.full((4,), 42.0) if dist.get_rank() == 0 else torch.zeros(4)
    dist.broadcast(t, group_src=0)
    assert t.tolist() == [42.0] * 4
    r.barrier("shrink_last/done")


def shrink_middle(r: Rank) -> None:
    handles = r.reconfigured("shrink_middle", 500)
    middle = WORLD // 2
    if r.rank == middle:
        r.barrier("shrink_middle/done")
        return
    r.reconfigure(501, [h for i, h in enumerate(handles) if i != middle])
    assert dist.get_world_size() == WORLD - 1
    assert dist.get_rank() == (r.rank if r.rank < middle else r.rank - 1)  # rank 2 becomes 1
    r.assert_sum(3.0)
    r.barrier("shrink_middle/done")


def scale_down_up(r: Rank) -> None:
    r.init()
    r.reconfigure(600 + r.rank, [dist._get_reconfigure_handle()])  # disjoint: one uuid each
    assert (dist.get_world_size(), dist.get_rank()) == (1, 0)
    r.reconfigure(603, r.handles("scale/all"))
    assert (dist.get_world_size(), dist.get_rank()) == (WORLD, r.rank)
    r.reconfigure(604 + r.rank, [dist._get_reconfigure_handle()])
    assert (dist.get_world_size(), dist.get_rank()) == (1, 0)
    r.barrier("scale/done")


def singletons_to_all(r: Rank) -> None:
    r.init()
    r.reconfigure(700 + r.rank, [dist._get_reconfigure_handle()])
    r.assert_sum(1.0)  # alone
    r.reconfigure(703, r.handles("singletons/all"))
    r.assert_sum(6.0)


def identity_new_uuid(r: Rank) -> None:
    r.reconfigured("identity", 800)
    r.reconfigure(801, r.handles("identity/again"))
    assert (dist.get_world_size(), dist.get_rank()) == (WORLD, r.rank)
    r.assert_sum(6.0)


def late_join(r: Rank) -> None:
    r.init()
    handles = r.handles("late/initial")
    first = WORLD // 2
    if r.rank < first:
        r.reconfigure(900, handles[:first])
        assert dist.get_world_size() == first
    r.reconfigure(901, r.handles("late/all"))
    r.assert_sum(6.0)


def merge(r: Rank) -> None:
    r.init()
    handles = r.handles("merge/initial")
    split = WORLD // 2
    if r.rank < split:
        r.reconfigure(1000, handles[:split])
        r.assert_sum(1.0)
    else:
        r.reconfigure(1001, handles[split:])
        r.assert_sum(2.0 + 1.0)  # {1, 2} as ranks 0 and 1
    r.reconfigure(1002, r.handles("merge/all"))
    r.assert_sum(6.0)


def after_abort(r: Rank) -> None:
    r.reconfigured("abort", 1200)
    c10d._get_default_group().abort()
    r.reconfigure(1201, r.handles("abort/recover"))
    r.assert_sum(6.0)


TORCH_CASES: dict[str, Callable[[Rank], None]] = {
    f.__name__: f
    for f in (
        basic,
        then_all_reduce,
        ring_send_recv,
        shrink_last,
        shrink_middle,
        scale_down_up,
        singletons_to_all,
        identity_new_uuid,
        late_join,
        merge,
        after_abort,
    )
}


# -- beyond torch's cases ---------------------------------------------------------------------------


def reused_uuid(r: Rank) -> None:
    """A uuid used before. By the same process: both backends refuse it ("already used"), and
    the process keeps its configuration. By other processes of the group (foldplane only: rank
    0 took it alone, then ranks 1 and 2 call it together): foldplane refuses every member's
    call alike, naming the view that used it, and nothing is built (torch 2.14.1's gloo, asked
    the same, fails at its rendezvous: a connection error on some members, the timeout on
    others). Then all recover with a fresh uuid."""
    r.init()
    r.reconfigure(1100 + r.rank, [dist._get_reconfigure_handle()])
    mine = [dist._get_reconfigure_handle()]  # gloo's handle changes with each configuration
    try:
        r.reconfigure(1100 + r.rank, mine)
    except RuntimeError as e:
        assert "already used" in str(e), e
        if r.foldplane:
            assert "applied in version" in str(e), e
    else:
        raise AssertionError(f"{r.backend} took a uuid this process used")
    assert (dist.get_world_size(), dist.get_rank()) == (1, 0)  # the configuration stays
    r.assert_sum(1.0)
    if r.foldplane:
        handles = r.handles("reused/all")
        if r.rank == 0:
            r.reconfigure(1110, [handles[0]])
            r.store.set("reused/outcome/0", "took it")
        else:
            r.store.get("reused/outcome/0")
            try:
                r.reconfigure(1110, handles[1:])
            except RuntimeError as e:
                assert "already used" in str(e) and "applied in version" in str(e), e
            else:
                raise AssertionError("foldplane took a uuid another process used")
            assert (dist.get_world_size(), dist.get_rank()) == (1, 0)
    r.barrier("reused/tried")
    r.reconfigure(1120, r.handles("reused/fresh"))
    r.assert_sum(6.0)


def bad_calls(r: Rank) -> None:
    """Bad handles raise at the call, naming what is wrong, and change nothing; a handle of a
    process that is gone is refused by the coordinator through the Work; the group goes on."""
    handles = r.reconfigured("bad", 1300)
    me = handles[r.rank]
    other = handles[(r.rank + 1) % WORLD]
    group, rank, inc = me.split(":", 3)[1:]
    wrong = [
        ([me, "gloo-handle"], ValueError, "is not a foldplane handle"),
        ([me, "foldplane:x"], ValueError, "is malformed"),
        ([me, f"foldplane:other:{(r.rank + 1) % WORLD}:x"], ValueError, "belongs to group"),
        ([other], ValueError, "is not among the handles"),
        ([me, other, other], ValueError, "is named twice"),
        ([f"foldplane:{group}:{rank}:not-me", other], ValueError, "names incarnation not-me"),
        ([me, f"foldplane:{group}:7:x"], ValueError, "not in 0..2"),
    ]
    for given, error, words in wrong:
        try:
            dist._reconfigure(1301, given, timeout=TIMEOUT)
        except error as e:
            assert words in str(e), (words, str(e))
        else:
            raise AssertionError(f"reconfigure took {given}")
    stale = f"foldplane:{group}:{(r.rank + 1) % WORLD}:gone-away"
    try:
        r.reconfigure(1302 + r.rank, [me, stale])
    except RuntimeError as e:
        assert "handle names incarnation gone-away" in str(e) and "fresh uuid" in str(e), e
    else:
        raise AssertionError("the coordinator took a stale handle")
    assert (dist.get_world_size(), dist.get_rank()) == (WORLD, r.rank)
    r.reconfigure(1310, r.handles("bad/after"))  # the uuids refused at the call are unused
    r.assert_sum(6.0)
    try:  # torch would map a subgroup's ranks once, and this group's follow its reconfigures
        dist.new_group(backend="foldplane")
    except ValueError as e:
        assert "not supported" in str(e), e
    else:
        raise AssertionError("dist.new_group made a subgroup of a group of torch's model")
    r.assert_sum(6.0)


def foldplane_model(r: Rank) -> None:
    """The default group (foldplane's model) answers reconfigure too: the members become the
    view's active ranks; ranks stay global and the size is the world size."""
    pg = r.init(reconfigure=False)
    handles = r.handles("model/init")
    assert type(pg).__name__ == "ElasticProcessGroup"
    if r.rank != 1:
        r.reconfigure(1400, [handles[2], handles[0]])
        assert pg.active_ranks == (0, 2)
        assert (dist.get_world_size(), dist.get_rank()) == (WORLD, r.rank)
        t = torch.ones(2)
        dist.all_reduce(t)
        assert t.tolist() == [2.0, 2.0]
    r.barrier("model/shrunk")
    if r.rank == 1:  # outside the view: its collectives complete locally
        pg.agent.wait_for_view(lambda v: v.version >= 2, timeout=30)
        t = torch.ones(2)
        dist.all_reduce(t)
        assert t.tolist() == [1.0, 1.0] and pg.active_ranks == (0, 2)
    r.barrier("model/done")


FOLDPLANE_CASES: dict[str, Callable[[Rank], None]] = {
    f.__name__: f for f in (reused_uuid, bad_calls, foldplane_model)
}
CASES = {**TORCH_CASES, **FOLDPLANE_CASES}


def run_rank(
    backend: str, case: str, rank: int, env: dict[str, str], store_port: int, results: Any
) -> None:
    """A rank process: run ``case`` and put ``(rank, None)`` or ``(rank, traceback)``."""
    os.environ.update(env)
    outcome: str | None = None
    r: Rank | None = None
    try:  # a store this rank cannot reach is its outcome too
        store = dist.TCPStore("127.0.0.1", store_port, timeout=STORE)
        r = Rank(backend, rank, store)
        CASES[case](r)
    except BaseException:  # noqa: BLE001 - every failure goes back to the test
        outcome = traceback.format_exc()
    try:
        if r is not None:
            r.close()
    except BaseException:  # noqa: BLE001
        outcome = outcome or traceback.format_exc()
    results.put((rank, outcome))
