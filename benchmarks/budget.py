"""Latency budget: where the milliseconds of one view change and one recovery go, phase by phase.

Two scenarios on a real coordinator (``python -m coordinator serve``, SQLite on disk) and 4 real
gloo workers started by the launcher, each running all_reduce in a loop:

- **view change**: ``POST /proposals`` deactivates rank 3, then activates it again (each trial
  really changes the view), after one such change that warms up;
- **recovery**: rank 1, 2 or 3 of a fresh group of 4 is SIGKILLed; the launcher reports the
  death.

Each phase is the time from the previous mark to the next, the median over the trials. The
marks come from three clocks on one machine, all wall clock: the benchmark's own (the moment it
sent the proposal or the kill), the log's (``ts`` of the trigger record and of every ``ack`` for
the new version, ``ts`` of the committed view, from ``GET /events`` and ``GET /views/history``),
and the workers' (each prints when its agent installed the new view and when its first
all_reduce on that view succeeded). Between the trigger record and the first ACK lie the fold,
the prepare pushed on the channel, the agent's ACK and its durable append: the log cannot split
them further. The view's ``ts`` is that of the ACK record that completed the barrier, so the
last ACK appended is the commit.

Beside them, in the same run: the floors every phase stands on, one durable SQLite append
(``fsync floor``: ``Log.append`` of one record, fsync included), one loopback round trip on
the agent channel (``channel round trip``: an empty event batch sent on a ``HostChannel`` and
answered by the coordinator), and the time the kernel takes to reap a SIGKILLed process that
imported torch (``SIGKILL floor``: ``kill`` to ``waitpid`` of an idle one). A dead process's
memory is torn down before its parent's ``waitpid`` returns and before its sockets close, so
no death report, and no peer's broken link, comes earlier than that: the first phase of a
recovery cannot be shorter.

The workers are this module, run as ``python benchmarks/budget.py worker``.
"""

from __future__ import annotations

import asyncio
import functools
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .harness import Result, median, percentile
from .kit.floors import fsync_floor
from .kit.kills import time_recovery
from .kit.service import Service
from .kit.workers import Lines, all_reduce_loop, emit, say, start_agent

WORLD = 4
STEP_PAUSE_S = 0.005

#: The phases of a view change, each named by the mark it ends at (the first mark starts them).
VIEW_CHANGE_MARKS = (
    "proposal sent",
    "proposal appended",
    "first ACK appended",
    "last ACK appended",
    "new view held by every agent",
    "first all_reduce on it, every rank",
)
RECOVERY_MARKS = (
    "SIGKILL sent",
    "death_reported appended",
    *VIEW_CHANGE_MARKS[2:],
)


# -- the pure part ---------------------------------------------------------------------------------


def phases(marks: Mapping[str, float], order: Sequence[str]) -> list[tuple[str, float]]:
    """The phases of one trial: ``(\"A -> B\", milliseconds)`` between consecutive marks of
    ``order`` (seconds, one clock), then ``(\"total\", ms)`` from the first mark to the last.

    A missing mark is a ``KeyError`` naming it; a mark earlier than the one before it is kept
    (a negative phase says two clocks disagree, and is shown, not hidden)."""
    missing = [m for m in order if m not in marks]
    if missing:
        raise KeyError(f"trial lacks the mark(s) {missing}; it has {sorted(marks)}")
    out = [
        (f"{a} -> {b}", (marks[b] - marks[a]) * 1000)
        for a, b in zip(order, order[1:], strict=False)
    ]
    out.append(("total", (marks[order[-1]] - marks[order[0]]) * 1000))
    return out


def budget(
    trials: Sequence[Mapping[str, float]], order: Sequence[str]
) -> list[tuple[str, float, float]]:
    """Per phase: ``(name, median ms, p99 ms)`` over ``trials`` (each a trial's marks)."""
    if not trials:
        raise ValueError("a budget needs at least one trial")
    per = [phases(t, order) for t in trials]
    return [
        (name, median([p[i][1] for p in per]), percentile([p[i][1] for p in per], 99))
        for i, (name, _) in enumerate(per[0])
    ]


