"""The agent state machine, fed chosen inputs with chosen times; no I/O, no sleeps."""

from __future__ import annotations

from typing import Any, ClassVar, get_args

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from foldplane.agent import facets as worker_facets
from foldplane.agent.machine import (
    _ON_UPDATE,
    BEATS,
    EVENTS,
    INPUTS,
    TRANSITIONS,
    AgentConfig,
    AgentMachine,
    Close,
    ConnectDataPlane,
    DataPlaneReady,
    EventAnswered,
    EventsAnswered,
    EventsFailed,
    FacetUpdate,
    Input,
    InputRefused,
    InstallView,
    LinkEvidence,
    MoveDataPlane,
    PollFailed,
    PollUpdates,
    RankStateChanged,
    Rejoin,
    SendEvent,
    SendEvents,
    ShutdownWithSave,
    Start,
    Stopped,
    StoreAddress,
    Tick,
    UpdatesReceived,
)
from foldplane.facets.epochs.protocol import (
    DataAssignmentUpdate,
    DataMovesUpdate,
    EpochCompleteUpdate,
    EpochPlanUpdate,
    ProgressEvent,
)
from foldplane.facets.refits.protocol import RefitBootstrapUpdate, RefitEpochUpdate, TransferUpdate
from foldplane.wire.protocol import (
    CAUSE_DEATH_REPORTED,
    AckEvent,
    AgentEventBase,
    HeartbeatEvent,
    JoinEvent,
    LinksEvent,
    View,
    prepare_update,
    view_update,
)
from foldplane.wire.updates import (
    OWN_RANK,
    UPDATE_TYPES,
    AgentUpdate,
    RankStateUpdate,
    ShutdownUpdate,
    Update,
    ViewCommittedUpdate,
    ViewPrepareUpdate,
)
from tests.facets.toy.protocol import AddEvent

INC = "inc-a"
STORE = StoreAddress("127.0.0.1", 29500)


def machine(rank: int = 1, **kw: Any) -> AgentMachine:
    return AgentMachine(AgentConfig(group="g", rank=rank, incarnation=INC, **kw))


def sent(actions: list, lane: str | None = None) -> list[AgentEventBase]:
    """The events of the SendEvents actions among ``actions`` (of ``lane``, or of both)."""
    return [
        e
        for a in actions
        if isinstance(a, SendEvents) and (lane is None or a.lane == lane)
        for e in a.events
    ]


def kinds(actions: list, lane: str | None = None) -> list[str]:
    return [type(e).__struct_config__.tag for e in sent(actions, lane)]


def ok(n: int, first_offset: int = 10, lane: str = EVENTS, now: float = 0.0) -> EventsAnswered:
    return EventsAnswered(now, tuple({"offset": first_offset + i} for i in range(n)), lane)


def beat_ok(now: float = 0.0) -> EventsAnswered:
    return ok(1, 0, BEATS, now)


def beat(version: int) -> HeartbeatEvent:
    return HeartbeatEvent(group="g", rank=1, incarnation=INC, version=version)


#: the ranks of group ``g`` (a view names the state of every one)
WORLD = 4


def view(version: int, active: list[int], offset: int = 0) -> View:
    """A committed view of group ``g``: every active rank HEALTHY, the others OFFLINE."""
    return View(
        group="g",
        version=version,
        active_ranks=tuple(sorted(active)),
        rank_states={r: "HEALTHY" if r in active else "OFFLINE" for r in range(WORLD)},
        healthy_set=tuple(sorted(active)),
        cause={"kind": "proposal", "proposals": [], "detail": ""},
        acked_ranks=(),
        dropped_ranks=(),
        offset=offset,
        ts=0,
    )


def committed(
    offset: int, version: int, active: list[int], base: View | None = None
) -> ViewCommittedUpdate:
    """The ``view_committed`` update of ``view(version, active)``: a delta from ``base``, or
    the full view (``base: 0``) when there is none."""
    return view_update(base, view(version, active, offset))


def prepare(
    offset: int, version: int, active: list[int], participants: list[int], base: View | None = None
) -> ViewPrepareUpdate:
    """The ``view_prepare`` of ``version``, a delta from ``base``; ``participants`` must be
    members of the old or the new view (the others are absent)."""
    return prepare_update(
        group="g",
        version=version,
        base=base,
        active_ranks=active,
        participants=participants,
        ack_deadline_ts=0,
        offset=offset,
    )


def rank_state(
    offset: int, state: str, rank: int = 1, incarnation: str = INC, **kw: Any
) -> RankStateUpdate:
    fields: dict[str, Any] = {"rank_epoch": 1, "reason": f"rank {rank} is {state}", **kw}
    return RankStateUpdate(
        offset=offset, group="g", rank=rank, state=state, incarnation=incarnation, **fields
    )


def updates(
    *items: AgentUpdate, now: float = 0.0, store: StoreAddress | None = STORE
) -> UpdatesReceived:
    next_after = max((u.offset for u in items), default=0)
    return UpdatesReceived(now, tuple(items), next_after, store)


def joined(rank: int = 1, ready: bool = True, **kw: Any) -> AgentMachine:
    """A machine whose join was appended at offset 10 (and, if ``ready``, reported self_ready)."""
    m = machine(rank, **kw)
    m.step(Start(0.0))
    m.step(ok(1, 10))
    if ready:
        m.step(DataPlaneReady(0.0))
        m.step(ok(1, 11))
    return m


V1 = view(1, [0, 1])


def links(**fields: Any) -> LinksEvent:
    return LinksEvent(group="g", rank=1, incarnation=INC, **fields)


def ack(version: int) -> AckEvent:
    return AckEvent(group="g", rank=1, incarnation=INC, version=version)


# -- join --------------------------------------------------------------------------------------


def test_start_sends_a_join_and_polls_from_offset_zero():
    m = machine()
    actions = m.step(Start(0.0))
    assert PollUpdates(0) in actions
    assert sent(actions) == [JoinEvent(group="g", rank=1, incarnation=INC)]


def test_nothing_but_the_join_is_sent_before_it_is_appended():
    m = machine()
    m.step(Start(0.0))
    assert m.step(DataPlaneReady(0.1)) == []
    assert m.step(Tick(5.0)) == []  # no heartbeat while joining
    actions = m.step(ok(1))
    assert kinds(actions) == ["links"]
    assert sent(actions)[0].self_ready is True


def test_self_ready_is_reported_once_the_data_plane_is_ready_after_the_join():
    m = joined(ready=False)
    assert m.step(Tick(0.5)) == []
    actions = m.step(DataPlaneReady(0.5))
    assert actions == [SendEvents((links(self_ready=True, version=0),), EVENTS)]


@pytest.mark.parametrize("error", ["rank_busy", "unknown_group"])
def test_a_join_refused_for_a_passing_reason_is_retried_after_join_retry_s(error):
    m = machine(join_retry_s=0.5)
    m.step(Start(0.0))
    assert m.step(EventsAnswered(0.0, ({"error": error, "detail": "..."},))) == []
    assert m.next_deadline() == 0.5
    assert m.step(Tick(0.4)) == []
    assert kinds(m.step(Tick(0.5))) == ["join"]
    assert error in (m.last_error or "")


@pytest.mark.parametrize("error", ["forbidden", "rank_out_of_range", "invalid_event"])
def test_a_join_refused_for_good_stops_the_agent_naming_the_error(error):
    m = machine()
    m.step(Start(0.0))
    actions = m.step(EventsAnswered(0.0, ({"error": error, "detail": "rank 9 of 4"},)))
    assert actions == [Stopped("failed", f"join refused: {error}: rank 9 of 4")]
    assert m.stopped
    assert m.step(Tick(10.0)) == []


