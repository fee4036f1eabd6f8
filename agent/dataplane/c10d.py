"""The ``"foldplane"`` backend of ``torch.distributed``.

Importing :mod:`agent.dataplane` registers it, so that in a worker the launcher started

>>> import foldplane.agent.dataplane, torch.distributed as dist
>>> dist.init_process_group("foldplane")

builds an :class:`~agent.Agent` from the ``FOLDPLANE_*`` environment, starts it, waits for the
first committed view and makes the agent's :class:`ElasticProcessGroup` the default group:
``dist.all_reduce(t)``, ``dist.get_rank()``, ``dist.get_world_size()`` then run on it.
``agent.process_group()`` registers the group the same way (as the default group when there is
none yet), so ``dist.*(..., group=pg)`` works without ``init_process_group`` too.

The bare ``init_process_group("foldplane")`` takes torch's ``env://`` path, which wants
``MASTER_ADDR``; the foldplane group needs no such rendezvous (its views rendezvous on the
coordinator's store), so when ``MASTER_ADDR`` is unset and ``FOLDPLANE_GROUP`` is set the
``env://`` handler is answered from the agent instead (a local store, the agent's rank and the
group's world size). ``init_method="foldplane://"`` asks for that explicitly.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

from .group import BACKEND_NAME, ElasticProcessGroup
from .reconfigure import ReconfigurableProcessGroup

if TYPE_CHECKING:
    from .. import Agent

# ``torch.distributed.rendezvous`` is also the name of a function: import the module by path.
_rdzv = importlib.import_module("torch.distributed.rendezvous")

_lock = threading.RLock()
_registered = False
#: The group ``adopt`` is registering right now (the creator hands it to torch).
_adopting: ElasticProcessGroup | None = None
#: True while torch's creator runs for the environment's agent (torch registers what it returns).
_in_creator = False
#: The agent built from the environment by the rendezvous or the creator (one per process).
_env_agent: Agent | None = None


def register() -> None:
    """Register the ``"foldplane"`` backend and its rendezvous (idempotent)."""
    global _registered
    with _lock:
        if _registered:
            return
        dist.Backend.register_backend(
            BACKEND_NAME, _create, extended_api=True, devices=["cpu", "cuda"]
        )
        _rdzv.register_rendezvous_handler("foldplane", _foldplane_rendezvous)
        original = _rdzv._rendezvous_handlers["env"]

        def env_or_foldplane(url: str, timeout: timedelta = default_pg_timeout, **kw: Any):
            if not os.environ.get("MASTER_ADDR") and os.environ.get("FOLDPLANE_GROUP"):
                return _foldplane_rendezvous(url, timeout, **kw)
            return original(url, timeout=timeout, **kw)

        _rdzv._rendezvous_handlers["env"] = env_or_foldplane
        _registered = True


def environment_agent(timeout: timedelta | None = None) -> Agent:
    """The agent of this process built from ``FOLDPLANE_*`` (built and started on first use).

    ``timeout`` (torch's process-group timeout, 30 minutes by default) bounds collectives, not
    the start: the agent finds its coordinator and group within its own start timeout
    (``FOLDPLANE_START_TIMEOUT_S``, ``agent.client.DEFAULT_START_TIMEOUT_S``), so a wrong
    address or group name fails in seconds."""
    global _env_agent
    with _lock:
        if _env_agent is None:
            # through the package's public face: the host adopts its groups here, so this
            # module, below it, names no module of the host
            from .. import Agent

            _env_agent = Agent().start()
        return _env_agent


def adopt(pg: ElasticProcessGroup, agent: Agent | None = None) -> ElasticProcessGroup:
    """Register ``pg`` with ``torch.distributed`` (the default group if there is none yet)."""
    global _adopting
    register()
    if agent is not None:
        pg.agent = agent
    with _lock:
        if _in_creator or _is_registered(pg):
            return pg
        if dist.is_initialized() and (
            dist.get_rank() != pg.rank() or dist.get_world_size() != pg.size()
        ):
            # Another group holds this process's place in torch (several agents in one
            # process, as in tests, or a default group of another size made before): torch
            # knows one default group per process, and dist.new_group would ask this one for a
            # rank of that group, so this one stays unregistered; its own methods work,
            # dist.*(group=pg) does not.
            return pg
        _adopting = pg
        try:
            if not dist.is_initialized():
                dist.init_process_group(
                    BACKEND_NAME, store=dist.HashStore(), rank=pg.rank(), world_size=pg.size()
                )
            else:
                dist.new_group(backend=BACKEND_NAME)
        finally:
            _adopting = None
    return pg


def _is_registered(pg: ElasticProcessGroup) -> bool:
    from torch.distributed.distributed_c10d import _world

    return pg in _world.pg_map


def _foldplane_rendezvous(
    url: str, timeout: timedelta = default_pg_timeout, **kwargs: Any
) -> Iterator[tuple[dist.Store, int, int]]:
    agent = environment_agent(timeout)
    assert agent.world_size is not None
    # The group needs no torch rendezvous: each view rendezvouses on the coordinator's store.
    yield dist.HashStore(), agent.rank, agent.world_size


def _create(opts: Any, _backend_options: Any = None) -> object:
    """torch's creator for ``"foldplane"`` (its extended API: ``_DistributedBackendOptions``).

    The first call in a process makes the agent's group (once a view is committed); a call
    while a foldplane group is torch's default group (``dist.new_group``) makes a subgroup.
    ``init_process_group(..., enable_reconfigure=True)`` (torch >= 2.14 passes it here) makes
    the group of torch's reconfigure model instead (``agent.dataplane.reconfigure``).
    """
    global _in_creator
    rank, size, timeout = opts.group_rank, opts.group_size, opts.timeout
    pg = _adopting
    if pg is None:
        default = _default_group()
        if default is not None:
            return _subgroup(default, opts)
        if dist.is_initialized() and isinstance(_c10d_default(), ReconfigurableProcessGroup):
            raise ValueError(
                "dist.new_group on a foldplane group of torch's reconfigure model is not "
                "supported: torch maps a subgroup's ranks once, at its creation, and this "
                "group's ranks follow its reconfigures (docs/reconfigure.md)"
            )
        agent = environment_agent(timeout)
        agent.wait_for_view(timeout=timeout.total_seconds())
        with _lock:
            _in_creator = True
            try:
                pg = agent.process_group(
                    timeout_s=timeout.total_seconds(),
                    reconfigure=bool(getattr(opts, "enable_reconfigure", False)),
                )
            finally:
                _in_creator = False
        if _is_registered(pg):
            return _subgroup(pg, opts)
    if (rank, size) != (pg.rank(), pg.size()):
        raise ValueError(
            f"the foldplane group of this process is rank {pg.rank()} of {pg.size()}; "
            f"torch asked for rank {rank} of {size}"
        )
    return pg


def _c10d_default() -> object:
    from torch.distributed.distributed_c10d import _get_default_group

    return _get_default_group()


def _default_group() -> ElasticProcessGroup | None:
    """torch's default group, if it is a foldplane group."""
    if not dist.is_initialized():
        return None
    from torch.distributed.distributed_c10d import _get_default_group

    default = _get_default_group()
    return default if isinstance(default, ElasticProcessGroup) else None


def _subgroup(pg: ElasticProcessGroup, opts: Any) -> object:
    """``dist.new_group`` on a foldplane group: a static backend over the ranks it names.

    torch wraps the backend in a process group of its own; ``dist.get_backend`` of it is
    ``"foldplane"``. See ``DataPlane.build_subgroup`` for what it does and does not follow.
    """
    return pg.plane.build_subgroup(
        opts.group_id, opts.group_rank, opts.group_size, opts.timeout.total_seconds()
    )
