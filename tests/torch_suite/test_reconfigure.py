"""torch's reconfigure contract (torch >= 2.14), case by case, on the ``"foldplane"`` backend and,
as the reference, on torch's own ``gloo``, both with ``enable_reconfigure=True``; and what the
log shows of it (docs/reconfigure.md).

Each case runs in 3 real rank processes on the CPU (forked from a server process that imported
torch once). On foldplane, a real coordinator (``python -m coordinator serve`` on a SQLite file)
serves the run; each case has a group of its own, and each rank process calls nothing but
``dist.init_process_group("foldplane", enable_reconfigure=True)`` with the ``FOLDPLANE_*``
environment. The cases are written from the list of torch's own fault-tolerance test
(``test/distributed/test_c10d_fault_tolerance.py``): basic, all_reduce, ring send/recv, shrink
excluding the last rank, excluding the middle rank, scale 3->1->3->1, singletons to all, the same
members with a new uuid, a late join, a merge of {0} and {1, 2}, reconfigure after abort.

torch's cases are in the slow suite (22 runs of 3 processes); the default suite keeps the
shrink that drops the middle rank, checked in the log, and the bad calls.
"""

from __future__ import annotations

import json
import multiprocessing
import queue
import time
import uuid
import warnings
from collections.abc import Iterator

import httpx
import pytest
import torch
import torch.distributed as dist

from tests.torch_suite import reconfigure_cases as cases

if not hasattr(torch.distributed.distributed_c10d, "ReconfigureOptions"):
    pytest.skip(
        f"torch {torch.__version__} has no reconfigure API (torch >= 2.14 has it)",
        allow_module_level=True,
    )

from tests.service.conftest import Server, make_server, replay  # noqa: E402

pytestmark = pytest.mark.timeout(600)

#: A case's group: deadlines a loaded machine does not trip, formation quick.
GROUP = {
    "heartbeat_timeout_s": 10.0,
    "ack_timeout_s": 20.0,
    "admission_timeout_s": 30.0,
    "formation_timeout_s": 60.0,
    "reconcile_window_s": 0.1,
}
#: The longest a case may take, all of its rank processes together.
CASE_S = 180.0
#: Once a rank has failed, how long the others get to finish: a case's ranks wait for each
#: other in the case's store, so a failed rank can leave the others waiting on it for good.
AFTER_FAILURE_S = 20.0
#: torch's gloo (2.14.1; a recorded 2.15.0 run too) sometimes failed one member's reconfigure
#: from singletons to all three (scale 3->1->3) while the other members' succeeded: a split
#: outcome, the failed member raising this and the others going on in a configuration it is
#: not in. Measured here with a FileStore as the bootstrap store: 4 of 100 runs of the case
#: alone (with a TCPStore, which the cases now use, none of 120); it is torch's (no foldplane
#: code is in the gloo reference).
GLOO_SPLIT_OUTCOME = ("Gloo connectFullMesh failed", "Connection closed by peer")


class SplitOutcome(AssertionError):
    """torch's gloo split outcome (:data:`GLOO_SPLIT_OUTCOME`): every rank that failed failed
    with it, and some rank did not fail."""