def log_marks(
    events: Sequence[Mapping[str, Any]], views: Sequence[Mapping[str, Any]], trigger_offset: int
) -> tuple[int, dict[str, float]]:
    """The log's marks for the view change a trigger record started: the first view committed
    after it (its version), and the ``ts`` (seconds) of the trigger, of the first and last
    ``ack`` for that version, and of the committed view."""
    trigger = next((e for e in events if e["offset"] == trigger_offset), None)
    if trigger is None:
        raise KeyError(f"no record at offset {trigger_offset} among the events read")
    view = next((v for v in views if v["offset"] > trigger_offset), None)
    if view is None:
        raise KeyError(f"no view committed after offset {trigger_offset}")
    version = view["version"]
    acks = [
        e["ts"]
        for e in events
        if e["kind"] == "ack"
        and e["offset"] > trigger_offset
        and e["offset"] <= view["offset"]
        and e["payload"].get("version") == version
    ]
    if not acks:
        raise KeyError(
            f"no ack for version {version} between offsets {trigger_offset} and {view['offset']}"
        )
    return version, {
        "trigger": trigger["ts"] / 1e9,
        "first ACK appended": min(acks) / 1e9,
        "last ACK appended": max(acks) / 1e9,
        "view committed": view["ts"] / 1e9,
    }


# -- the coordinator and the workers ---------------------------------------------------------------


_log = say("budget")


def _ran_on(lines: Lines, ranks: set[int], version: int) -> Callable[[], bool]:
    return lambda: ranks <= {s["rank"] for s in lines.seen if s.get("ran") == version}


def _worker_marks(
    seen: Sequence[Mapping[str, Any]], ranks: set[int], version: int
) -> dict[str, float]:
    held = [s["t"] for s in seen if s.get("held") == version and s["rank"] in ranks]
    ran = {s["rank"]: s["t"] for s in seen if s.get("ran") == version and s["rank"] in ranks}
    return {
        "new view held by every agent": max(held),
        "first all_reduce on it, every rank": max(ran.values()),
    }


def _events(service: Service, group: str) -> list[dict[str, Any]]:
    """Every record of ``group``, from ``GET /events``."""
    out: list[dict[str, Any]] = []
    after = 0
    while True:
        page = service.client.request(
            "GET", "/events", params={"after": after, "limit": 1000, "group": group}
        )
        out.extend(page["events"])
        if not page["events"] or page.get("next_after") in (None, after):
            return out
        after = page["next_after"]


def _views(service: Service, group: str) -> list[dict[str, Any]]:
    return service.client.request("GET", "/views/history", params={"group": group, "limit": 1000})[
        "views"
    ]


def _launch(service: Service, group: str, lines: Lines) -> Any:
    """A group of ``WORLD`` workers, once every one ran an all_reduce on view 1."""
    service.create_group(group, WORLD)
    launcher = service.launch([sys.executable, "-m", __name__, "worker"], group, range(WORLD),
                              lines.follow)  # fmt: skip
    lines.wait_for(_ran_on(lines, set(range(WORLD)), 1), 300, f"formation of {group}")
    return launcher


def _view_changes(service: Service, trials: int) -> list[dict[str, float]]:
    group = "budget-vc"
    lines = Lines()
    launcher = _launch(service, group, lines)
    out = []
    try:
        for i in range(trials + 1):  # the first warms up (the survivors' first new group)
            op = "deactivate" if i % 2 == 0 else "activate"
            sent = time.time()
            answer = service.client.request(
                "POST", "/proposals", params={"wait": 30},
                json={"group": group, "op": op, "ranks": [WORLD - 1]}, timeout_s=60,
            )  # fmt: skip
            if answer["status"] != "applied":
                raise RuntimeError(f"{op} [{WORLD - 1}]: {answer}")
            version = answer["version"]
            active = set(range(WORLD - 1)) if op == "deactivate" else set(range(WORLD))
            lines.wait_for(_ran_on(lines, active, version), 60, f"{op} to version {version}")
            _, marks = log_marks(_events(service, group), _views(service, group), answer["id"])
            marks["proposal sent"] = sent
            marks["proposal appended"] = marks.pop("trigger")
            marks.update(_worker_marks(lines.seen, active, version))
            if i > 0:
                out.append(marks)
            _log(
                f"view change {i}/{trials} ({op}): {phases(marks, VIEW_CHANGE_MARKS)[-1][1]:.1f} ms"
            )
    finally:
        launcher.stop(grace_s=5)
    return out


