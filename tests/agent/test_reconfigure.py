"""torch's reconfigure API on the foldplane groups, in process (docs/reconfigure.md): what each
torch version gives, the handle, and the checks of a call's arguments. The contract itself, with
real rank processes, is ``tests/torch_suite/test_reconfigure.py``."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch

from foldplane.agent import Agent
from foldplane.agent.dataplane.reconfigure import SUPPORTED, Handle, read_request
from tests.agent.conftest import Coordinator

pytestmark = pytest.mark.timeout(120)

HAS_API = hasattr(torch.distributed.distributed_c10d, "ReconfigureOptions")


def test_the_api_is_there_exactly_when_torch_has_it(coordinator: Coordinator):
    """torch >= 2.14: the group answers supports_reconfigure True and hands out its handle;
    below: False, and the calls say which torch would have them; nothing else changes."""
    assert SUPPORTED == HAS_API
    coordinator.create_group("api", 1)
    agent = Agent(coordinator.url, group="api", rank=0, heartbeat_interval_s=0.2).start()
    try:
        agent.wait_for_view(timeout=60)
        pg = agent.process_group()
        assert pg.supports_reconfigure is HAS_API
        t = torch.ones(2)
        assert pg.all_reduce(t, async_op=True).wait() and t.tolist() == [1.0, 1.0]
        if HAS_API:
            handle = pg.get_reconfigure_handle()
            assert handle == f"foldplane:api:0:{agent.incarnation}"
            assert Handle.parse(handle) == Handle("api", 0, agent.incarnation)
            assert torch.distributed._supports_reconfigure(pg) is True
        else:
            with pytest.raises(RuntimeError, match=r"torch 2\.\d+.* has no reconfigure API"):
                pg.get_reconfigure_handle()
            with pytest.raises(RuntimeError, match="needs torch's reconfigure API"):
                agent.process_group(reconfigure=True)
    finally:
        agent.close()


@pytest.mark.skipif(not HAS_API, reason="torch's ReconfigureOptions came with torch 2.14")
def test_a_calls_arguments_are_checked_naming_what_is_wrong():
    from torch.distributed.distributed_c10d import ReconfigureOptions

    me = Handle("g", 1, "inc-1")
    other = Handle("g", 0, "inc-0")

    def opts(handles, uuid=7, timeout=None):
        o = ReconfigureOptions()
        o.uuid, o.handles = uuid, handles
        if timeout is not None:
            o.timeout = timeout
        return o

    request = read_request(opts([str(me), str(other)], timeout=timedelta(seconds=5)), me, 3)
    assert (request.uuid, request.ranks, request.timeout_s) == (7, (1, 0), 5.0)
    # a set lets the backend choose the order: foldplane takes global rank order
    assert read_request(opts({str(me), str(other)}), me, 3).ranks == (0, 1)
    for handles, words in [
        ([], "at least one handle"),
        ([str(me), "gloo:0:-1:0:"], "is not a foldplane handle"),
        ([str(me), "foldplane:g:x:inc"], "is malformed"),
        ([str(me), "foldplane:g:2"], "is malformed"),
        ([str(me), "foldplane:h:0:inc"], "belongs to group 'h'"),
        ([str(me), "foldplane:g:3:inc"], "not in 0..2"),
        ([str(me), str(other), str(other)], "rank 0 is named twice"),
        ([str(other)], "this rank (1) is not among the handles"),
        (["foldplane:g:1:someone-else"], "names incarnation someone-else"),
    ]:
        with pytest.raises(ValueError) as err:
            read_request(opts(handles), me, 3)
        assert words in str(err.value), (words, str(err.value))
    with pytest.raises(TypeError, match="a reconfigure handle is a string"):
        Handle.parse(5)
    # the incarnation may hold colons; the group and the rank may not
    assert Handle.parse("foldplane:g:1:a:b") == Handle("g", 1, "a:b")


def test_a_default_group_of_another_size_leaves_the_agents_group_unregistered(
    coordinator: Coordinator,
):
    """A process whose torch default group is another group (of 2 ranks here, made before the
    agent's group of 1) still gets the agent's group: unregistered in torch, working on its
    own methods, instead of dist.new_group asking it for a rank of the other group."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():  # an earlier test's agent group in this process
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    coordinator.create_group("sized", 1)
    agent = Agent(coordinator.url, group="sized", rank=0, heartbeat_interval_s=0.2).start()
    try:
        agent.wait_for_view(timeout=60)
        pg = agent.process_group()
        assert (pg.rank(), pg.size()) == (0, 1)
        assert dist.get_world_size() == 2  # torch's default group is still the other one
        t = torch.ones(2)
        assert pg.all_reduce(t, async_op=True).wait() and t.tolist() == [1.0, 1.0]
    finally:
        agent.close()
        dist.destroy_process_group()