def test_an_input_refused_because_the_run_is_over_stops_the_agent_at_once():
    """``group_ended``: the run finished, was ended or deleted; a heartbeat refused so stops
    the agent naming it, as a join refused so does (no retry: nothing is taken again)."""
    m = joined(heartbeat_interval_s=1.0)
    m.step(updates(committed(20, 1, [0, 1])))
    assert m.step(Tick(1.0)) == [SendEvents((beat(1),), BEATS)]
    detail = "group 'g' (run 1) was ended at offset 30 (rerun); ... another group name"
    answer = EventsAnswered(1.0, ({"error": "group_ended", "detail": detail},), BEATS)
    assert m.step(answer) == [Stopped("failed", f"heartbeat refused: group_ended: {detail}")]
    assert m.stopped and m.step(Tick(10.0)) == []
    m = machine()
    m.step(Start(0.0))
    actions = m.step(EventsAnswered(0.0, ({"error": "group_ended", "detail": detail},)))
    assert actions == [Stopped("failed", f"join refused: group_ended: {detail}")]


def test_twin_a_heartbeat_refused_for_a_passing_reason_keeps_the_agent_running():
    m = joined(heartbeat_interval_s=1.0)
    m.step(updates(committed(20, 1, [0, 1])))
    m.step(Tick(1.0))
    answer = EventsAnswered(1.0, ({"error": "stale_version", "detail": "..."},), BEATS)
    m.step(answer)
    assert not m.stopped


# -- heartbeats, their lane and retries ---------------------------------------------------------


def test_heartbeats_every_interval_once_joined_with_the_committed_version_in_their_lane():
    m = joined(heartbeat_interval_s=1.0)
    m.step(updates(committed(20, 1, [0, 1])))
    assert m.next_deadline() == 1.0
    assert m.step(Tick(0.99)) == []
    actions = m.step(Tick(1.0))
    assert actions == [SendEvents((beat(1),), BEATS)]
    assert m.step(beat_ok(1.0)) == []
    assert m.next_deadline() == 2.0


def test_an_undelivered_batch_is_resent_after_a_growing_backoff():
    m = joined(retry_initial_s=0.1, retry_max_s=0.3, heartbeat_interval_s=100.0)
    batch = sent(m.step(LinkEvidence(1.0, 1, {0: "down"}, (0,))))
    assert [type(e) for e in batch] == [LinksEvent]
    assert m.step(EventsFailed(1.0, "connection refused")) == []
    assert m.next_deadline() == pytest.approx(1.1)
    assert m.step(Tick(1.09)) == []
    assert sent(m.step(Tick(1.1))) == batch
    m.step(EventsFailed(1.1, "connection refused"))
    assert m.next_deadline() == pytest.approx(1.3)
    m.step(Tick(1.3))
    m.step(EventsFailed(1.3, "connection refused"))
    assert m.next_deadline() == pytest.approx(1.6)  # capped at retry_max_s
    assert "connection refused" in (m.last_error or "")


def test_a_failed_beat_backs_off_growing_and_capped_and_an_answer_resets_it():
    m = joined(retry_initial_s=2.0, retry_max_s=3.0, heartbeat_interval_s=1.0)
    assert kinds(m.step(Tick(1.0)), BEATS) == ["heartbeat"]
    assert m.step(EventsFailed(1.0, "coordinator away", BEATS)) == []
    assert "coordinator away" in (m.last_error or "")
    assert m.step(Tick(2.0)) == []  # due, but backing off until 3.0
    assert kinds(m.step(Tick(3.0)), BEATS) == ["heartbeat"]
    m.step(EventsFailed(3.0, "coordinator away", BEATS))  # backoff 4.0 capped at 3.0
    assert m.step(Tick(4.0)) == []
    assert m.step(Tick(5.99)) == []
    assert kinds(m.step(Tick(6.0)), BEATS) == ["heartbeat"]
    m.step(beat_ok(6.0))
    assert kinds(m.step(Tick(7.0)), BEATS) == ["heartbeat"]  # no backoff after an answer


def test_twin_a_failed_beat_does_not_hold_back_the_events_lane():
    m = joined(retry_initial_s=5.0, retry_max_s=5.0, heartbeat_interval_s=1.0)
    m.step(Tick(1.0))
    m.step(EventsFailed(1.0, "coordinator away", BEATS))
    actions = m.step(LinkEvidence(1.5, 1, {0: "down"}))
    assert actions == [SendEvents((links(self_ready=True, down=[0], version=1),), EVENTS)]


def test_only_the_newest_heartbeat_is_kept_while_the_coordinator_is_away():
    m = joined(retry_initial_s=5.0, retry_max_s=5.0)
    m.step(Tick(1.0))
    m.step(EventsFailed(1.0, "down", BEATS))
    assert m.step(Tick(2.0)) == []  # backoff until 6.0
    m.step(updates(committed(20, 1, [0, 1]), now=2.5))
    for t in (3.0, 4.0):
        assert m.step(Tick(t)) == []
    m.step(updates(committed(30, 2, [1], base=V1), now=4.5))
    assert m.step(Tick(6.0)) == [SendEvents((beat(2),), BEATS)]


def test_one_beat_in_flight_and_a_newer_beat_replaces_the_waiting_one():
    m = joined(heartbeat_interval_s=1.0)
    assert m.step(Tick(1.0)) == [SendEvents((beat(0),), BEATS)]
    m.step(updates(committed(20, 1, [0, 1]), now=1.5))
    assert m.step(Tick(2.0)) == []  # a beat is in flight: this one waits
    m.step(updates(committed(30, 2, [1], base=V1), now=2.5))
    assert m.step(Tick(3.0)) == []  # ...and is replaced by this one
    assert m.step(beat_ok(3.1)) == [SendEvents((beat(2),), BEATS)]
    assert m.step(Tick(3.5)) == []
    assert m.next_deadline() == 4.0


def test_an_ack_is_sent_while_a_beat_is_in_flight():
    m = joined(heartbeat_interval_s=1.0)
    m.step(Tick(1.0))  # a beat in flight
    actions = m.step(updates(prepare(20, 1, [0, 1], [0, 1]), now=1.1))
    assert sent(actions, EVENTS) == [ack(1)]
    assert sent(actions, BEATS) == []


def test_a_beat_is_sent_while_an_events_batch_is_in_flight_and_each_lane_keeps_its_own():
    m = joined(heartbeat_interval_s=1.0)
    assert kinds(m.step(LinkEvidence(0.5, 1, {0: "down"}))) == ["links"]
    assert m.step(Tick(1.0)) == [SendEvents((beat(0),), BEATS)]
    # the beat's answer does not free the events lane, nor the events' answer the beat lane
    assert m.step(beat_ok(1.1)) == []
    assert m.step(LinkEvidence(1.2, 1, {0: "down", 2: "down"})) == []
    assert m.step(Tick(2.0)) == [SendEvents((beat(0),), BEATS)]
    assert m.step(ok(1, 30, now=2.1)) == [
        SendEvents((links(self_ready=True, down=[0, 2], version=1),), EVENTS)
    ]
    assert m.step(Tick(3.0)) == []  # the beat sent at 2.0 is still unanswered


def test_nothing_more_is_sent_in_the_events_lane_while_a_batch_is_in_flight():
    m = joined(heartbeat_interval_s=100.0)
    assert kinds(m.step(LinkEvidence(1.0, 1, {0: "down"}))) == ["links"]
    assert m.step(LinkEvidence(1.1, 1, {0: "down"}, (0,))) == []
    assert sent(m.step(ok(1))) == [links(self_ready=True, down=[0], hint=[0], version=1)]


@pytest.mark.parametrize("error", ["stale_incarnation", "forbidden"])
def test_a_beat_refused_for_good_stops_the_agent(error):
    m = joined(heartbeat_interval_s=1.0)
    m.step(Tick(1.0))
    actions = m.step(EventsAnswered(1.1, ({"error": error, "detail": "no"},), BEATS))
    reason = "fenced" if error == "stale_incarnation" else "failed"
    assert actions == [Stopped(reason, f"heartbeat refused: {error}: no")]
    assert m.step(Tick(5.0)) == []


