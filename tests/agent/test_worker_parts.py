"""A facet's worker part is the facet's, in its folder, and the agent reaches it by the name
its ``protocol`` module declares (``WORKER``, ``agent/facets.py``): the Agent makes it when
first needed, hands it the facet's updates, the answers to its events and why it stopped, and
answers the names it offers as its own, naming no facet itself. No coordinator is needed: the
agent's driver core is fed the actions its machine would give."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from foldplane.agent import facets as worker_facets
from foldplane.agent.host import Agent, _Driver
from foldplane.agent.machine import EventAnswered, FacetUpdate, SendEvent, Stopped
from foldplane.facets.epochs.protocol import ProgressEvent
from foldplane.facets.epochs.worker import EpochsWorker, EpochTracker
from foldplane.facets.refits.protocol import RefitEpochUpdate, RefitJoinEvent
from foldplane.facets.refits.worker import RefitClient, RefitsWorker


def an_agent() -> Agent:
    return Agent("http://127.0.0.1:9", group="gen", rank=1, backend="gloo")


def epoch_update(n: int) -> RefitEpochUpdate:
    return RefitEpochUpdate(
        offset=10 * n,
        refit="rl",
        groups=("train", "gen"),
        epoch=n,
        status="waiting",
        cause="the refit was created",
        deadline_ts=None,
        digest=None,
        lanes=1,
        publisher_ranks=(),
        subscriber_ranks=(),
        missing=(),
    )


def test_the_refits_worker_part_is_declared_by_its_protocol_and_loaded_by_name() -> None:
    (part,) = [p for p in worker_facets.WORKER_PARTS if p.name == "refits"]
    assert part.module == "foldplane.facets.refits.worker"
    assert part.offers == ("refit", "refits", "create_refit")
    assert {u.__struct_config__.tag for u in part.updates} == {
        "refit_epoch",
        "transfer",
        "refit_bootstrap",
    }


def test_the_agent_answers_what_a_worker_part_offers_and_makes_it_once() -> None:
    agent = an_agent()
    worker = agent.facet("refits")
    assert isinstance(worker, RefitsWorker) and agent.facet("refits") is worker
    assert agent.refits is worker.refits
    client = agent.refit("rl")
    assert isinstance(client, RefitClient) and client.tracker is worker.refits
    assert (worker.side.group, worker.side.rank) == ("gen", 1)
    with pytest.raises(AttributeError, match="no attribute 'toy'"):
        agent.toy  # noqa: B018
    with pytest.raises(KeyError, match="no facet 'toy' with a worker part"):
        agent.facet("toy")


def test_the_driver_hands_a_worker_part_its_updates_answers_and_stop() -> None:
    agent = an_agent()
    driver = _Driver(agent)
    driver.facet_update(FacetUpdate(epoch_update(2)))
    tracker = agent.refits
    assert tracker.epochs["rl"].epoch == 2
    # its event goes into the agent's inbox, the driver's input; its answer reaches the caller
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(tracker.send, "transfer", {"refit": "rl", "epoch": 2, "key": "k"}, 5)
        sent = agent._inbox.get(timeout=5)
        assert isinstance(sent, SendEvent) and (sent.kind, sent.fields) == (
            "transfer",
            {"refit": "rl", "epoch": 2, "key": "k"},
        )
        driver.event_answered(EventAnswered(sent.kind, sent.fields, 42))
        assert waiting.result(timeout=5) is None
    driver.stopped(Stopped("closed", "rank 1 left the group"))
    assert tracker.stopped == "closed: rank 1 left the group"


def test_the_epochs_worker_part_reports_progress_as_a_facet_s_report_and_takes_its_answer() -> None:
    agent = an_agent()
    driver = _Driver(agent)
    worker = agent.facet("epochs")
    assert isinstance(worker, EpochsWorker) and agent.data is worker.data
    assert isinstance(agent.data, EpochTracker)
    assert agent.plan_epoch.__func__ is EpochsWorker.plan_epoch
    worker.report(0, 1, 5, 2.5)
    sent = agent._inbox.get(timeout=5)
    assert isinstance(sent, SendEvent) and sent.event_type is ProgressEvent
    assert (sent.kind, sent.fields) == (
        "progress",
        {"epoch": 0, "assignment": 1, "processed": 5, "rate": 2.5},
    )
    assert ProgressEvent.report and not RefitJoinEvent.report
    driver.event_answered(EventAnswered(sent.kind, sent.fields, 40))
    assert agent.data.accepted == {0: 5}


def test_a_deployment_s_facet_named_by_foldplane_facets_reaches_its_worker_part(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The toy facet's ``protocol.py`` names its worker part: an agent whose environment names
    the facet loads it the same way, hands it the facet's update and refuses its event to a
    caller of ``send_event`` (the part alone sends it); twin: without the line, none."""
    from tests.facets.toy.protocol import AddEvent, CounterUpdate
    from tests.facets.toy.worker import ToyWorker

    monkeypatch.setenv("FOLDPLANE_FACETS", "tests.facets.toy")
    agent = an_agent()
    _Driver(agent).facet_update(FacetUpdate(CounterUpdate(offset=5, group="gen", count=4)))
    assert isinstance(agent.facet("toy"), ToyWorker) and agent.counter.count == 4
    with pytest.raises(ValueError, match="'toy_add' is the event of the toy facet's worker part"):
        agent.send_event(AddEvent, by=1)
    monkeypatch.delenv("FOLDPLANE_FACETS")
    with pytest.raises(AttributeError):
        an_agent().counter  # noqa: B018
