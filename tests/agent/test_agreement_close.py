"""The step agreement's threads end when their owner closes (in process, on a real ``TCPStore``
and a real ``DataPlane``): the janitor and the decision watch each hold a store client of their
own, and a daemon thread that returns from a store call while the interpreter shuts down aborts
the process ("terminate called without an active exception")."""

from __future__ import annotations

import threading
import uuid
import weakref
from collections.abc import Iterator
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from foldplane.agent import agreement as agreement_module
from foldplane.agent.agreement import StepAgreement
from foldplane.agent.dataplane import DataPlane
from foldplane.agent.elastic import ElasticStep

THREADS = {"foldplane-janitor", "foldplane-decision-watch"}


@pytest.fixture
def plane() -> Iterator[DataPlane]:
    store = TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10)
    )
    dp = DataPlane(0, 2, "127.0.0.1", store.port, incarnation=uuid.uuid4().hex)
    yield dp
    dp.close()


def _alive(names: set[str], before: set[threading.Thread]) -> list[str]:
    return [t.name for t in threading.enumerate() if t not in before and t.name in names]


def _started(agreement: StepAgreement, before: set[threading.Thread]) -> None:
    """Connect the agreement (its threads start) and give its janitor a delete to make."""
    store = agreement.store()
    store.set("t/1/0/ok", b"1")
    assert agreement._janitor is not None
    agreement._janitor.forget("t/1/0/ok")
    assert sorted(_alive(THREADS, before)) == sorted(THREADS)


def test_closing_the_agreement_ends_its_threads_and_a_later_use_connects_again(plane) -> None:
    before = set(threading.enumerate())
    agreement = StepAgreement(plane, "t")
    _started(agreement, before)
    assert agreement.close(10.0)
    assert _alive(THREADS, before) == []
    assert not plane.connect_store(*plane.store_address).check(["t/1/0/ok"]), "delete dropped"
    # a reconnect (a moved store, a failed client) ends the old store's threads too
    agreement.store()
    agreement.reset()
    agreement.store()
    assert agreement.close(10.0)
    assert _alive(THREADS, before) == []


def test_closing_an_elastic_step_ends_its_agreement_threads(plane) -> None:
    before = set(threading.enumerate())
    step = ElasticStep()
    step._init_step(plane.process_group(), "t", 1.0, None)
    _started(step._agreement, before)
    assert step.close()
    assert _alive(THREADS, before) == []


def test_the_exit_hook_closes_an_agreement_left_open(plane) -> None:
    before = set(threading.enumerate())
    agreement = StepAgreement(plane, "t")
    _started(agreement, before)
    agreement_module._close_at_exit(weakref.ref(agreement))  # what atexit runs
    assert _alive(THREADS, before) == []