def test_twin_a_beat_refused_as_rank_offline_does_not_stop_the_agent():
    """An OFFLINE rank learns so from its updates and rejoins there."""
    m = joined(heartbeat_interval_s=1.0)
    m.step(Tick(1.0))
    assert m.step(EventsAnswered(1.1, ({"error": "rank_offline", "detail": "x"},), BEATS)) == []
    assert not m.stopped
    assert kinds(m.step(Tick(2.0)), BEATS) == ["heartbeat"]


# -- updates, offsets and the barrier ----------------------------------------------------------


def test_store_address_connects_the_data_plane_once():
    m = joined()
    first = m.step(updates(rank_state(12, "SYNCED")))
    assert ConnectDataPlane(STORE) in first
    second = m.step(updates(rank_state(13, "HEALTHY")))
    assert not [a for a in second if isinstance(a, ConnectDataPlane)]


MOVED = StoreAddress("127.0.0.1", 29511)


def test_a_moved_store_moves_the_data_plane_before_the_view_and_holds_the_ack():
    """A coordinator restart or failover advertises another store: the data plane moves there
    first, and a view this rank is active in is ACKed only once it is ready there."""
    m = joined()
    m.step(updates(committed(12, 1, [0, 1])))
    actions = m.step(
        updates(prepare(20, 2, [1], [0, 1], base=V1), committed(21, 2, [1], base=V1), store=MOVED)
    )
    moves = [i for i, a in enumerate(actions) if isinstance(a, MoveDataPlane)]
    installs = [i for i, a in enumerate(actions) if isinstance(a, InstallView)]
    assert [actions[i] for i in moves] == [MoveDataPlane(MOVED)]
    assert moves[0] < installs[0]
    assert not [a for a in actions if isinstance(a, ConnectDataPlane)]
    assert m.awaiting_data_plane

    m2 = joined()
    m2.step(updates(committed(12, 1, [0, 1])))
    held = m2.step(updates(prepare(20, 2, [1], [0, 1], base=V1), store=MOVED))
    assert MoveDataPlane(MOVED) in held and sent(held) == []
    assert m2.step(Tick(0.1)) == []
    ready = m2.step(DataPlaneReady(0.2))
    assert sent(ready) == [ack(2)]  # self_ready was reported once, before the move
    assert not m2.awaiting_data_plane
    again = m2.step(updates(rank_state(22, "HEALTHY"), store=MOVED))
    assert not [a for a in again if isinstance(a, MoveDataPlane | ConnectDataPlane)]


def test_a_rank_outside_the_next_view_acks_while_its_data_plane_moves():
    """The twin: a rank that is not in the new ``active_ranks`` builds nothing there."""
    m = joined()
    m.step(updates(committed(12, 1, [0, 1])))
    actions = m.step(updates(prepare(20, 2, [0], [0, 1], base=V1), store=MOVED))
    assert MoveDataPlane(MOVED) in actions
    assert kinds(actions) == ["ack"]


def test_polls_resume_after_the_last_processed_offset_and_skip_repeats():
    m = joined()
    actions = m.step(updates(committed(20, 1, [0, 1])))
    assert actions[-1] == PollUpdates(20, view=1)
    # after a reconnect the coordinator may send the same update again: it is not re-applied
    again = m.step(UpdatesReceived(0.5, (committed(20, 1, [0, 1]),), 20, STORE))
    assert not [a for a in again if isinstance(a, InstallView)]
    assert again[-1] == PollUpdates(20, view=1)
    failed = m.step(PollFailed(0.6, "reset"))
    assert failed == [PollUpdates(20, m.config.retry_initial_s, 1)]


def test_polls_carry_the_version_held():
    m = machine(heartbeat_interval_s=100.0)
    join = JoinEvent(group="g", rank=1, incarnation=INC)
    assert m.step(Start(0.0)) == [PollUpdates(0, 0.0, None), SendEvents((join,), EVENTS)]
    m.step(ok(1, 10))
    assert m.step(updates(committed(12, 1, [0, 1])))[-1] == PollUpdates(12, 0.0, 1)
    assert m.step(updates(committed(15, 2, [1], base=V1)))[-1] == PollUpdates(15, 0.0, 2)
    assert m.step(PollFailed(1.0, "reset")) == [PollUpdates(15, m.config.retry_initial_s, 2)]


def test_a_participant_acks_the_prepared_version_and_installs_the_committed_view():
    m = joined()
    actions = m.step(updates(prepare(20, 1, [0, 1], [0, 1])))
    assert sent(actions) == [ack(1)]
    m.step(ok(1))
    actions = m.step(updates(committed(25, 1, [0, 1])))
    installs = [a for a in actions if isinstance(a, InstallView)]
    assert [(a.view.version, a.view.active_ranks) for a in installs] == [(1, (0, 1))]
    assert m.view is not None
    assert m.view.rank_states == {0: "HEALTHY", 1: "HEALTHY", 2: "OFFLINE", 3: "OFFLINE"}


def test_a_delta_is_folded_into_the_view_held():
    m = joined()
    m.step(updates(committed(12, 1, [0, 1, 2])))
    base = m.view
    assert base == view(1, [0, 1, 2], 12)
    actions = m.step(updates(committed(20, 2, [0, 2], base=base)))
    assert [a.view for a in actions if isinstance(a, InstallView)] == [view(2, [0, 2], 20)]


def test_a_non_participant_does_not_ack_but_still_learns_the_view():
    m = joined(rank=3)
    actions = m.step(updates(prepare(20, 2, [0, 1, 2], [0, 1, 2])))
    assert kinds(actions) == []
    actions = m.step(updates(committed(25, 2, [0, 1, 2])))
    assert [a.view.version for a in actions if isinstance(a, InstallView)] == [2]


def test_an_ack_into_active_ranks_waits_for_the_data_plane():
    m = joined(ready=False)
    assert kinds(m.step(updates(prepare(20, 2, [0, 1], [0, 1])))) == []
    actions = m.step(DataPlaneReady(0.2))
    assert kinds(actions) == ["links", "ack"]
    assert sent(actions)[1].version == 2


def test_twin_an_ack_out_of_active_ranks_does_not_wait_for_the_data_plane():
    m = joined(ready=False)
    m.step(updates(committed(12, 1, [0, 1])))
    actions = m.step(updates(prepare(20, 2, [0], [0, 1], base=V1)))
    assert kinds(actions) == ["ack"]


def test_an_ack_waits_for_the_join():
    m = machine()
    m.step(Start(0.0))
    m.step(DataPlaneReady(0.0))
    assert kinds(m.step(updates(prepare(20, 1, [0, 1], [0, 1])))) == []
    assert kinds(m.step(ok(1))) == ["links", "ack"]


def test_each_version_is_acked_once():
    m = joined()
    m.step(updates(prepare(20, 2, [0, 1], [0, 1])))
    m.step(ok(1))
    again = m.step(UpdatesReceived(0.5, (prepare(20, 2, [0, 1], [0, 1]),), 20, STORE, resync=True))
    assert kinds(again) == []


def test_a_version_prepared_again_after_a_withdrawal_is_acked_again():
    """The twin of the test above: a later prepare of the same version is a new barrier."""
    m = joined()
    m.step(updates(prepare(20, 2, [0, 1], [0, 1])))
    m.step(ok(1))
    again = m.step(updates(prepare(30, 2, [0, 1], [0, 1])))
    assert sent(again) == [ack(2)]


def test_a_stale_version_answer_to_an_ack_is_ignored():
    m = joined()
    m.step(updates(prepare(20, 2, [0, 1], [0, 1])))
    actions = m.step(EventsAnswered(0.0, ({"error": "stale_version", "detail": "v3 now"},)))
    assert actions == []
    assert not m.stopped


