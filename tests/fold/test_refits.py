"""Weight refits in the fold: rendezvous, admission by digest, bootstrap, transfers, epochs that
move with either group's membership, and every refusal (records at chosen times in, effects
out; the same rules reach HTTP in tests/service/test_refits_api.py)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from foldplane.coordinator.fold.effects import (
    Refused,
)
from foldplane.coordinator.fold.machine import Coordinator
from foldplane.coordinator.host.reads import ReadsPublisher
from foldplane.facets.refits.effects import (
    RefitBootstrap,
    RefitCreated,
    RefitEpochChanged,
    TransferChanged,
)
from foldplane.facets.refits.inputs import complete_spec
from foldplane.facets.refits.rows import ROWS
from tests.fold.script import T0, S, Script, of, one

D1 = "a" * 64
D2 = "b" * 64


def refit_spec(**fields: Any) -> dict[str, Any]:
    return complete_spec(
        {
            "refit": "rl",
            "publisher": "train",
            "subscriber": "gen",
            "publisher_slots": 2,
            "subscriber_slots": 4,
            **fields,
        }
    )


def world(**fields: Any) -> Script:
    s = Script()
    s.form("train", world_size=2, heartbeat_timeout_s=3600.0)
    s.form("gen", world_size=4, heartbeat_timeout_s=3600.0)
    s.record("refit_created", None, None, refit_spec(**fields))
    return s


def epoch_of(s: Script, name: str = "rl") -> int:
    r = s.m.facet("refits").refit(name)
    assert r is not None
    return r.epoch


def join(
    s: Script, group: str, rank: int, slot: int | None = None, digest: str = D1, **extra: Any
) -> list[Any]:
    payload = {
        "incarnation": s.inc(rank, group),
        "refit": "rl",
        "epoch": epoch_of(s),
        "slot": rank if slot is None else slot,
        "digest": digest,
        **extra,
    }
    return s.record("refit_join", group, rank, payload)


def join_all(s: Script, digest: str = D1) -> list[Any]:
    out: list[Any] = []
    for r in range(2):
        out += join(s, "train", r, digest=digest)
    for r in range(4):
        out += join(s, "gen", r, digest=digest)
    return out


def event(s: Script, kind: str, group: str, rank: int, **fields: Any) -> list[Any]:
    payload = {"incarnation": s.inc(rank, group), "refit": "rl", "epoch": epoch_of(s), **fields}
    return s.record(kind, group, rank, payload)


def refused(out: list[Any], code: str, *words: str) -> Refused:
    r = one(out, Refused)
    assert r.code == code, r
    for w in words:
        assert w in r.message, r.message
    return r


def start(s: Script, key: str = "step-1") -> TransferChanged:
    return one(event(s, "transfer", "train", 0, key=key), TransferChanged)


def report(s: Script, group: str, rank: int, t: TransferChanged, status: str = "done", **kw: Any):
    return event(
        s,
        "transfer_status",
        group,
        rank,
        transfer=t.transfer,
        attempt=t.attempt,
        status=status,
        **kw,
    )


def report_all(s: Script, t: TransferChanged) -> list[Any]:
    out: list[Any] = []
    for r in range(2):
        out += report(s, "train", r, t)
    for r in range(4):
        out += report(s, "gen", r, t)
    return out


def kill(s: Script, group: str, rank: int, at: float) -> list[Any]:
    out = s.at(at).death(rank, group)
    out += s.at(at + 1).tick()
    out += s.ack_all(group)
    return out


# -- creation -----------------------------------------------------------------------------------


def test_a_refit_begins_waiting_with_a_readiness_deadline_and_creating_it_again_is_the_same() -> (
    None
):
    s = Script()
    s.form("train", world_size=2)
    s.form("gen", world_size=4)
    out = s.at(5).record("refit_created", None, None, refit_spec(readiness_timeout_s=30.0))
    created = one(out, RefitCreated)
    assert created.spec["lanes"] == 4
    epoch = one(out, RefitEpochChanged)
    assert (epoch.epoch, epoch.status, epoch.cause) == (1, "waiting", "the refit was created")
    assert epoch.deadline_ts == s.now + 30 * 10**9
    assert s.m.repeat_of("refit_created", None, None, refit_spec(readiness_timeout_s=30.0)) == (
        created.offset
    )
    refused(s.record("refit_created", None, None, refit_spec(lanes=8)), "refit_conflict", "lanes")


@pytest.mark.parametrize(
    ("fields", "code", "text"),
    [
        ({"lanes": 0}, "invalid_event", "lanes must be an integer in 1..64"),
        ({"lanes": 65}, "invalid_event", "lanes"),
        ({"publisher_slots": 0}, "invalid_event", "publisher_slots"),
        ({"subscriber_slots": -1}, "invalid_event", "subscriber_slots"),
        ({"subscriber_slots": 5}, "invalid_slot", "group 'gen' has 4 ranks"),
        ({"readiness_timeout_s": 0}, "invalid_event", "readiness_timeout_s"),
        ({"readiness_timeout_s": -1.0}, "invalid_event", "readiness_timeout_s"),
        ({"readiness_timeout_s": 1e12}, "invalid_event", "readiness_timeout_s"),
        ({"transfer_timeout_s": float("nan")}, "invalid_event", "transfer_timeout_s"),
        ({"transfer_timeout_s": float("inf")}, "invalid_event", "transfer_timeout_s"),
        ({"transfer_timeout_s": True}, "invalid_event", "transfer_timeout_s"),
        ({"subscriber": "train"}, "invalid_event", "the same group"),
        ({"subscriber": "nobody"}, "unknown_group", "'nobody'"),
        ({"refit": "bad name"}, "invalid_event", "refit must be"),
        ({"refit": "r" * 65}, "invalid_event", "refit must be"),
        ({"digest": "xyz"}, "invalid_event", "digest must be 64"),
        ({"surprise": 1}, "invalid_event", "unknown field"),
    ],
)
def test_a_bad_definition_is_refused_naming_the_field(fields: dict, code: str, text: str) -> None:
    s = Script()
    s.form("train", world_size=2)
    s.form("gen", world_size=4)
    refused(s.record("refit_created", None, None, refit_spec(**fields)), code, text)
    assert s.m.facet("refits").names() == []


# -- admission ------------------------------------------------------------------------------------


def test_every_slot_joined_with_one_digest_admits_the_epoch_publishers_first() -> None:
    s = world()
    out = join_all(s)
    admitted = one(out, RefitEpochChanged)
    assert admitted.status == "admitted" and admitted.digest == D1 and admitted.lanes == 4
    assert (admitted.publisher_ranks, admitted.subscriber_ranks) == ((0, 1), (0, 1, 2, 3))
    members = s.m.facet("refits").refit("rl").members()  # type: ignore[union-attr]
    assert [(m["role"], m["slot"], m["group"], m["rank"], m["refit_rank"]) for m in members] == [
        ("publisher", 0, "train", 0, 0),
        ("publisher", 1, "train", 1, 1),
        ("subscriber", 0, "gen", 0, 2),
        ("subscriber", 1, "gen", 1, 3),
        ("subscriber", 2, "gen", 2, 4),
        ("subscriber", 3, "gen", 3, 5),
    ]
    # the same join again is answered with the first
    payload = {"incarnation": s.inc(0, "gen"), "refit": "rl", "epoch": 1, "slot": 0, "digest": D1}
    assert s.m.repeat_of("refit_join", "gen", 0, payload) is not None


def test_a_digest_mismatch_is_refused_naming_who_holds_which() -> None:
    s = world()
    join(s, "train", 0)
    join(s, "train", 1)
    r = refused(join(s, "gen", 2, digest=D2), "digest_mismatch", "subscriber slot 2 (gen rank 2)")
    assert "publisher slot 0 (train rank 0)" in r.message and "bbbbbbbbbbbb" in r.message
    # with the digest declared, the first joiner is held to it as well
    s2 = world(digest=D2)
    refused(join(s2, "train", 0), "digest_mismatch", "the refit's definition")


def test_a_readiness_timeout_on_a_tick_alone_is_published_in_the_refits_read_model() -> None:
    """The tick that times an epoch out is the only record of its cycle: the refits read model
    published after it shows the epoch timed out (as one built afresh does), not the waiting
    epoch of the cycle before, which it would otherwise keep sharing."""
    s = world(readiness_timeout_s=10.0)
    join(s, "train", 0)
    publisher = ReadsPublisher(s.m)
    waiting = publisher.publish().facet("refits").status("rl")  # this cycle's changes read
    assert waiting is not None and waiting["status"] == "waiting"
    assert waiting["deadline_ts"] == T0 + 10 * S

    out = s.at(11).tick()
    assert one(out, RefitEpochChanged).status == "timed_out"
    refit = s.m.facet("refits").refit("rl")
    assert refit is not None and refit.status == "timed_out" and refit.deadline is None

    published = publisher.publish().facet("refits").status("rl")
    assert published == ReadsPublisher(s.m).current.facet("refits").status("rl")
    assert published is not None and published["status"] == "timed_out"
    assert published["deadline_ts"] is None
    assert published["missing"] == [
        "publisher slot 1",
        "subscriber slot 0",
        "subscriber slot 1",
        "subscriber slot 2",
        "subscriber slot 3",
    ]


def test_the_readiness_timeout_names_the_slots_that_never_joined() -> None:
    s = world(readiness_timeout_s=10.0)
    join(s, "train", 0)
    join(s, "train", 1)
    join(s, "gen", 0)
    join(s, "gen", 3)
    assert s.m.next_deadline() is not None
    out = s.at(11).tick()
    timed_out = one(out, RefitEpochChanged)
    assert timed_out.status == "timed_out"
    assert timed_out.missing == ("subscriber slot 1", "subscriber slot 2")
    refused(join(s, "gen", 1), "refit_not_ready", "timed out", "subscriber slot 1")
    # a transfer asked in the timed-out epoch is told who never joined, by the operator and by
    # a publisher alike (docs/protocol.md: refit_not_ready names the missing slots)
    for asked in (
        s.record("transfer", None, None, {"refit": "rl", "key": "k"}),
        event(s, "transfer", "train", 0, key="k"),
    ):
        refused(
            asked, "refit_not_ready", "epoch 1", "timed out", "subscriber slot 1",
            "subscriber slot 2", "never joined",
        )  # fmt: skip
    # an operator's restart opens a new epoch
    out = s.at(12).record("refit_restart", None, None, {"refit": "rl", "reason": "gen 1 is up"})
    assert one(out, RefitEpochChanged).cause == "restarted by an operator: gen 1 is up"
    assert epoch_of(s) == 2


@pytest.mark.parametrize(
    ("group", "rank", "slot", "code", "text"),
    [
        ("gen", 1, 4, "invalid_slot", "subscriber slots 0..3"),
        ("gen", 1, -1, "invalid_slot", "subscriber slots 0..3"),
        ("train", 1, 2, "invalid_slot", "publisher slots 0..1"),
        ("gen", 1, 0, "invalid_slot", "held by rank 0 of 'gen'"),
    ],
)
def test_an_invalid_or_taken_slot_is_refused(
    group: str, rank: int, slot: int, code: str, text: str
) -> None:
    s = world()
    join(s, "gen", 0, slot=0)
    refused(join(s, group, rank, slot=slot), code, text)


def test_a_worker_of_another_group_or_outside_its_view_or_a_stale_incarnation_is_refused() -> None:
    s = world()
    s.form("other", world_size=2)
    refused(join(s, "other", 0), "not_refit_member", "'other' is not in refit 'rl'")
    # a rank of gen outside the committed view
    s.propose("deactivate", [3], group="gen")
    s.ack_all("gen")
    refused(join(s, "gen", 3), "not_refit_member", "not active in view")
    # a stale incarnation is fenced like any rank input
    payload = {
        "incarnation": "someone-else",
        "refit": "rl",
        "epoch": epoch_of(s),
        "slot": 0,
        "digest": D1,
    }
    refused(s.record("refit_join", "gen", 0, payload), "stale_incarnation")
    refused(
        s.record(
            "refit_join", "gen", 0, {**payload, "incarnation": s.inc(0, "gen"), "refit": "nope"}
        ),
        "unknown_refit",
    )


# -- epochs move with membership -------------------------------------------------------------------


def test_a_view_of_either_group_moves_the_epoch_and_stale_members_are_told_why() -> None:
    s = world()
    join_all(s)
    s.propose("deactivate", [3], group="gen")
    out = s.ack_all("gen")
    moved = one(out, RefitEpochChanged)
    assert moved.epoch == 2 and moved.status == "waiting"
    assert moved.cause == "view 2 of subscriber group 'gen' committed"
    assert moved.lost is None
    stale = {"incarnation": s.inc(0, "train"), "refit": "rl", "epoch": 1, "key": "k"}
    refused(s.record("transfer", "train", 0, stale), "stale_refit_epoch", "epoch 2", "view 2 of")


def test_a_member_lost_mid_transfer_fails_the_attempt_naming_it_and_the_retry_completes() -> None:
    s = world()
    join_all(s)
    t = start(s)
    assert (t.status, t.attempt) == ("running", 1)
    report(s, "train", 0, t)
    out = kill(s, "gen", 2, at=3)
    failed = [e for e in of(out, TransferChanged) if e.status == "failed"]
    assert len(failed) == 1
    assert "subscriber slot 2 (gen rank 2) went OFFLINE" in failed[0].detail
    epochs = of(out, RefitEpochChanged)
    assert [e.epoch for e in epochs] == [2, 3]  # the loss, then gen's new view
    assert "went OFFLINE" in epochs[0].cause and "view" in epochs[1].cause
    # the member the loss names, as a value for the workers' data plane; its row keeps words
    assert epochs[0].lost == ("subscriber", 2) and epochs[1].lost is None
    assert all("lost" not in row.doc for e in epochs for row in ROWS[RefitEpochChanged](e))
    # a late report of the failed attempt, from the old epoch, is refused saying why
    late = {
        "incarnation": s.inc(0, "gen"),
        "refit": "rl",
        "epoch": 1,
        "transfer": t.transfer,
        "attempt": 1,
        "status": "done",
    }
    refused(s.record("transfer_status", "gen", 0, late), "stale_refit_epoch", "epoch 3")
    # and in the current epoch, nobody is admitted yet
    refused(report(s, "gen", 0, t), "refit_not_ready", "epoch 3 is waiting")
    # the replacement joins, the view grows back, everyone joins the new epoch and retries
    s.at(5).join(2, incarnation="gen-2-b", group="gen")
    s.links(2, group="gen")
    s.propose("activate", [2], group="gen")
    s.ack_all("gen")
    assert epoch_of(s) == 4
    join_all(s)
    retry = start(s)
    assert (retry.transfer, retry.attempt, retry.epoch) == (t.transfer, 2, 4)
    out = report_all(s, retry)
    done = one(out, TransferChanged)
    assert done.status == "completed"


def test_a_completed_transfer_is_final_and_a_key_is_idempotent() -> None:
    s = world()
    join_all(s)
    t = start(s)
    assert (
        s.m.repeat_of(
            "transfer",
            "train",
            1,
            {"incarnation": s.inc(1, "train"), "refit": "rl", "epoch": 1, "key": "step-1"},
        )
        == t.offset
    )
    report(s, "gen", 0, t)
    assert report(s, "gen", 0, t) == []  # the same member again: nothing changes
    out = report_all(s, t)
    assert one(out, TransferChanged).status == "completed"
    before = msgspec.json.encode(s.m.facet("refits").snapshot())
    refused(report(s, "gen", 1, t), "transfer_final", "completed")
    refused(report(s, "gen", 1, t, status="failed", detail="late"), "transfer_final")
    assert msgspec.json.encode(s.m.facet("refits").snapshot()) == before
    # creating it again is answered with the completed transfer, not a new attempt
    assert s.m.repeat_of("transfer", None, None, {"refit": "rl", "key": "step-1"}) == t.offset


def test_a_failed_attempt_is_retried_as_a_new_one_and_old_reports_are_refused() -> None:
    s = world()
    join_all(s)
    t = start(s)
    out = report(s, "gen", 1, t, status="failed", detail="CUDA OOM")
    failed = one(out, TransferChanged)
    assert failed.status == "failed"
    assert failed.detail == "subscriber slot 1 (gen rank 1) reported failure: CUDA OOM"
    refused(report(s, "gen", 0, t), "stale_attempt", "failed")
    retry = start(s)
    assert retry.attempt == 2
    refused(report(s, "gen", 0, t), "stale_attempt", "attempt 2")
    refused(event(s, "transfer", "train", 0, key="step-2"), "transfer_busy", "'step-1' (attempt 2)")


def test_a_transfer_deadline_fails_it_and_moves_the_epoch() -> None:
    s = world(transfer_timeout_s=20.0)
    join_all(s)
    t = start(s)
    report(s, "train", 0, t)
    out = s.at(25).tick()
    failed = one(out, TransferChanged)
    assert failed.status == "failed" and "timed out after 20 s" in failed.detail
    assert "publisher slot 1" in failed.detail and "publisher slot 0" not in failed.detail
    assert one(out, RefitEpochChanged).cause == "transfer 'step-1' attempt 1 timed out"


def test_a_transfer_comes_from_a_publisher_or_the_operator_never_a_subscriber() -> None:
    """docs/refit.md: a transfer comes from a publisher of the admitted epoch or the operator;
    a subscriber waits for it to start."""
    s = world()
    join_all(s)
    r = refused(event(s, "transfer", "gen", 0, key="k"), "not_refit_member", "subscriber slot 0")
    assert "a transfer comes from a publisher of the admitted epoch or the operator" in r.message
    assert s.m.facet("refits").refit("rl").running is None
    assert one(event(s, "transfer", "train", 1, key="k"), TransferChanged).status == "running"
    s2 = world()
    join_all(s2)
    out = s2.record("transfer", None, None, {"refit": "rl", "key": "k"})
    assert one(out, TransferChanged).status == "running"


def test_a_transfer_needs_an_admitted_epoch_and_a_good_key() -> None:
    s = world()
    join(s, "train", 0)
    refused(event(s, "transfer", "train", 0, key="k"), "refit_not_ready", "waiting")
    join_all(s)
    refused(event(s, "transfer", "train", 0, key="has space"), "invalid_event", "key")
    refused(event(s, "transfer", "train", 0, key="k" * 129), "invalid_event", "key")


# -- bootstrap -------------------------------------------------------------------------------------


def test_the_bootstrap_is_refit_rank_0s_once_per_epoch_and_reaches_only_the_members() -> None:
    s = world()
    refused(
        event(s, "refit_bootstrap", "train", 0, bootstrap={"store": "h:1"}),
        "refit_not_ready",
        "waiting",
    )
    join_all(s)
    refused(
        event(s, "refit_bootstrap", "gen", 0, bootstrap={"store": "h:1"}),
        "not_refit_member",
        "only refit rank 0",
    )
    out = event(s, "refit_bootstrap", "train", 0, bootstrap={"store": "h:1", "prefix": "e1"})
    b = one(out, RefitBootstrap)
    assert b.members == (("train", 0), ("train", 1), ("gen", 0), ("gen", 1), ("gen", 2), ("gen", 3))
    refused(
        event(s, "refit_bootstrap", "train", 0, bootstrap={"store": "h:2"}),
        "refit_conflict",
        "already has a bootstrap",
    )
    refused(
        event(s, "refit_bootstrap", "train", 0, bootstrap={"x": "y" * 5000}),
        "invalid_event",
        "bytes",
    )
    status = s.m.facet("refits").status("rl")
    assert status is not None and status["bootstrap_published"] is True
    assert "h:1" not in msgspec.json.encode(status).decode()


BOOT = {"store": "h:1", "prefix": "e1", "backend": "gloo"}


def join_others(s: Script, skip: tuple[str, int]) -> list[Any]:
    out: list[Any] = []
    for group, size in (("train", 2), ("gen", 4)):
        for r in range(size):
            if (group, r) != skip:
                out += join(s, group, r)
    return out


def test_a_bootstrap_offered_with_the_join_is_published_in_the_step_that_admits() -> None:
    s = world()
    assert of(join(s, "train", 0, bootstrap=BOOT), RefitBootstrap) == []  # not before admission
    status = s.m.facet("refits").status("rl")
    assert status is not None and status["bootstrap_published"] is False
    assert "h:1" not in msgspec.json.encode(status).decode()
    out = join_others(s, ("train", 0))
    [b] = of(out, RefitBootstrap)
    admitted = [e for e in of(out, RefitEpochChanged) if e.status == "admitted"]
    assert len(admitted) == 1
    assert out.index(admitted[0]) < out.index(b)  # the members are known when it goes out
    assert b.offset == admitted[0].offset and b.epoch == admitted[0].epoch
    assert b.bootstrap == BOOT
    assert b.members == (("train", 0), ("train", 1), ("gen", 0), ("gen", 1), ("gen", 2), ("gen", 3))
    status = s.m.facet("refits").status("rl")
    assert status is not None and status["bootstrap_published"] is True
    assert "h:1" not in msgspec.json.encode(status).decode()
    # one bootstrap an epoch: publishing another after admission is a conflict
    refused(
        event(s, "refit_bootstrap", "train", 0, bootstrap={"store": "h:2"}),
        "refit_conflict",
        "already has a bootstrap",
    )


def test_the_offer_is_published_when_publisher_slot_0_joins_last_too() -> None:
    s = world()
    join_others(s, ("train", 0))
    out = join(s, "train", 0, bootstrap=BOOT)
    assert one(out, RefitEpochChanged).status == "admitted"
    assert one(out, RefitBootstrap).bootstrap == BOOT


def test_an_epoch_that_moves_before_admission_drops_the_offer() -> None:
    s = world()
    join(s, "train", 0, bootstrap=BOOT)
    s.record("refit_restart", None, None, {"refit": "rl", "reason": "test"})
    out = join_all(s)
    assert one(out, RefitEpochChanged).status == "admitted"
    assert of(out, RefitBootstrap) == []  # the old epoch's offer names an old world
    status = s.m.facet("refits").status("rl")
    assert status is not None and status["bootstrap_published"] is False


def test_only_publisher_slot_0_offers_a_bootstrap_and_only_a_small_object() -> None:
    s = world()
    for group, rank in (("train", 1), ("gen", 0)):
        refused(
            join(s, group, rank, bootstrap=BOOT),
            "not_refit_member",
            "only refit rank 0 (publisher slot 0) offers the bootstrap",
        )
    refused(join(s, "train", 0, bootstrap={"x": "y" * 5000}), "invalid_event", "bytes")
    refused(join(s, "train", 0, bootstrap="h:1"), "invalid_event", "must be an object")
    assert s.m.facet("refits").status("rl")["joined"] == []  # type: ignore[index]


def test_a_join_repeats_only_with_the_same_offer() -> None:
    s = world()
    join(s, "train", 0, bootstrap=BOOT)
    payload = {
        "incarnation": s.inc(0, "train"),
        "refit": "rl",
        "epoch": epoch_of(s),
        "slot": 0,
        "digest": D1,
        "bootstrap": BOOT,
    }
    assert s.m.repeat_of("refit_join", "train", 0, payload) is not None
    other = {**payload, "bootstrap": {**BOOT, "prefix": "e2"}}
    assert s.m.repeat_of("refit_join", "train", 0, other) is None
    join(s, "train", 0, bootstrap=other["bootstrap"])  # the newer offer replaces the older
    assert one(join_others(s, ("train", 0)), RefitBootstrap).bootstrap["prefix"] == "e2"


def replayed_through_a_snapshot(records: list, cut: int) -> tuple[Coordinator, Coordinator, list]:
    """A fold of every record; a fold restored from the snapshot (through JSON) of the first
    ``cut`` records, then fed the rest; and the effects of that rest."""
    whole = Coordinator()
    for rec in records:
        whole.step(rec)
    part = Coordinator()
    for rec in records[:cut]:
        part.step(rec)
    resumed = Coordinator.from_snapshot(msgspec.json.decode(msgspec.json.encode(part.snapshot())))
    effects = [e for rec in records[cut:] for e in resumed.step(rec)]
    return whole, resumed, effects


def test_an_offer_survives_a_snapshot() -> None:
    s = world()
    join(s, "train", 0, bootstrap=BOOT)
    join(s, "train", 1)
    cut = len(s.records)
    for r in range(4):
        join(s, "gen", r)
    whole, resumed, effects = replayed_through_a_snapshot(s.records, cut)
    assert one(effects, RefitBootstrap).bootstrap == BOOT
    assert msgspec.json.encode(resumed.snapshot()) == msgspec.json.encode(whole.snapshot())


def test_snapshot_and_tail_give_the_full_replay() -> None:
    s = world()
    join_all(s)
    t = start(s)
    report(s, "gen", 0, t)
    cut = len(s.records)
    kill(s, "gen", 1, at=4)
    whole, resumed, _ = replayed_through_a_snapshot(s.records, cut)
    assert msgspec.json.encode(resumed.snapshot()) == msgspec.json.encode(whole.snapshot())


def test_the_member_whose_loss_began_an_epoch_survives_a_snapshot() -> None:
    """A coordinator restarted from a snapshot sends the same ``lost`` with the epoch a
    resync carries: the member is part of the refit's state, not only of one effect."""
    s = world()
    join_all(s)
    out = s.at(3).death(2, "gen")
    assert one(out, RefitEpochChanged).lost == ("subscriber", 2)
    data = msgspec.json.decode(msgspec.json.encode(s.m.snapshot()))
    (refit,) = data["facets"]["refits"]["refits"]
    assert refit["lost"] == ["subscriber", 2]
    resumed = Coordinator.from_snapshot(data)
    assert msgspec.json.encode(resumed.snapshot()) == msgspec.json.encode(s.m.snapshot())
