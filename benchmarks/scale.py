"""One group at the sizes the product claims: 1,024, 4,096 and 16,384 ranks (``--quick``: 1,024
and 4,096), and 256 ranks for the view change rows alone, through the real HTTP server and the
simulated agent hosts of ``agent.simhost``.

The coordinator is a real ``python -m coordinator serve`` process on a SQLite file; the ranks
are real ``AgentMachine``s, 8 to a simulated host (a GPU node), speaking the wire exactly as
real agents behind the launcher's per-host relay do: one host channel per host (a WebSocket,
``GET /agents/channel``), carrying one batch of events per lane at a time and the updates the
coordinator pushes. Simulator and coordinator share the machine's cores. The simulator's
long-lived objects (the N agent machines) are frozen out of its garbage collector once the
group has formed, as the coordinator freezes its own at start: in a real job each agent is a
process of its own, and its collector never walks the other agents.

Rows, for each size N:

- ``formation N ranks`` (s): the cluster starts → every rank holds view 1.
- ``view change N ranks`` (s): a rank is killed and its death reported → every survivor holds
  the next view (median of the trials; at 256 ranks 10 trials). ``extra.coordinator_cpu_s``
  is the coordinator process's CPU time over the same span: the rest of the wall time is the
  simulated agents' own work (N real agent machines in this one process) and waiting for the
  cores. Each simulated data plane reports a committed view built at once.
- ``view change N ranks, view built 1 s later`` (s): the same, with each data plane reporting
  the view built a second after it came, as a real one does once it has connected the members
  (so nothing but heartbeats reaches the coordinator while the commit goes out; agents beat
  once a second, the coordinator shares their records over the default 0.5 s).
- ``coordinator cpu per heartbeat N ranks`` (µs): the coordinator process's CPU time over a
  window of 20 s with nothing but heartbeats, divided by the heartbeats it wrote
  (``heartbeats_total``).
- ``bytes to agents per view change N ranks``: what the coordinator sent the hosts during one
  view change, the updates pushed and the answers to events (frame headers included; the
  answers to heartbeats excluded); ``extra.per_rank`` is that divided by N. The target is at
  most 200 × N.
- ``log bytes per rank-hour N ranks``: the growth of the log's records on disk (the ``log``
  table and its indexes, bytes used in their pages after a WAL checkpoint) over at least 10^6
  heartbeats, per heartbeat, times 3,600 (1 s heartbeats). To
  reach 10^6 heartbeats in a short run the clock is compressed to about 20,000 beats a second:
  agents beat every N / 20,000 s (at most 1 s) and the coordinator shares records over half
  that, the same 2 beats per rank per record as the defaults (1 s beats, 0.5 s flush), so the
  record structure, and the bytes per heartbeat, are those of the defaults.
- ``disk bytes per rank-hour N ranks``: what the coordinator wrote to disk over the same
  heartbeats, per heartbeat, times 3,600: the ``write_bytes`` of its ``/proc/PID/io`` (the
  file pages it dirtied: the WAL's pages at each commit, the checkpoints' copies into the
  database file, the snapshots, the projections; sockets are not in it), plus what the final
  checkpoint of the measurement copies (this process's own ``write_bytes`` across it).
  ``extra.times_log_growth`` is that over the row above. Snapshots and checkpoints fall due
  by heartbeats and WAL bytes, not by time, so the compressed clock writes what the defaults
  write.
- ``coordinator rss N ranks`` (MB): the coordinator's peak resident memory (VmHWM) at the end.

How each cost grows with N is in ``extra.growth`` of the largest size: the ratio of the figure
at N to the figure at the smallest N, against N's own ratio.
"""

from __future__ import annotations

import asyncio
import gc
import sqlite3
import time
from pathlib import Path

from ..agent.simhost import SimulatedCluster
from .harness import Result, median
from .kit.service import Service
from .kit.simulated import create_group, run_with_server_gc