def test_catching_up_on_history_installs_only_the_latest_view_and_acks_no_old_prepare():
    m = joined()
    history = [
        prepare(20, 1, [0, 1], [0, 1]),
        committed(22, 1, [0, 1]),
        prepare(30, 2, [0], [0, 1], base=V1),
        committed(33, 2, [0], base=V1),
    ]
    actions = m.step(updates(*history))
    assert [a.view for a in actions if isinstance(a, InstallView)] == [view(2, [0], 33)]
    assert kinds(actions) == []


def test_a_resync_answer_is_applied_even_below_the_offset():
    m = joined()
    m.step(updates(committed(50, 3, [0, 1])))
    actions = m.step(UpdatesReceived(1.0, (committed(40, 4, [1]),), 50, STORE, resync=True))
    assert [a.view.version for a in actions if isinstance(a, InstallView)] == [4]


def test_a_full_view_in_a_resync_replaces_the_view_held():
    """``base: 0`` is the whole view: what the old view had and it lacks is gone."""
    m = joined()
    m.step(updates(committed(50, 3, [0, 1, 2])))
    actions = m.step(UpdatesReceived(1.0, (committed(60, 5, [1]),), 60, STORE, resync=True))
    assert [a.view for a in actions if isinstance(a, InstallView)] == [view(5, [1], 60)]
    assert m.view == view(5, [1], 60)


def test_twin_an_older_full_view_in_a_resync_does_not_replace_a_newer_one():
    m = joined()
    m.step(updates(committed(50, 3, [0, 1, 2])))
    actions = m.step(UpdatesReceived(1.0, (committed(40, 2, [1]),), 50, STORE, resync=True))
    assert not [a for a in actions if isinstance(a, InstallView)]
    assert m.view == view(3, [0, 1, 2], 50)


@pytest.mark.parametrize("kind", ["view_committed", "view_prepare"])
def test_a_delta_from_another_base_drops_the_view_and_polls_from_zero(kind):
    """Only a coordinator restored from an older copy sends one: start over from the log."""
    m = joined(heartbeat_interval_s=100.0)
    m.step(updates(committed(12, 1, [0, 1])))
    v2 = view(2, [0, 1, 2])
    stale = (
        committed(30, 3, [1, 2], base=v2)
        if kind == "view_committed"
        else prepare(30, 3, [1, 2], [1, 2], base=v2)
    )
    actions = m.step(updates(stale, committed(31, 4, [1], base=view(3, [1, 2])), now=1.0))
    assert actions == [PollUpdates(0)]
    assert m.view is None and m.after == 0
    assert kind in (m.last_error or "") and "holds version 1" in (m.last_error or "")
    # the coordinator answers a poll from 0 with a resync carrying the full view
    resync = m.step(UpdatesReceived(1.1, (committed(33, 3, [1, 2]),), 33, STORE, resync=True))
    assert [a.view for a in resync if isinstance(a, InstallView)] == [view(3, [1, 2], 33)]
    assert resync[-1] == PollUpdates(33, 0.0, 3)
    # and deltas from it apply again
    nxt = m.step(updates(committed(40, 4, [1], base=view(3, [1, 2])), now=1.2))
    assert [a.view for a in nxt if isinstance(a, InstallView)] == [view(4, [1], 40)]


def test_twin_a_delta_from_the_view_held_is_not_stale():
    m = joined(heartbeat_interval_s=100.0)
    m.step(updates(committed(12, 1, [0, 1])))
    actions = m.step(updates(committed(30, 2, [1], base=V1), now=1.0))
    assert actions[-1] == PollUpdates(30, 0.0, 2)
    assert m.view == view(2, [1], 30)


def test_a_resync_from_a_coordinator_behind_this_rank_resumes_at_its_head():
    m = joined(heartbeat_interval_s=100.0)
    m.step(updates(committed(500, 3, [0, 1])))
    assert m.after == 500
    # the coordinator was restored from an older copy whose log ends at offset 400
    answer = UpdatesReceived(1.0, (committed(390, 2, [0, 1]),), 400, STORE, resync=True)
    assert m.step(answer)[-1].after == 400


def test_a_restored_coordinator_makes_the_rank_forget_the_newer_log_and_join_again():
    m = joined(heartbeat_interval_s=100.0)
    m.step(updates(committed(500, 3, [0, 1])))
    answer = UpdatesReceived(
        1.0, (committed(390, 2, [0, 1]),), 400, STORE, resync=True, restored=True
    )
    actions = m.step(answer)
    assert m.view is not None and m.view.version == 2  # the restored log's view, not v3
    assert [a.after for a in actions if isinstance(a, PollUpdates)] == [400]
    assert kinds(actions) == ["join"]  # it may not know this incarnation


def test_twin_a_resync_ahead_of_this_rank_resumes_at_its_next_after():
    m = joined(heartbeat_interval_s=100.0)
    m.step(updates(committed(50, 3, [0, 1])))
    answer = UpdatesReceived(1.0, (committed(90, 4, [1]),), 120, STORE, resync=True)
    assert m.step(answer)[-1] == PollUpdates(120, 0.0, 4)


def test_shutdown_with_save_is_reported_once():
    m = joined()
    u = ShutdownUpdate(
        offset=60,
        group="g",
        reason="single_survivor",
        detail="1 of 4 ranks left",
        checkpoint_rank=None,
    )
    actions = m.step(updates(u))
    assert ShutdownWithSave("single_survivor", "1 of 4 ranks left") in actions
    again = m.step(UpdatesReceived(1.0, (u,), 60, STORE, resync=True))
    assert not [a for a in again if isinstance(a, ShutdownWithSave)]


# -- own state, rejoin and fencing --------------------------------------------------------------


def test_own_state_changes_are_reported_only_for_this_incarnation():
    m = joined()
    actions = m.step(updates(rank_state(12, "HEALTHY")))
    assert RankStateChanged("HEALTHY", "rank 1 is HEALTHY") in actions
    other = m.step(updates(rank_state(13, "OFFLINE", incarnation="old")))
    assert not [a for a in other if isinstance(a, RankStateChanged)]
    assert m.own_state == "HEALTHY"


def test_offline_after_our_join_rejoins_in_place_with_fresh_evidence():
    m = joined()
    m.step(updates(rank_state(12, "HEALTHY")))
    actions = m.step(updates(rank_state(40, "OFFLINE")))
    assert kinds(actions) == ["join"]
    actions = m.step(ok(1, 41))
    assert kinds(actions) == ["links"]
    assert sent(actions)[0].self_ready is True


def test_twin_offline_from_before_our_join_does_not_rejoin():
    m = machine()
    m.step(Start(0.0))
    m.step(ok(1, 50))  # joined at offset 50
    actions = m.step(updates(rank_state(40, "OFFLINE")))  # an earlier leave of this incarnation
    assert "join" not in kinds(actions)


def test_offline_seen_while_the_join_is_in_flight_is_judged_by_the_join_offset():
    m = machine()
    m.step(Start(0.0))
    m.step(updates(rank_state(60, "OFFLINE")))  # the coordinator dropped us after the join...
    actions = m.step(ok(1, 55))  # ...which it appended at 55
    assert kinds(actions) == ["join"]


def test_a_reported_death_is_not_contested_the_agent_stops():
    m = joined()
    death = rank_state(40, "OFFLINE", reason="reported by launcher", cause=CAUSE_DEATH_REPORTED)
    actions = m.step(updates(death))
    assert kinds(actions) == []
    assert actions[-1] == Stopped(
        "fenced", "rank 1: reported by launcher; not rejoining (a replacement takes the rank)"
    )


def test_twin_a_reason_that_reads_like_a_reported_death_without_the_cause_rejoins():
    """The agent reads the cause code, not the reason text meant for people."""
    m = joined()
    actions = m.step(updates(rank_state(40, "OFFLINE", reason="death reported by launcher")))
    assert kinds(actions) == ["join"]
    assert not m.stopped


def test_another_incarnation_after_our_join_fences_the_agent():
    m = joined()
    successor = rank_state(40, "SYNCED", incarnation="inc-b", rank_epoch=2)
    actions = m.step(updates(successor))
    assert actions[-1] == Stopped(
        "fenced", "rank 1 is now incarnation inc-b (rank_epoch 2); inc-a is stale"
    )


