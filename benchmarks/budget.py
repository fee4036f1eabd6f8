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
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks._cluster import free_port, fsync_floor
from benchmarks.harness import Result, median, percentile

ROOT = Path(__file__).resolve().parents[1]
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


def _log(text: str) -> None:
    print(f"# budget: {text}", file=sys.stderr, flush=True)


class _Lines:
    """JSON lines from the workers' stdout, merged into one queue and kept."""

    def __init__(self) -> None:
        self.queue: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []

    def follow(self, process: subprocess.Popen[bytes]) -> None:
        def read() -> None:
            assert process.stdout is not None
            for raw in process.stdout:
                line = raw.decode(errors="replace").strip()
                if line.startswith("{"):
                    try:
                        self.queue.put(json.loads(line))
                    except ValueError:
                        continue

        threading.Thread(target=read, daemon=True).start()

    def until(self, done: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not done(self.seen):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{what}: not within {timeout:.0f} s")
            try:
                self.seen.append(self.queue.get(timeout=left))
            except queue.Empty:
                continue


def _ran_on(ranks: set[int], version: int) -> Any:
    return lambda seen: ranks <= {s["rank"] for s in seen if s.get("ran") == version}


def _worker_marks(
    seen: Sequence[Mapping[str, Any]], ranks: set[int], version: int
) -> dict[str, float]:
    held = [s["t"] for s in seen if s.get("held") == version and s["rank"] in ranks]
    ran = {s["rank"]: s["t"] for s in seen if s.get("ran") == version and s["rank"] in ranks}
    return {
        "new view held by every agent": max(held),
        "first all_reduce on it, every rank": max(ran.values()),
    }


class _Service:
    def __init__(self) -> None:
        self.tmp = tempfile.TemporaryDirectory(prefix="foldplane-bench-budget-")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workers_log = open(f"{self.tmp.name}/workers.log", "wb")  # noqa: SIM115
        self.server = subprocess.Popen(
            [sys.executable, "-m", "coordinator", "serve", "--db", f"{self.tmp.name}/log.db",
             "--port", str(self.port), "--store-port", "0", "--log-level", "warning"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "FOLDPLANE_TOKEN": "", "FOLDPLANE_SECRET": ""},
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while True:
            try:
                self.get("/healthz")
                break
            except OSError:
                if self.server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the coordinator did not start") from None
                time.sleep(0.1)

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=10) as r:
            return json.loads(r.read())

    def post(self, path: str, body: Mapping[str, Any]) -> Any:
        req = urllib.request.Request(
            self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())

    def events(self, group: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        after = 0
        while True:
            page = self.get(f"/events?after={after}&limit=1000&group={group}")
            out.extend(page["events"])
            if not page["events"] or page.get("next_after") in (None, after):
                return out
            after = page["next_after"]

    def views(self, group: str) -> list[dict[str, Any]]:
        return self.get(f"/views/history?group={group}&limit=1000")["views"]

    def launch(self, group: str, lines: _Lines) -> Any:
        from agent.launch import Launcher

        self.post("/groups", {"group": group, "world_size": WORLD, "formation_timeout_s": 300.0})
        launcher = Launcher(
            [sys.executable, __file__, "worker"],
            coordinator=self.url,
            group=group,
            ranks=range(WORLD),
            stdout=subprocess.PIPE,
            stderr=self.workers_log,
            env={**os.environ, "FOLDPLANE_TOKEN": ""},
        )
        launcher.on_spawn = lambda worker: lines.follow(worker.process)
        launcher.start()
        lines.until(_ran_on(set(range(WORLD)), 1), 300, f"formation of {group}")
        return launcher

    def close(self) -> None:
        self.server.terminate()
        self.server.wait(30)
        self.workers_log.close()
        self.tmp.cleanup()


def _view_changes(service: _Service, trials: int) -> list[dict[str, float]]:
    group = "budget-vc"
    lines = _Lines()
    launcher = service.launch(group, lines)
    out = []
    try:
        for i in range(trials + 1):  # the first warms up (the survivors' first new group)
            op = "deactivate" if i % 2 == 0 else "activate"
            sent = time.time()
            answer = service.post(
                "/proposals?wait=30", {"group": group, "op": op, "ranks": [WORLD - 1]}
            )
            if answer["status"] != "applied":
                raise RuntimeError(f"{op} [{WORLD - 1}]: {answer}")
            version = answer["version"]
            active = set(range(WORLD - 1)) if op == "deactivate" else set(range(WORLD))
            lines.until(_ran_on(active, version), 60, f"{op} to version {version}")
            _, marks = log_marks(service.events(group), service.views(group), answer["id"])
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


def _recoveries(service: _Service, trials: int) -> list[dict[str, float]]:
    out = []
    for k in range(trials):
        group = f"budget-kill{k}"
        victim = 1 + k % (WORLD - 1)
        lines = _Lines()
        launcher = service.launch(group, lines)
        try:
            before = max(e["offset"] for e in service.events(group))
            killed = time.time()
            launcher.kill(victim)
            survivors = set(range(WORLD)) - {victim}
            lines.until(
                lambda seen, s=survivors: s <= {x["rank"] for x in seen if x.get("ran", 1) > 1},
                60,
                f"recovery from the kill of rank {victim}",
            )
            events = service.events(group)
            death = next(
                e for e in events if e["kind"] == "death_reported" and e["offset"] > before
            )
            version, marks = log_marks(events, service.views(group), death["offset"])
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
    import torch

    from agent import Agent

    agent = Agent(heartbeat_interval_s=0.5, collective_timeout_s=10.0, p2p_timeout_s=10.0).start()
    agent.wait_for_view(timeout=300)
    rank = agent.rank

    def emit(**fields: Any) -> None:
        print(json.dumps({"rank": rank, **fields}), flush=True)

    def watch() -> None:
        version = 0
        while True:
            view = agent.wait_for_view(version + 1)
            emit(held=view.version, t=time.time())
            version = view.version

    threading.Thread(target=watch, daemon=True).start()
    pg = agent.process_group()
    t = torch.ones(1024)
    pause = threading.Event()
    reported = 0
    while True:
        t.fill_(1.0)
        version, active = pg.version, rank in pg.active_ranks
        ok = pg.all_reduce(t, async_op=True).wait()
        if ok and version != reported and active:
            reported = version
            emit(ran=version, t=time.time())
        if not ok:
            agent.wait_for_view(version + 1, timeout=120)
        pause.wait(STEP_PAUSE_S)


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
    from agent.channel import ChannelLink

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
    service = _Service()
    try:
        vc = _view_changes(service, changes)
        rec = _recoveries(service, kills)
        rtt = asyncio.run(_channel_round_trip(service.port, floor_n))
        fsync = asyncio.run(fsync_floor(f"{service.tmp.name}/floor.db", floor_n))
        reap = _reap_floor(reap_n)
    except Exception:
        tail = Path(service.workers_log.name).read_bytes()[-3000:].decode(errors="replace")
        _log(f"workers.log ends with:\n{tail}")
        raise
    finally:
        service.close()
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