SIZES = (1024, 4096, 16384)
QUICK_SIZES = (1024, 4096)
#: Sizes measured for the view change rows alone (a small group: the change is a few ms of
#: work, so any wait in it shows), with more trials since each is short.
VIEW_ONLY_SIZES = (256,)
VIEW_ONLY_TRIALS = 10
#: Seconds a data plane takes to build a committed view before it reports it built, for the
#: ``view change N ranks, view built 1 s later`` rows (a real one connects the members first).
BUILD_S = 1.0
RANKS_PER_HOST = 8
GROUP_CONFIG = {
    "heartbeat_timeout_s": 30.0,
    "ack_timeout_s": 30.0,
    "admission_timeout_s": 60.0,
    "formation_timeout_s": 300.0,
    "reconcile_window_s": 0.05,
}
TARGETS = {
    "formation": {16384: "<= 10 s"},
    "view change": {256: "<= 0.03 s", 4096: "<= 0.3 s", 16384: "<= 2 s"},
    "cpu": "<= 20 us",
    "log": "<= 4000 B",
    "rss": {16384: "<= 1536 MB"},
}
#: Seconds of heartbeats the CPU row is measured over: the process's CPU time is counted in
#: clock ticks (10 ms), so at 1,024 ranks (about 0.2 s of CPU in 10 s) a short window would
#: be a tick or two off.
CPU_WINDOW_S = 20.0
#: The clock compression of the log-bytes run (see the module docstring).
LOG_BEATS_PER_S = 20_000
LOG_HEARTBEATS = 1_000_000


def _written(pid: int | str) -> int:
    """Bytes the process sent to the storage layer so far (``write_bytes`` of
    ``/proc/PID/io``: file pages it dirtied, whatever their file, counted again once a sync
    has written them; sockets and pipes are not in it)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/io has no write_bytes: no I/O accounting here")


def _log_bytes(db: str) -> int:
    """Bytes of the log's records on disk: the pages of the ``log`` table and its indexes,
    after folding the WAL in (projections and the snapshot are bounded; they do not grow with
    the heartbeats)."""
    with sqlite3.connect(db, timeout=30) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        names = [
            row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE tbl_name = 'log'")
        ]
        marks = ",".join("?" * len(names))
        (used,) = conn.execute(
            f"SELECT SUM(pgsize - unused) FROM dbstat WHERE name IN ({marks})", names
        ).fetchone()
    return int(used or 0)


async def _heartbeats_total(port: int) -> int:
    """``foldplane_heartbeats_total`` from the coordinator's /metrics (text, not JSON)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    data = await reader.read()
    writer.close()
    for line in data.split(b"\r\n\r\n", 1)[1].decode().splitlines():
        if line.startswith("foldplane_heartbeats_total "):
            return int(float(line.split()[1]))
    return 0


def _update_bytes(cluster: SimulatedCluster) -> int:
    return sum(h.update_bytes for h in cluster.hosts)


async def _one_size(n: int, trials: int, *, cpu_window: bool = True) -> dict[str, object]:
    coordinator = Service("--heartbeat-flush-s", "0.5", name="scale").start()
    address = ("127.0.0.1", coordinator.port)
    try:
        await create_group(coordinator, "scale", n, **GROUP_CONFIG)
        # the real agent client's request timeout (agent.client), not the failover tests' 5 s
        cluster = SimulatedCluster(
            address, "scale", n, ranks_per_host=RANKS_PER_HOST, request_timeout_s=10.0
        )
        t0 = time.monotonic()
        await cluster.start()
        await cluster.wait_until(lambda: cluster.all_on(1), timeout=600)
        formation = time.monotonic() - t0
        gc.collect()
        gc.freeze()  # the agent machines: see the module docstring

        # steady state: heartbeats only
        await asyncio.sleep(3.0)
        beats0, cpu0 = await _heartbeats_total(coordinator.port), coordinator.cpu_s()
        await asyncio.sleep(CPU_WINDOW_S if cpu_window else 0.0)
        beats1, cpu1 = await _heartbeats_total(coordinator.port), coordinator.cpu_s()
        cpu_per_beat_us = (cpu1 - cpu0) / max(beats1 - beats0, 1) * 1e6

        now = await _view_changes(cluster, coordinator, trials, 0)
        later = await _view_changes(cluster, coordinator, trials, BUILD_S)
        if cluster.stopped:
            raise RuntimeError(f"{len(cluster.stopped)} agents stopped: {cluster.stopped}")
        rss = coordinator.peak_rss_mb()
        await cluster.stop()
    finally:
        gc.unfreeze()
        coordinator.close()
    return {
        "formation": formation,
        "view change": now["changes"],
        "change cpu": now["cpu"],
        "stalled": now["stalled"],
        "bytes": now["sent"],
        "built later": later,
        "cpu": cpu_per_beat_us,
        "cpu_beats": beats1 - beats0,
        "rss": rss,
    }