def test_twin_another_incarnation_before_our_join_is_history():
    m = machine()
    m.step(Start(0.0))
    m.step(
        updates(
            rank_state(5, "HEALTHY", incarnation="old"), rank_state(8, "OFFLINE", incarnation="old")
        )
    )
    actions = m.step(ok(1, 20))  # our join comes after the old incarnation's story
    assert not m.stopped
    assert not [a for a in actions if isinstance(a, Stopped)]


def test_rejoin_request_re_enters_the_join_path_and_drops_queued_evidence():
    m = joined(heartbeat_interval_s=100.0)
    assert kinds(m.step(LinkEvidence(1.0, 1, {2: "down"}))) == ["links"]  # in flight
    m.step(LinkEvidence(1.0, 1, {0: "down"}, (0,)))  # queued behind it
    m.step(Rejoin(1.1))
    actions = m.step(ok(1))
    assert kinds(actions) == ["join"]
    assert sent(m.step(ok(1))) == [links(self_ready=True, version=0)]


@pytest.mark.parametrize("refused_index", [0, 1])
def test_a_stale_incarnation_answer_fences_the_agent(refused_index):
    m = joined()
    m.step(updates(committed(12, 1, [0, 1])))
    m.step(LinkEvidence(1.0, 1, {0: "down"}))  # links in flight; links and ack queued behind it
    m.step(LinkEvidence(1.1, 1, {0: "up"}))
    m.step(updates(prepare(20, 2, [0, 1], [0, 1], base=V1), now=1.2))
    assert kinds(m.step(ok(1, 15, now=1.3))) == ["links", "ack"]
    detail = "rank 1 is now incarnation inc-b (rank_epoch 3); inc-a is stale"
    results = [{"offset": 30}, {"offset": 31}]
    results[refused_index] = {"error": "stale_incarnation", "detail": detail}
    kind = ["links", "ack"][refused_index]
    actions = m.step(EventsAnswered(2.1, tuple(results)))
    assert actions == [Stopped("fenced", f"{kind} refused: stale_incarnation: {detail}")]
    assert m.step(Tick(5.0)) == []
    assert m.next_deadline() is None


# -- link evidence ------------------------------------------------------------------------------


def test_link_evidence_becomes_a_links_event_naming_what_is_down_and_the_hint():
    m = joined()
    actions = m.step(LinkEvidence(0.5, 3, {2: "down", 0: "up"}, (2,)))
    assert actions == [SendEvents((links(self_ready=True, down=[2], hint=[2], version=3),))]


def test_evidence_that_everything_is_up_says_which_view_it_reached():
    m = joined()
    m.step(LinkEvidence(0.5, 3, {2: "down", 0: "up"}))
    m.step(ok(1, 20))
    actions = m.step(LinkEvidence(0.6, 3, {2: "up", 0: "up"}))
    assert sent(actions) == [links(self_ready=True, version=3, reached=3)]


def test_a_links_report_equal_to_the_last_since_the_join_is_not_sent_again():
    m = joined()  # reported self_ready: nothing down, no hint
    assert m.step(LinkEvidence(0.5, 3, {0: "up", 2: "up"})) == []  # says the same
    assert kinds(m.step(LinkEvidence(0.6, 3, {0: "up", 2: "down"}))) == ["links"]
    m.step(ok(1, 20))
    assert m.step(LinkEvidence(0.65, 3, {0: "up", 2: "down"})) == []  # the same, same view
    assert sent(m.step(LinkEvidence(0.8, 3, {0: "up", 2: "down"}, (0,)))) == [
        links(self_ready=True, down=[2], hint=[0], version=3)
    ]  # the hint changed


def test_the_same_down_evidence_found_on_a_newer_view_is_sent_again():
    """The coordinator counts down evidence about view v only against a peer whose process
    joined before v: found again on a newer view (rank 2 may be a replacement now), it is news."""
    m = joined()
    assert kinds(m.step(LinkEvidence(0.6, 3, {0: "up", 2: "down"}))) == ["links"]
    m.step(ok(1, 20))
    assert sent(m.step(LinkEvidence(0.7, 4, {0: "up", 2: "down"}))) == [
        links(self_ready=True, down=[2], version=4)
    ]


def test_twin_evidence_that_everything_is_up_is_not_sent_again_on_a_newer_view():
    """Only down evidence is tied to its view: after every view every rank would otherwise
    report that it reached everyone."""
    m = joined()
    assert sent(m.step(LinkEvidence(0.6, 3, {0: "up", 2: "down"})))
    m.step(ok(1, 20))
    assert sent(m.step(LinkEvidence(0.7, 3, {0: "up", 2: "up"}))) == [
        links(self_ready=True, version=3, reached=3)
    ]
    m.step(ok(1, 21))
    assert m.step(LinkEvidence(0.8, 4, {0: "up", 2: "up"})) == []


def test_twin_the_same_report_is_sent_again_after_a_rejoin():
    """The join clears this rank's evidence at the coordinator."""
    m = joined()
    assert kinds(m.step(LinkEvidence(0.5, 3, {2: "down"}))) == ["links"]
    m.step(ok(1, 20))
    assert m.step(LinkEvidence(0.6, 3, {2: "down"})) == []
    assert kinds(m.step(Rejoin(0.7))) == ["join"]
    assert sent(m.step(ok(1, 30))) == [links(self_ready=True, version=0)]
    m.step(ok(1, 31))
    assert sent(m.step(LinkEvidence(0.8, 3, {2: "down"}))) == [
        links(self_ready=True, down=[2], version=3)
    ]


def test_twin_readiness_is_part_of_the_report():
    m = joined(ready=False)
    assert sent(m.step(LinkEvidence(0.5, 0, {0: "up"}))) == [links(self_ready=False, version=0)]
    m.step(ok(1, 20))
    assert sent(m.step(DataPlaneReady(0.6))) == [links(self_ready=True, version=0)]


def test_twin_link_evidence_before_the_join_is_dropped():
    m = machine()
    m.step(Start(0.0))
    assert m.step(LinkEvidence(0.1, 1, {0: "down"}, (0,))) == []
    assert kinds(m.step(ok(1))) == []


# -- close --------------------------------------------------------------------------------------


def test_close_sends_exit_and_stops_when_it_is_appended():
    m = joined(heartbeat_interval_s=1.0)
    m.step(LinkEvidence(0.5, 1, {0: "down"}))  # a batch in flight
    assert m.step(Close(1.0)) == []
    assert kinds(m.step(ok(1))) == ["exit"]
    assert m.step(Tick(5.0)) == []  # no heartbeats while closing
    actions = m.step(ok(1, 90))
    assert actions == [Stopped("closed", "rank 1 left the group")]


def test_close_with_a_beat_in_flight_sends_exit_at_once_and_no_more_beats():
    m = joined(heartbeat_interval_s=1.0)
    m.step(Tick(1.0))  # a beat in flight
    assert kinds(m.step(Close(1.1))) == ["exit"]
    assert m.step(beat_ok(1.2)) == []
    assert m.step(Tick(5.0)) == []


def test_close_during_the_join_exits_after_it():
    m = machine()
    m.step(Start(0.0))
    assert m.step(Close(0.1)) == []
    assert kinds(m.step(ok(1))) == ["exit"]


def test_close_before_any_join_stops_at_once():
    m = machine()
    assert m.step(Close(0.0)) == [Stopped("closed", "closed before joining")]


def test_close_while_join_is_being_retried_stops_at_once():
    m = machine()
    m.step(Start(0.0))
    m.step(EventsAnswered(0.0, ({"error": "rank_busy", "detail": "incarnation x is HEALTHY"},)))
    assert m.step(Close(0.1)) == [Stopped("closed", "closed before joining")]


# -- properties ---------------------------------------------------------------------------------