@pytest.fixture(scope="module")
def ctx() -> Iterator[multiprocessing.context.BaseContext]:
    """Rank processes forked from a server process that imported torch and foldplane once."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "foldplane.agent.dataplane", cases.__name__])
    yield context


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory) -> Iterator[Server]:
    srv = make_server(tmp_path_factory.mktemp("reconfigure"), store=True)
    try:
        srv.start(wait=False).wait_ready(timeout=180.0)  # it imports torch for the store
        yield srv
    finally:
        srv.stop()


def run(
    ctx: multiprocessing.context.BaseContext,
    backend: str,
    case: str,
    coordinator: Server | None = None,
) -> str | None:
    """Run ``case`` on ``backend`` in 3 rank processes; the foldplane group's name. Every rank
    must come back without an error."""
    group = None
    env: dict[str, str] = {}
    if backend == "foldplane":
        assert coordinator is not None
        group = f"{case.replace('_', '-')}-{uuid.uuid4().hex[:6]}"
        r = httpx.post(
            coordinator.url + "/groups",
            json={"group": group, "world_size": cases.WORLD, **GROUP},
            timeout=30,
        )
        assert r.status_code == 201, r.text
        env = {"FOLDPLANE_COORDINATOR": coordinator.url, "FOLDPLANE_GROUP": group}
    # The case's store, served by this process for the case alone (torch's bootstrap store: its
    # reconfigure rendezvouses there too). Not a FileStore: with one, torch 2.14.1's gloo met the
    # split outcome (GLOO_SPLIT_OUTCOME) in 4 of 100 runs of scale_down_up alone, with a
    # TCPStore in none of 120.
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=cases.STORE
    )
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=cases.run_rank,
            args=(backend, case, rank, {**env, "FOLDPLANE_RANK": str(rank)}, store.port, results),
            name=f"{backend}-{case}-{rank}",
        )
        for rank in range(cases.WORLD)
    ]
    for p in procs:
        p.start()
    outcomes: dict[int, str | None] = {}
    deadline = time.monotonic() + CASE_S
    try:
        while len(outcomes) < cases.WORLD:
            try:
                rank, outcome = results.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                left = sorted(set(range(cases.WORLD)) - set(outcomes))
                if any(outcomes.values()):
                    break  # a rank failed: the assertion below names it
                pytest.fail(
                    f"{case} on {backend}: ranks {left} did not finish within {CASE_S} s "
                    f"(finished: {outcomes})"
                )
            outcomes[rank] = outcome
            if outcome:
                deadline = min(deadline, time.monotonic() + AFTER_FAILURE_S)
    finally:
        grace = 30.0 if len(outcomes) == cases.WORLD else 1.0  # the rest wait on a failed rank
        for p in procs:
            p.join(timeout=grace)
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
    failed = {rank: text for rank, text in sorted(outcomes.items()) if text}
    report = [f"-- rank {rank} --\n{text}" for rank, text in failed.items()]
    unfinished = sorted(set(range(cases.WORLD)) - set(outcomes))
    if unfinished:
        report.append(f"-- ranks {unfinished}: no outcome {AFTER_FAILURE_S} s after it --")
    split = all(all(words in text for words in GLOO_SPLIT_OUTCOME) for text in failed.values())
    if failed and split and backend == "gloo" and len(failed) < cases.WORLD:
        raise SplitOutcome(f"{case} on {backend}:\n" + "\n".join(report))
    assert not failed, f"{case} on {backend}:\n" + "\n".join(report)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return group


@pytest.mark.slow
@pytest.mark.parametrize("case", list(cases.TORCH_CASES))
def test_torch_case_on_gloo(ctx, case):
    """The reference: torch's own gloo, ``enable_reconfigure=True``. A split outcome of torch's
    gloo (:data:`GLOO_SPLIT_OUTCOME`) is reported as a warning and the case runs once more, in
    a new store: it must pass then. Any other failure fails at once."""
    try:
        run(ctx, "gloo", case)
    except SplitOutcome as first:
        warnings.warn(
            f"{case} on torch's gloo: a member's reconfigure failed while the others' "
            f"succeeded (torch's split outcome); ran it again. {str(first)[-600:]}",
            stacklevel=1,
        )
        run(ctx, "gloo", case)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(cases.TORCH_CASES))
def test_torch_case_on_foldplane(ctx, coordinator, case):
    run(ctx, "foldplane", case, coordinator)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["gloo", "foldplane"])
def test_a_reused_uuid(ctx, coordinator, backend):
    """(``reconfigure_cases.reused_uuid``) a uuid the process used is refused by both; one
    another process of the group used is refused by foldplane on every member alike, naming
    the view that used it."""
    if backend == "gloo" and not torch.__version__.startswith("2.14."):
        pytest.skip(
            f"what gloo does with a reused uuid is recorded for 2.14, not {torch.__version__}"
        )
    run(ctx, backend, "reused_uuid", coordinator)


def test_bad_handles_raise_at_the_call_and_a_stale_one_is_refused(ctx, coordinator):
    group = run(ctx, "foldplane", "bad_calls", coordinator)
    # nothing the calls refused at the call reached the log; the stale handles were logged
    # and rejected (audits see them); the log replays exactly
    events = httpx.get(
        coordinator.url + "/events",
        params={"group": group, "kind": "proposal", "limit": 1000},
        timeout=30,
    ).json()["events"]
    uuids = sorted({e["payload"]["uuid"] for e in events})
    assert uuids == [1300, 1302, 1303, 1304, 1310], uuids
    done = replay(coordinator.db, "--group", group)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_the_default_group_keeps_foldplanes_model(ctx, coordinator):
    run(ctx, "foldplane", "foldplane_model", coordinator)


def test_the_log_shows_who_reconfigured_and_replay_reproduces_the_views(ctx, coordinator):
    """After the shrink that drops the middle rank: every view is in the log with its cause,
    ``replay`` derives exactly the stored views, a member's story names each member's call,
    and the story of the rank left out names the reconfigure that left it out."""
    group = run(ctx, "foldplane", "shrink_middle", coordinator)
    done = replay(coordinator.db, "--json", "--group", group)
    assert done.returncode == 0, done.stdout + done.stderr
    views = json.loads(done.stdout)["views"]
    assert [
        (v["version"], v["active_ranks"], v["cause"]["kind"], v["cause"].get("uuid")) for v in views
    ] == [
        (1, [0, 1, 2], "formation", None),
        (2, [0, 1, 2], "reconfigure", 500),
        (3, [0, 2], "reconfigure", 501),
    ]
    assert views[2]["cause"]["order"] == [0, 2]
    member = httpx.get(f"{coordinator.url}/groups/{group}/ranks/2/story", timeout=30).json()
    calls = [e for e in member["entries"] if e.get("uuid") == 501]
    assert [e["event"] for e in calls] == ["proposal", "proposal", "proposal_resolved"]
    assert sorted(calls[1]["callers"]) == [0, 2] and calls[-1]["status"] == "applied"
    story = httpx.get(f"{coordinator.url}/groups/{group}/ranks/1/story", timeout=30).json()
    left_out = [e for e in story["entries"] if e["event"] == "view_committed"][-1]
    assert left_out["version"] == 3 and left_out["active"] is False
    assert left_out["cause"] == "reconfigure" and "reconfigure uuid 501" in left_out["reason"]