async def _view_changes(
    cluster: SimulatedCluster, coordinator: Service, trials: int, build_s: float
) -> dict[str, list]:
    """``trials`` view changes, each a rank killed and its death reported, timed until every
    survivor holds the next view; the data planes report each view built ``build_s`` after
    it came (0: at once)."""
    for host in cluster.hosts:
        host.build_s = build_s
    changes: list[float] = []
    sent: list[int] = []
    change_cpu: list[float] = []
    stalled: list[str] = []
    offset = 0 if not build_s else 7
    for k in range(trials):
        version = max(cluster.view(r).version for r in cluster.live_ranks)
        victim = cluster.live_ranks[((k + offset) * 7919 + 13) % len(cluster.live_ranks)]
        before = _update_bytes(cluster)
        cpu_before = coordinator.cpu_s()
        t = time.monotonic()
        cluster.kill(victim)
        status, answer = await cluster.report_death(victim)
        if status != 200:
            raise RuntimeError(f"death report answered {status}: {answer}")
        try:
            await cluster.wait_until(lambda v=version: cluster.all_on(v + 1), timeout=300)
        except TimeoutError as exc:
            stalled.append(str(exc))
            break  # the group is stuck: the trials after this one would measure nothing
        changes.append(time.monotonic() - t)
        change_cpu.append(coordinator.cpu_s() - cpu_before)
        sent.append(_update_bytes(cluster) - before)
        await asyncio.sleep(1.0 + build_s)  # the built reports land before the next trial
    return {"changes": changes, "cpu": change_cpu, "stalled": stalled, "sent": sent}


async def _log_rate(n: int) -> dict[str, float]:
    """Log bytes per heartbeat over at least LOG_HEARTBEATS beats, clock compressed."""
    beat_s = min(1.0, n / LOG_BEATS_PER_S)
    coordinator = Service("--heartbeat-flush-s", str(beat_s / 2), name="scale").start()
    pid = coordinator.pid
    address = ("127.0.0.1", coordinator.port)
    try:
        await create_group(coordinator, "log", n, **GROUP_CONFIG)
        cluster = SimulatedCluster(
            address, "log", n, ranks_per_host=RANKS_PER_HOST, heartbeat_interval_s=beat_s
        )
        await cluster.start()
        await cluster.wait_until(lambda: cluster.all_on(1), timeout=600)
        await asyncio.sleep(1.0)
        size0, beats0 = _log_bytes(coordinator.db), await _heartbeats_total(coordinator.port)
        written0 = _written(pid)
        t0 = time.monotonic()
        beats1 = beats0
        while beats1 - beats0 < LOG_HEARTBEATS and time.monotonic() - t0 < 900:
            await asyncio.sleep(5.0)
            beats1 = await _heartbeats_total(coordinator.port)
        written1 = _written(pid)
        # the WAL still to be copied into the database file is copied here, by this process
        own = _written("self")
        size1 = _log_bytes(coordinator.db)
        checkpoint = _written("self") - own
        await cluster.stop()
    finally:
        coordinator.close()
    beats = beats1 - beats0
    per_beat = (size1 - size0) / max(beats, 1)
    disk = written1 - written0 + checkpoint
    return {
        "per_beat": per_beat,
        "beats": beats,
        "beat_s": beat_s,
        "disk_per_beat": disk / max(beats, 1),
        "disk": disk,
        "final_checkpoint": checkpoint,
    }


def _growth(values: dict[int, float]) -> str:
    sizes = sorted(values)
    small, large = sizes[0], sizes[-1]
    if not values[small]:
        return ""
    return (
        f"x{values[large] / values[small]:.2f} from {small} to {large} ranks "
        f"(N x{large / small:.0f})"
    )