class _Views:
    """A prepare and its commit, built at the time they are fed against the view the machine
    holds (as a coordinator would: a delta from the version before), or as full views."""

    def __init__(self, now: float, offset: int, version: int, active: list[int], full: bool):
        self.now, self.offset, self.version, self.active, self.full = (
            now,
            offset,
            version,
            active,
            full,
        )

    def __repr__(self) -> str:
        return f"_Views({self.now}, {self.offset}, {self.version}, {self.active}, {self.full})"

    def build(self, held: View | None) -> UpdatesReceived:
        participants = sorted(set(self.active) | set(held.active_ranks if held else ()))
        return updates(
            prepare(self.offset, self.version, self.active, participants, base=held),
            committed(self.offset + 1, self.version, self.active, base=None if self.full else held),
            now=self.now,
        )


class _Numbered:
    """A facet's event (the toy facet's ``toy_add``; ``valid`` False: fields that do not fit its
    Struct) or a progress report, numbered when it is fed, so that each answer names the one
    input it answers."""

    def __init__(self, now: float, progress: bool, valid: bool = True):
        self.now, self.progress, self.valid = now, progress, valid

    def __repr__(self) -> str:
        what = "progress" if self.progress else "toy_add" if self.valid else "toy_add (not valid)"
        return f"_Numbered({self.now}, {what})"

    def build(self, number: int) -> SendEvent:
        if self.progress:  # a report (``AgentEventBase.report``): the newest is sent
            fields = {"epoch": 0, "assignment": 1, "processed": number}
            return SendEvent(self.now, "progress", fields, ProgressEvent)
        return SendEvent(
            self.now, "toy_add", {"by": number if self.valid else str(number)}, AddEvent
        )


