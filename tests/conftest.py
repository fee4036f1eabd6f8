"""Fixtures shared by every suite. Each suite keeps its own fixtures in its own conftest.py.

The suites run in parallel under pytest-xdist (``-n 2``, see the README's test command). What
two tests could both take lives in a place of each test's own: a port from :func:`free_port`'s
block for this worker, a file under ``tmp_path``, a PostgreSQL schema with a random name
(``tests/eventlog/conftest.py``, ``tests/ha/cluster.py``). Everything else a test binds, a
TCPStore or a coordinator's ``--store-port 0``, takes a port the kernel picks while binding it.
"""

from __future__ import annotations

import importlib.abc
import itertools
import os
import random
import socket
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


class _OneName(importlib.abc.MetaPathFinder):
    """The repository's root is the package ``foldplane`` (``__init__.py``): its top folders
    are ``foldplane.agent``, ``foldplane.eventlog``..., never the top-level ``agent`` or
    ``eventlog`` that the root on ``sys.path`` would otherwise offer. A test that imports one
    fails here, naming the one name, instead of loading a module's code a second time; pytest
    asking whether ``tests/agent/test_x.py`` is ``agent.test_x`` before ``tests.agent.test_x``
    is answered no without loading ``agent/__init__.py``."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if path is None and (ROOT / name / "__init__.py").is_file():
            raise ModuleNotFoundError(f"{name!r} is imported as 'foldplane.{name}'", name=name)
        return None


sys.meta_path.insert(0, _OneName())

PG_URL = os.environ.get("FOLDPLANE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")

#: free_port's ports lie below Linux's ephemeral range (32768-60999 by default), so no outgoing
#: connection's local port and no kernel-picked listener (port 0) can be handed out twice; each
#: xdist worker has a block of its own, so two workers never return the same port.
PORT_BASE, PORTS_PER_WORKER, PORT_BLOCKS = 20_000, 1_000, 12


def _worker_index() -> int:
    """This process's xdist worker number (``gw3`` -> 3); 0 outside xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else 0


#: Successive calls walk the block from a random start: a port is not handed out again until
#: the block went round, and two test runs on one machine (two checkouts) rarely meet.
_next_port = itertools.count(random.randrange(PORTS_PER_WORKER))


def free_port() -> int:
    """A loopback port that nothing listens on now, from this worker's block.

    Between this call and the caller's bind the port stays free: the kernel never picks it
    (it is outside the ephemeral range) and no other worker's block holds it.
    """
    block = _worker_index() % PORT_BLOCKS
    base = PORT_BASE + block * PORTS_PER_WORKER
    for _ in range(PORTS_PER_WORKER):
        port = base + next(_next_port) % PORTS_PER_WORKER
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # held by something else (or in TIME_WAIT): the next one
                continue
        return port
    raise RuntimeError(f"no free port in {base}-{base + PORTS_PER_WORKER - 1}")


#: The heavy tests, those that start torch worker processes (gloo collectives, DDP) or a pool
#: of CPU-bound processes (the simulator's seeds), by node id prefix. Under
#: ``-n 2 --dist loadgroup`` they run one at a time, on one xdist worker: two of them at once on
#: the 2-core machine would starve each other's heartbeats and collectives of CPU; the rest of
#: the suite runs beside them on the other worker. (The group is chosen here, by node id, because
#: pytest 9.2 ignores the ``xdist_group`` mark: xdist 3.8 tags a test by rewriting its node id,
#: which pytest 9.2 no longer lets a plugin do.)
HEAVY = (
    "tests/agent/test_clean_exit.py",
    "tests/agent/test_ddp.py",
    "tests/agent/test_demo.py",
    "tests/agent/test_dist.py",
    "tests/agent/test_elastic.py",
    "tests/agent/test_example.py",
    "tests/agent/test_relay_workers.py",
    "tests/agent/test_store_move.py",
    "tests/agent/test_torchrun.py",
    "tests/agent/test_launch_torchrun.py::test_an_unchanged_gloo_script_runs_on_the_launchers_master_addr_and_port",
    "tests/dataplane/test_processes.py",
    "tests/dataplane/test_gloo_reconfigure_processes.py",
    "tests/dataplane/test_torch_callers.py",
    "tests/sim/test_sim.py::test_seeds",
    "tests/sim/test_sim.py::test_more_seeds",
    "tests/test_install.py",
    "tests/torch_suite/test_reconfigure.py",
)


#: Tests that share a fixed resource run one at a time on one worker, beside the rest (a scope
#: of their own, chosen by node id as the heavy one is): torchft's ManagerIntegTest binds its
#: managers to fixed ports (19530 + replica id), so two of its tests at once collide
#: ("Address already in use").
SERIAL = {"torchft_manager_ports": ("tests/lighthouse/test_torchft_contract.py",)}


def _under(nodeid: str, prefixes: tuple[str, ...]) -> bool:
    return any(
        nodeid == h or nodeid.startswith(h + "::") or nodeid.startswith(h + "[") for h in prefixes
    )


def is_heavy(nodeid: str) -> bool:
    return _under(nodeid, HEAVY)


def scope_of(nodeid: str) -> str:
    """The xdist scope of a test under ``--dist loadgroup`` (one scope runs on one worker, one
    test at a time): ``heavy``, a ``SERIAL`` group's name, or the test's own node id."""
    if is_heavy(nodeid):
        return "heavy"
    for name, prefixes in SERIAL.items():
        if _under(nodeid, prefixes):
            return name
    return nodeid


#: The longest tests outside the heavy scope (minutes each in the slow suite): they start first
#: on the other worker, beside the heavy chain; started last, the crash test alone was the
#: slow suite's last 7 minutes (1702 s in all, on a quiet machine).
LONG = (
    "tests/service/test_crash.py::test_sigkill_under_load_loses_nothing_acknowledged[full]",
    "tests/service/test_openapi_conformance.py::test_schemathesis_finds_nothing",
    "tests/fsdp/test_example.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The heavy tests first (in their own order), then the ``LONG`` ones: xdist hands out work
    in collection order, so the longest chain starts at once and the other worker begins with
    its longest tests beside it, instead of both waiting at the end for one long test that
    started last."""
    items.sort(key=lambda item: (not is_heavy(item.nodeid), not _under(item.nodeid, LONG)))


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadgroup``: xdist's scope scheduling with the heavy tests as one scope (one
    worker, one at a time), each ``SERIAL`` group one, and every other test a scope of its own."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class HeavyApart(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return HeavyApart(config, log)  # type: ignore[arg-type]


@pytest.fixture
def pg_url() -> str:
    """The real PostgreSQL server on 127.0.0.1:5432 (database ``test``)."""
    return PG_URL