async def _run_async(quick: bool) -> list[Result]:
    sizes = QUICK_SIZES if quick else SIZES
    trials = 3 if quick else 5
    small = {n: await _one_size(n, VIEW_ONLY_TRIALS, cpu_window=False) for n in VIEW_ONLY_SIZES}
    measured = {n: await _one_size(n, trials) for n in sizes}
    logs = {n: await _log_rate(n) for n in sizes}
    results: list[Result] = []
    for n, m in small.items():
        results += _view_change_rows(n, m)
    series: dict[str, dict[int, float]] = {k: {} for k in ("f", "v", "c", "b", "l", "d", "r")}
    for n in sizes:
        m = measured[n]
        series["f"][n] = m["formation"]
        series["v"][n] = median(m["view change"]) if m["view change"] else float("nan")
        series["c"][n] = m["cpu"]
        series["b"][n] = median(m["bytes"]) if m["bytes"] else float("nan")
        series["l"][n] = logs[n]["per_beat"] * 3600
        series["d"][n] = logs[n]["disk_per_beat"] * 3600
        series["r"][n] = m["rss"]
    last = sizes[-1]
    for n in sizes:
        m = measured[n]
        grow = (lambda key: {"growth": _growth(series[key])}) if n == last else (lambda key: {})
        results += [
            Result(
                "scale",
                f"formation {n} ranks",
                "s",
                series["f"][n],
                target=TARGETS["formation"].get(n),
                extra=grow("f"),
            ),
            *_view_change_rows(n, m, grow("v")),
            Result(
                "scale",
                f"coordinator cpu per heartbeat {n} ranks",
                "us",
                series["c"][n],
                target=TARGETS["cpu"],
                extra={"heartbeats": m["cpu_beats"], **grow("c")},
            ),
            Result(
                "scale",
                f"bytes to agents per view change {n} ranks",
                "B",
                series["b"][n],
                target=f"<= {200 * n:,} B (200 x N)",
                extra={"per_rank": round(series["b"][n] / n, 1), **grow("b")},
            ),
            Result(
                "scale",
                f"log bytes per rank-hour {n} ranks",
                "B",
                series["l"][n],
                target=TARGETS["log"],
                extra={
                    "bytes_per_heartbeat": round(logs[n]["per_beat"], 3),
                    "heartbeats": logs[n]["beats"],
                    "beat_interval_s": logs[n]["beat_s"],
                    **grow("l"),
                },
            ),
            Result(
                "scale",
                f"disk bytes per rank-hour {n} ranks",
                "B",
                series["d"][n],
                extra={
                    "bytes_per_heartbeat": round(logs[n]["disk_per_beat"], 3),
                    "bytes_written": logs[n]["disk"],
                    "of_which_final_checkpoint": logs[n]["final_checkpoint"],
                    "times_log_growth": round(series["d"][n] / series["l"][n], 1)
                    if series["l"][n]
                    else None,
                    **grow("d"),
                },
            ),
            Result(
                "scale",
                f"coordinator rss {n} ranks",
                "MB",
                series["r"][n],
                target=TARGETS["rss"].get(n),
                extra=grow("r"),
            ),
        ]
    return results


def _view_change_rows(n: int, m: dict, grow: dict | None = None) -> list[Result]:
    """The view change rows of size ``n``: built views reported at once, and 1 s later."""
    later = m["built later"]
    changes = m["view change"]
    return [
        Result(
            "scale",
            f"view change {n} ranks",
            "s",
            median(changes) if changes else float("nan"),
            p99=max(changes, default=float("nan")),
            target=TARGETS["view change"].get(n),
            extra={
                "trials": len(changes),
                "coordinator_cpu_s": round(median(m["change cpu"]), 3) if m["change cpu"] else None,
                "stalled": m["stalled"],
                **(grow or {}),
            },
        ),
        Result(
            "scale",
            f"view change {n} ranks, view built {BUILD_S:g} s later",
            "s",
            median(later["changes"]) if later["changes"] else float("nan"),
            p99=max(later["changes"], default=float("nan")),
            target=TARGETS["view change"].get(n),
            extra={
                "trials": len(later["changes"]),
                "coordinator_cpu_s": round(median(later["cpu"]), 3) if later["cpu"] else None,
                "stalled": later["stalled"],
            },
        ),
    ]


def run(quick: bool) -> list[Result]:
    return run_with_server_gc(lambda: _run_async(quick))