_lanes = st.sampled_from([EVENTS, BEATS])
_inputs = st.one_of(
    # half as often as the other inputs: a Close ends what the rest of the sequence exercises
    st.builds(
        lambda now, close: Close(now) if close else Tick(now),
        st.floats(0, 100),
        st.booleans(),
    ),
    st.builds(_Numbered, st.floats(0, 100), st.just(True)),
    st.builds(_Numbered, st.floats(0, 100), st.just(False), st.integers(0, 5).map(bool)),
    st.builds(Tick, st.floats(0, 100)),
    st.builds(DataPlaneReady, st.floats(0, 100)),
    st.builds(EventsFailed, st.floats(0, 100), st.just("down"), _lanes),
    st.builds(PollFailed, st.floats(0, 100), st.just("down")),
    st.builds(Rejoin, st.floats(0, 100)),
    st.builds(
        LinkEvidence,
        st.floats(0, 100),
        st.integers(0, 6),
        st.dictionaries(st.integers(0, 2), st.sampled_from(["up", "down"]), max_size=3),
    ),
    st.builds(
        lambda now, n, err, lane: EventsAnswered(
            now, tuple({"error": err} if err else {"offset": 100 + i} for i in range(n)), lane
        ),
        st.floats(0, 100),
        st.integers(0, 4),
        st.sampled_from(
            [None, None, "rank_busy", "stale_version", "rank_offline", "invalid_event"]
        ),
        _lanes,
    ),
    st.builds(
        _Views,
        st.floats(0, 100),
        st.integers(1, 200),
        st.integers(1, 6),
        st.lists(st.integers(0, 2), unique=True, max_size=3),
        st.booleans(),
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.booleans(), st.lists(_inputs, max_size=30))
# always: a report and a facet's event queued behind a batch in flight when Close comes
@example(
    True,
    [
        LinkEvidence(0.5, 1, {0: "down"}),
        _Numbered(0.6, progress=True),
        _Numbered(0.6, progress=False),
        Close(0.7),
        EventsAnswered(0.8, ({"offset": 20},), EVENTS),
    ],
)
def test_invariants_hold_for_any_input_sequence(from_joined, inputs):
    """One batch in flight at most in each lane, and only beats in the beat lane; nothing but
    a join before joining (or the exit after a join appended once Close came); offsets never go
    back; committed versions never go back; each version ACKed at most once. With Close,
    facets' events and progress reports among the inputs: a progress report is first sent only
    once joined, and one at most is new in a batch (one that failed goes again beside its newer
    replacement); it is answered at once when there is no join to report for; once closing,
    nothing new but ``exit`` is sent and a facet's event is answered at once; once stopped,
    nothing comes out; every answer names an event that was fed, and none is answered twice.
    Half the sequences start from a joined machine (nothing in flight), so that what follows a
    join is reached as often as the join itself."""
    if from_joined:
        m = joined()
        in_flight = {EVENTS: False, BEATS: False}
    else:
        m = machine()
        m.step(Start(0.0))
        in_flight = {EVENTS: True, BEATS: False}
    after, version, acked = 0, 0, []
    fed: set[tuple[str, Any]] = set()
    answered: list[tuple[str, Any]] = []
    ever_sent: set[bytes] = set()
    for number, item in enumerate(inputs):
        if isinstance(item, _Views):
            event = item.build(m.view)
        elif isinstance(item, _Numbered):
            event = item.build(number)
        else:
            event = item
        was_joined, was_phase = m.joined, m.phase
        actions = m.step(event)
        if was_phase == "stopped":
            assert actions == [], f"a stopped machine acted on {event}"
        if isinstance(event, SendEvent) and event.kind == "progress":
            fed.add(("progress", event.fields["processed"]))
            if was_phase != "joined" and was_phase != "stopped":
                refused = EventAnswered("progress", event.fields, None, "not_joined", was_phase)
                assert refused in actions
        elif isinstance(event, SendEvent):
            fed.add(("toy_add", event.fields["by"]))
            if was_phase == "closing":
                assert [a.error for a in actions if isinstance(a, EventAnswered)] == ["not_joined"]
        for action in actions:
            if isinstance(action, EventAnswered):
                key = "processed" if action.kind == "progress" else "by"
                answered.append((action.kind, action.fields[key]))
        if isinstance(event, EventsAnswered | EventsFailed):
            in_flight[event.lane] = False
        for lane in (EVENTS, BEATS):
            batches = [a for a in actions if isinstance(a, SendEvents) and a.lane == lane]
            assert len(batches) <= 1
            if not batches:
                continue
            assert not in_flight[lane], f"a second batch in {lane} while one is in flight"
            in_flight[lane] = True
            kinds_sent = [e.__struct_config__.tag for e in batches[0].events]
            types = set(kinds_sent)
            if lane == BEATS:
                assert types == {"heartbeat"} and len(batches[0].events) == 1
                assert m.joined and was_joined
            else:
                assert "heartbeat" not in types
                if not was_joined and not m.joined and m.phase != "closing":
                    assert types <= {"join"}
                # a batch that failed is sent again as it was: "new" is what was never sent
                new = [
                    kind
                    for kind, e in zip(kinds_sent, batches[0].events, strict=True)
                    if msgspec.json.encode(e) not in ever_sent
                ]
                if "progress" in new:
                    assert was_joined or m.joined
                    assert new.count("progress") == 1, kinds_sent
                if m.phase == "closing":
                    assert set(new) <= {"exit"}, kinds_sent
                ever_sent.update(msgspec.json.encode(e) for e in batches[0].events)
                acked += [e.version for e in batches[0].events if type(e) is AckEvent]
        assert m.after >= after
        after = m.after
        current = m.view.version if m.view else 0
        assert current >= version
        version = current
    assert len(acked) == len(set(acked))
    assert set(answered) <= fed, set(answered) - fed
    assert len(answered) == len(set(answered)), answered


def test_the_same_store_address_with_a_new_id_is_another_store_and_the_data_plane_moves():
    """A coordinator restarted on a fixed --store-port advertises the same address, but a store
    that lost its keys: its id tells them apart."""
    m = joined()
    before = StoreAddress("127.0.0.1", 29500, "first")
    m.step(updates(store=before))
    actions = m.step(updates(store=StoreAddress("127.0.0.1", 29500, "second")))
    assert MoveDataPlane(StoreAddress("127.0.0.1", 29500, "second")) in actions
    assert m.awaiting_data_plane
    # twin: the same store (same id) again moves nothing
    again = m.step(updates(store=StoreAddress("127.0.0.1", 29500, "second")))
    assert not any(isinstance(a, MoveDataPlane) for a in again)


def links_of(actions: list) -> list[dict]:
    """The links reports among the actions, as the wire carries them."""
    return [msgspec.to_builtins(e) for e in sent(actions) if type(e) is LinksEvent]


def test_a_failure_that_blames_nobody_is_reported_once_per_view_with_its_operations():
    """Such a failure used to look like the empty report before it and was never sent; the
    coordinator needs it to replace the view (``coordinator.fold.stalls``)."""
    m = joined()
    m.step(LinkEvidence(0.5, 1, {}))  # view 1 built: "reached every member"
    [event] = links_of(m.step(LinkEvidence(1.0, 1, {}, (), (12, 11))))
    assert (event["failed"], event["issued"], event["completed"]) == (1, 12, 11)
    assert "reached" not in event and "down" not in event and "hint" not in event
    assert links_of(m.step(LinkEvidence(1.1, 1, {}, (), (12, 11)))) == []  # the same failure
    m.step(ok(1, 20, now=1.2))
    [again] = links_of(m.step(LinkEvidence(2.0, 2, {}, (), (0, 0))))  # the retry view failed too
    assert (again["failed"], again["issued"]) == (2, 0)


def test_twin_a_failure_with_a_hint_carries_no_operation_counts():
    m = joined()
    [event] = links_of(m.step(LinkEvidence(1.0, 1, {0: "down"}, (0,), (12, 11))))
    assert "failed" not in event and "issued" not in event


def test_the_shutdown_directive_names_the_checkpoint_rank_and_views_carry_it():
    m = joined()
    m.step(updates(committed(40, 1, [0, 1, 2])))
    assert m.view is not None and m.view.checkpoint_rank is None  # a view without one
    named = msgspec.structs.replace(committed(50, 2, [1, 2], base=m.view), checkpoint_rank=1)
    m.step(updates(named))
    assert m.view.checkpoint_rank == 1
    u = ShutdownUpdate(
        offset=60, group="g", reason="max_failure_exceeded", detail="2 failed", checkpoint_rank=2
    )
    assert ShutdownWithSave("max_failure_exceeded", "2 failed", 2) in m.step(updates(u))


# -- every update, by class ----------------------------------------------------------------------


def test_the_machine_follows_membership_updates_and_hands_on_the_facets() -> None:
    """The machine dispatches on the update's class: the view's, the rank's state and the
    shutdown are its own, the protocol's; every other Struct a worker reads is a facet's,
    handed on (below)."""
    own = {ViewPrepareUpdate, ViewCommittedUpdate, RankStateUpdate, ShutdownUpdate}
    assert set(_ON_UPDATE) == own == set(UPDATE_TYPES.values())
    assert own < set(worker_facets.UPDATES.types.values())


def test_the_epochs_and_refits_updates_are_handed_on_and_only_this_ranks_part() -> None:
    m = joined()
    mine = DataAssignmentUpdate(
        offset=21, group="g", rank=1, epoch=0, assignment=1, processed=0, remaining=((0, 5),)
    )
    theirs = msgspec.structs.replace(mine, rank=2, remaining=((5, 5),))
    handed = [
        EpochPlanUpdate(
            offset=21,
            group="g",
            version=1,
            epoch=0,
            dataset_size=10,
            seed=0,
            shuffle=True,
            split="equal",
            grain=1,
            lookahead=4,
            reclaim=False,
        ),
        mine,
        DataMovesUpdate(offset=22, group="g", epoch=0, assignment=2, moves=(), reported=(2,)),
        EpochCompleteUpdate(offset=23, group="g", epoch=0),
    ]
    refits = [
        RefitEpochUpdate(
            offset=24,
            refit="rl",
            groups=("g", "h"),
            epoch=1,
            status="waiting",
            cause="created",
            deadline_ts=None,
            digest=None,
            lanes=1,
            publisher_ranks=(),
            subscriber_ranks=(),
            missing=(),
        ),
        TransferUpdate(
            offset=25,
            refit="rl",
            groups=("g", "h"),
            transfer=1,
            key="k",
            attempt=1,
            epoch=1,
            status="running",
            detail="",
            deadline_ts=None,
        ),
        RefitBootstrapUpdate(offset=26, refit="rl", epoch=1, bootstrap={"store": "h:1"}),
    ]
    actions = m.step(updates(handed[0], mine, theirs, *handed[2:], *refits))
    data = (EpochPlanUpdate, DataAssignmentUpdate, DataMovesUpdate, EpochCompleteUpdate)
    facets = [a.update for a in actions if isinstance(a, FacetUpdate)]
    assert [u for u in facets if isinstance(u, data)] == handed
    assert [u for u in facets if not isinstance(u, data)] == refits


class _CounterUpdate(Update, frozen=True, kw_only=True, tag="test_counter"):
    """A facet's update the machine does not follow itself (its group's)."""

    group: str
    count: int


class _OwnCounterUpdate(Update, frozen=True, kw_only=True, tag="test_own_counter"):
    """A facet's update for one rank."""

    audience: ClassVar[str] = OWN_RANK

    group: str
    rank: int
    count: int


def test_a_facets_update_is_handed_on_and_only_this_ranks() -> None:
    m = joined()
    group = _CounterUpdate(offset=21, group="g", count=3)
    mine = _OwnCounterUpdate(offset=22, group="g", rank=1, count=4)
    theirs = _OwnCounterUpdate(offset=23, group="g", rank=2, count=5)
    actions = m.step(updates(group, mine, theirs))
    assert [a.update for a in actions if isinstance(a, FacetUpdate)] == [group, mine]
    assert m.after == 23


# -- a facet's events --------------------------------------------------------------------------


def add(now: float, by: int) -> SendEvent:
    """The toy facet's event, as ``Agent.send_event(AddEvent, by=...)`` hands it on."""
    return SendEvent(now, "toy_add", {"by": by}, AddEvent)


def test_a_facet_s_event_goes_in_the_events_lane_and_its_answer_comes_back_to_its_sender() -> None:
    m = joined()
    out = m.step(add(1.0, 2))
    assert sent(out, EVENTS) == [AddEvent(group="g", rank=1, incarnation=INC, by=2)]
    answered = m.step(ok(1, 40, now=1.1))
    assert [a for a in answered if isinstance(a, EventAnswered)] == [
        EventAnswered("toy_add", {"by": 2}, 40)
    ]


def test_a_facet_s_event_refused_is_answered_and_the_agent_goes_on() -> None:
    m = joined()
    m.step(add(1.0, 0))
    refused = EventsAnswered(1.1, ({"error": "invalid_event", "detail": "by must be"},), EVENTS)
    out = m.step(refused)
    assert [a for a in out if isinstance(a, EventAnswered)] == [
        EventAnswered("toy_add", {"by": 0}, None, "invalid_event", "by must be")
    ]
    assert not [a for a in out if isinstance(a, Stopped)] and m.phase == "joined"


def test_twin_a_facet_s_event_refused_as_stale_stops_the_agent_like_any_event() -> None:
    m = joined()
    m.step(add(1.0, 1))
    stale = EventsAnswered(1.1, ({"error": "stale_incarnation", "detail": "newer"},), EVENTS)
    out = m.step(stale)
    assert [a.reason for a in out if isinstance(a, Stopped)] == ["fenced"]
    assert not [a for a in out if isinstance(a, EventAnswered)]


def test_a_facet_s_event_before_the_join_waits_behind_it_and_the_agent_s_own_are_refused():
    m = machine()
    m.step(Start(0.0))
    assert m.step(add(0.1, 1)) == []  # queued, not answered
    assert kinds(m.step(Tick(0.2))) == []  # the join is in flight: nothing goes beside it
    after_join = m.step(ok(1, 10, now=0.3))
    assert "toy_add" in kinds(after_join) + kinds(m.step(Tick(0.4)))
    for own in ("join", "heartbeat", "links", "ack", "exit"):
        with pytest.raises(ValueError, match="not a facet's event"):
            joined().step(SendEvent(1.0, own, {}))


def report(now: float, processed: int) -> SendEvent:
    """The epochs' progress, a report (``AgentEventBase.report``), as its worker part sends it."""
    fields = {"epoch": 0, "assignment": 1, "processed": processed}
    return SendEvent(now, "progress", fields, ProgressEvent)


def test_a_facet_s_report_is_sent_newest_only_and_never_before_the_join() -> None:
    """The twin of the test above: a report declares itself one (the epochs' progress), so it
    is answered ``not_joined`` at once before the join, a newer one replaces one not sent yet,
    and a rejoin drops it (its sender reports again); another facet's event waits."""
    m = machine()
    m.step(Start(0.0))
    early = m.step(report(0.1, 1))
    assert early == [EventAnswered("progress", report(0, 1).fields, None, "not_joined", "joining")]
    m.step(ok(1, 10, now=0.2))  # joined
    m.step(add(0.3, 1))  # in flight
    m.step(report(0.4, 2))
    m.step(report(0.5, 3))
    out = m.step(ok(1, 20, now=0.6))
    assert [getattr(e, "processed", None) for e in sent(out, EVENTS)] == [3]
    m.step(report(0.7, 4))  # both wait behind the batch in flight
    m.step(add(0.7, 2))
    m.step(Rejoin(0.8))
    assert kinds(m.step(ok(1, 21, now=0.9))) == ["join"]
    after = m.step(ok(1, 30, now=1.0)) + m.step(Tick(1.1))
    assert kinds(after) == ["toy_add"]  # the report was dropped, the facet's event kept


def test_a_facet_s_event_is_kept_through_a_rejoin_and_refused_once_the_agent_closes() -> None:
    m = joined()
    m.step(updates(committed(12, 1, [0, 1])))
    m.step(add(1.0, 1))  # in flight
    m.step(Rejoin(1.1))
    resent = m.step(EventsFailed(1.2, "connection reset"))
    later = m.step(Tick(5.0))
    assert kinds(resent + later)[:1] == ["join"]  # the join first, the event kept behind it
    assert "toy_add" in kinds(m.step(ok(1, 30, now=5.1)) + m.step(Tick(10.0)))
    m.step(Close(11.0))
    closing = m.step(add(11.1, 2))
    assert closing == [EventAnswered("toy_add", {"by": 2}, None, "not_joined", "closing")]


def test_a_facet_s_event_without_its_struct_or_not_fitting_it_is_refused_with_a_reason() -> None:
    # a facet's own mistake (no Struct, the wrong one): the input is refused
    with pytest.raises(ValueError, match="'toy_add' is not an event of the protocol"):
        joined().step(SendEvent(1.0, "toy_add", {"by": 1}))
    with pytest.raises(ValueError, match="'toy_sub' is not the type of AddEvent"):
        joined().step(SendEvent(1.0, "toy_sub", {"by": 1}, AddEvent))
    # fields its caller chose that do not fit: answered to that caller, the agent goes on
    m = joined()
    out = m.step(SendEvent(1.0, "toy_add", {"by": "two"}, AddEvent))
    (answer,) = [a for a in out if isinstance(a, EventAnswered)]
    assert answer.fields == {"by": "two"} and "toy_add" not in kinds(out)
    assert (answer.offset, answer.error) == (None, "invalid_event")
    assert "not a valid 'toy_add' event" in answer.detail and "by" in answer.detail
    assert m.phase == "joined" and "toy_add" in kinds(m.step(add(1.1, 3)) + m.step(Tick(2.0)))


# -- a replacement and the views before it -----------------------------------------------------


def _installs(actions: list) -> list[tuple[int, bool]]:
    return [(a.view.version, a.member) for a in actions if isinstance(a, InstallView)]


def test_a_view_committed_before_this_incarnation_joined_does_not_take_it_in() -> None:
    """A replacement of rank 1 starts before the coordinator has seen the death of the
    process it replaces: the view it reads first (a resync, before its join is answered)
    lists rank 1 for that process; the deactivation that follows its join, and only a later
    activation, take this process in."""
    m = machine()
    m.step(Start(0.0))
    first = m.step(UpdatesReceived(0.1, (committed(5, 1, [0, 1]),), 5, STORE, resync=True))
    assert _installs(first) == [(1, False)] and not m.member_of(m.view)
    m.step(ok(1, 20, now=0.2))  # the join, appended after view 1
    assert not m.member_of(m.view)
    deactivated = m.step(updates(committed(25, 2, [0], m.view)))
    assert _installs(deactivated) == [(2, False)]
    activated = m.step(updates(committed(40, 3, [0, 1], m.view)))
    assert _installs(activated) == [(3, True)] and m.member_of(m.view)


def test_twin_a_rank_that_joined_before_the_formation_is_a_member_of_it() -> None:
    m = joined()  # the join at offset 10
    formed = m.step(updates(committed(12, 1, [0, 1])))
    assert _installs(formed) == [(1, True)]


def test_twin_a_rejoin_in_place_keeps_the_view_this_incarnation_is_in() -> None:
    m = joined()
    m.step(updates(committed(12, 1, [0, 1])))
    m.step(Rejoin(1.0))
    m.step(ok(1, 30, now=1.1))  # the same incarnation's join again, after view 1
    assert m.member_of(m.view)


# -- the tables: inputs by phase, and the phase changes ----------------------------------------


def test_an_input_the_machine_cannot_take_is_refused_naming_it_and_the_phase() -> None:
    with pytest.raises(InputRefused, match="PollUpdates is not an input of the agent machine"):
        machine().step(PollUpdates(0))  # an action, fed back by mistake
    with pytest.raises(InputRefused, match="rank 1: EventsAnswered in phase 'new': nothing was"):
        machine().step(ok(1))
    with pytest.raises(InputRefused, match="Start in phase 'joined': a machine starts once"):
        joined().step(Start(2.0))


def test_twin_a_stopped_machine_takes_every_input_and_does_nothing() -> None:
    m = joined()
    m.step(Close(1.0))
    assert [a.reason for a in m.step(ok(1, 20, now=1.1)) if isinstance(a, Stopped)] == ["closed"]
    assert m.step(Start(2.0)) == [] and m.step(ok(1, now=2.1)) == []


def test_every_phase_change_is_in_the_table_and_no_other_is_made() -> None:
    m = machine()
    m.step(Start(0.0))
    m.step(ok(1))
    assert (m.phase, ("joining", "joined") in TRANSITIONS) == ("joined", True)
    with pytest.raises(RuntimeError, match="no transition joined -> new"):
        m._enter("new")
    assert all(cls in INPUTS for cls in get_args(Input))


def test_a_facet_s_worker_part_events_are_routed_by_its_protocol_module_alone() -> None:
    """The events of a facet whose ``protocol`` module declares a worker part (``WORKER``) are
    that part's to send and be answered (the refits', the epochs' progress), by kind; ``Agent.send_event`` refuses
    them, naming the facet, and every other facet's event is its own (the toy facet's)."""
    from foldplane.agent.events import event_fields
    from foldplane.facets.refits import protocol as refits

    tags = {e.__struct_config__.tag for e in refits.EVENTS}
    assert {**dict.fromkeys(tags, "refits"), "progress": "epochs"} == worker_facets.ANSWERED_BY
    assert AddEvent.__struct_config__.tag not in worker_facets.ANSWERED_BY
    fields = {"refit": "r", "epoch": 1, "key": "k"}
    with pytest.raises(
        ValueError, match="'transfer' is the event of the refits facet's worker part"
    ):
        event_fields(refits.TransferEvent, fields, {})