def _recoveries(service: Service, trials: int) -> list[dict[str, float]]:
    out = []
    for k in range(trials):
        group = f"budget-kill{k}"
        victim = 1 + k % (WORLD - 1)
        lines = Lines()
        launcher = _launch(service, group, lines)
        try:
            before = max(e["offset"] for e in _events(service, group))
            survivors = set(range(WORLD)) - {victim}
            killed = time_recovery(
                lines, functools.partial(launcher.kill, victim), survivors,
                lambda line, _: line["rank"] if line.get("ran", 1) > 1 else None, 60,
                f"recovery from the kill of rank {victim}",
            ).killed_at  # fmt: skip
            events = _events(service, group)
            death = next(
                e for e in events if e["kind"] == "death_reported" and e["offset"] > before
            )
            version, marks = log_marks(events, _views(service, group), death["offset"])
            marks["SIGKILL sent"] = killed
            marks["death_reported appended"] = marks.pop("trigger")
            marks.update(_worker_marks(lines.seen, survivors, version))
            out.append(marks)
            _log(
                f"kill {k + 1}/{trials} (rank {victim}): {phases(marks, RECOVERY_MARKS)[-1][1]:.1f} ms"
            )
        finally:
            launcher.stop(grace_s=5)
    return out


def _worker() -> int:
    """all_reduce in a loop; a line when the agent holds a new view, one at its first success."""
    agent = start_agent(timeout_s=10.0)
    rank = agent.rank

    def watch() -> None:
        version = 0
        while True:
            view = agent.wait_for_view(version + 1)
            emit(rank=rank, held=view.version, t=time.time())
            version = view.version

    threading.Thread(target=watch, daemon=True).start()
    all_reduce_loop(
        agent, lambda version: emit(rank=rank, ran=version, t=time.time()), STEP_PAUSE_S
    )
    return 0


# -- the floors ------------------------------------------------------------------------------------


_IDLE_TORCH = "import sys, torch; sys.stdout.write('up\\n'); sys.stdout.flush(); sys.stdin.read()"


def _reap_floor(n: int) -> list[float]:
    """Milliseconds from SIGKILL to ``waitpid`` returning, for ``n`` idle processes that
    imported torch: the kernel tears the dead process's memory down before anyone, its parent
    or its peers' sockets, can see it die."""
    times = []
    for _ in range(n):
        child = subprocess.Popen(
            [sys.executable, "-c", _IDLE_TORCH], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        try:
            assert child.stdout is not None
            if child.stdout.readline() != b"up\n":
                raise RuntimeError("the idle torch process did not start")
            t0 = time.perf_counter()
            child.kill()
            child.wait()
            times.append((time.perf_counter() - t0) * 1000)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
    return times


async def _channel_round_trip(port: int, n: int) -> list[float]:
    from ..agent.channel import ChannelLink

    channel = await ChannelLink([("127.0.0.1", port)]).open()
    try:
        times = []
        for i in range(n + 2):
            t0 = time.perf_counter()
            await channel.call([], timeout=10)
            if i >= 2:
                times.append((time.perf_counter() - t0) * 1000)
        return times
    finally:
        channel.close()


# -- the benchmark ---------------------------------------------------------------------------------


def _rows(scenario: str, trials: list[dict[str, float]], order: Sequence[str]) -> list[Result]:
    per = [dict(phases(t, order)) for t in trials]
    return [
        Result(
            "budget",
            f"{scenario}: {name}",
            "ms",
            med,
            p99=p99,
            extra={"trials": len(trials), "samples_ms": [round(p[name], 2) for p in per]},
        )
        for name, med, p99 in budget(trials, order)
    ]


def run(quick: bool) -> list[Result]:
    changes, kills, floor_n, reap_n = (3, 2, 20, 3) if quick else (5, 5, 50, 10)
    with Service(store=True, name="budget").start() as service:
        try:
            vc = _view_changes(service, changes)
            rec = _recoveries(service, kills)
            rtt = asyncio.run(_channel_round_trip(service.port, floor_n))
            fsync = asyncio.run(fsync_floor(str(service.dir / "floor.db"), floor_n))
            reap = _reap_floor(reap_n)
        except Exception:
            _log(service.tails())
            raise
    return [
        *_rows("view change, 4 ranks", vc, VIEW_CHANGE_MARKS),
        *_rows("SIGKILL 1 of 4", rec, RECOVERY_MARKS),
        Result("budget", "fsync floor (one durable SQLite append)", "ms", median(fsync),
               p99=percentile(fsync, 99), extra={"appends": len(fsync)}),
        Result("budget", "channel round trip (empty batch, loopback)", "ms", median(rtt),
               p99=percentile(rtt, 99), extra={"round_trips": len(rtt)}),
        Result("budget", "SIGKILL floor (kill -> reaped, an idle process that imported torch)",
               "ms", median(reap), p99=percentile(reap, 99), extra={"kills": len(reap)}),
    ]  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1:] == ["worker"]:
        raise SystemExit(_worker())
    raise SystemExit(f"usage: python {__file__} worker (got {sys.argv[1:]})")
