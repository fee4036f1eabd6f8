"""torchft on a foldplane lighthouse (``serve --lighthouse-port``), against torchft's own lighthouse
(torchft-nightly's ``torchft_lighthouse``, in memory), in the same run:

- **torchft quorum latency**: two replica groups, each a thread calling torchft's
  ``LighthouseClient.quorum`` at once, round after round with the same members (a fast quorum:
  every member of the last quorum is back); a round is timed from the release of the threads
  to the last answer. foldplane answers a quorum only once the requests that decided it are
  durable in its SQLite log (fsynced); the requests of a fast quorum's members share one append,
  so its floor is the lighthouse's time plus one durable append. The row's target allows two
  appends plus 1 ms, with the fsync cost measured in the same run (``fsync floor``: one
  ``Log.append`` of one record). The three are measured in the same windows: both
  lighthouses stay up while their rounds and the floor's appends take turns, a tenth of each
  at a time, so a burst of load on the shared machine (its disk above all) falls on all
  three, not on whichever ran at that moment.
- **torchft recovery kill 1 of 2 replica groups**: two replica groups of one process each,
  torchft's ``Manager`` over torch's native gloo group (``enable_reconfigure``), each step a
  quorum, an allreduce and a commit; the second one is SIGKILLed. Measured: from the kill to
  the survivor's first committed step whose quorum is itself alone. Both lighthouses run the
  same rule settings (a heartbeat timeout of 1 s, torchft's default being 5 s); foldplane's
  launcher reports the death it saw (``POST /lighthouse/replicas/{replica}/lost``), so the
  survivor's next quorum does not wait for the heartbeat timeout. torchft's lighthouse has no
  way to hear of a death.

Workers are this module, run as ``python -m foldplane.benchmarks.lighthouse MODE``; they print one JSON
line per event with wall-clock times (``time.time()``), the clock of the kill.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
import threading
import time
from typing import Any

from .harness import Result, lower_is_better_ratio, median, percentile
from .kit import baselines
from .kit.floors import fsync_floor
from .kit.workers import emit, say

STEP_PAUSE_S = 0.005
#: The windows in which the latency rounds of both lighthouses and the fsync floor take turns.
WINDOWS = 10
LATENCY = "torchft quorum latency"
RECOVERY = "torchft recovery kill 1 of 2 replica groups"
PEER = f"{baselines.torchft_version()} lighthouse (in memory)"

_log = say("lighthouse")


def _latencies(rounds: int, appends: int) -> tuple[list[float], Any, list[float]]:
    """Milliseconds of ``rounds`` quorum rounds on foldplane's lighthouse and on torchft's
    (or the exception that kept torchft's from being measured), and of ``appends`` durable
    appends (the fsync floor), taking turns in :data:`WINDOWS` windows."""
    ours: list[float] = []
    theirs: list[float] = []
    fsync: list[float] = []
    with (
        contextlib.ExitStack() as stack,
        tempfile.TemporaryDirectory(prefix="foldplane-bench-fsync-") as tmp,
    ):
        peer: Any = baselines.measured(
            PEER, lambda: stack.enter_context(baselines.Lighthouse(min_replicas=2)), _log
        )
        mine = stack.enter_context(baselines.FoldplaneLighthouse(min_replicas=2))
        for k in range(WINDOWS):
            share = rounds // WINDOWS + (k < rounds % WINDOWS)
            fsync += asyncio.run(fsync_floor(f"{tmp}/floor.db", appends // WINDOWS))
            if not isinstance(peer, Exception):
                address = peer.address
                got = baselines.measured(
                    PEER, lambda a=address, n=share: baselines.quorum_rounds(a, 2, n), _log
                )
                if isinstance(got, Exception):
                    peer = got
                else:
                    theirs += got
            ours += baselines.quorum_rounds(mine.address, 2, share)
    return ours, (peer if isinstance(peer, Exception) else theirs), fsync


def _recovery(lighthouse: Any, trials: int) -> list[float]:
    import torch.distributed as dist

    samples = []
    for k in range(trials):
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        with baselines.ReplicaGroups(
            lambda r, address, port=store.port: [
                sys.executable, "-m", __name__, "worker", str(r), address, str(port)
            ],
            2,
            lambda: lighthouse(min_replicas=1),
        ) as replicas:  # fmt: skip
            replicas.formed(commits=3)
            samples.append(replicas.kill_last(120))
        del store
        _log(f"{lighthouse.name} trial {k + 1}/{trials}: {samples[-1]:.3f} s")
    return samples


def _worker(replica: int, lighthouse: str, store_port: int) -> int:
    import torch

    manager = baselines.torchft_manager(
        replica, lighthouse, timeout_s=10, quorum_timeout_s=60, min_replica_size=1,
        native=("127.0.0.1", store_port, 2),
    )  # fmt: skip
    t = torch.ones(1024)
    pause = threading.Event()
    while True:
        manager.start_quorum()
        t.fill_(1.0)
        manager.allreduce(t).wait()
        if manager.should_commit():
            emit(replica=replica, participants=manager.num_participants(), t=time.time())
        pause.wait(STEP_PAUSE_S)


def run(quick: bool) -> list[Result]:
    rounds, trials, appends = (100, 2, 50) if quick else (400, 5, 200)
    ours, theirs, fsync = _latencies(rounds, appends)
    fsync_ms = median(fsync)
    rows = [_latency_row(ours, theirs, fsync_ms)]
    ft_recovery = baselines.measured(PEER, lambda: _recovery(baselines.Lighthouse, trials), _log)
    rows.append(_recovery_row(_recovery(baselines.FoldplaneLighthouse, trials), ft_recovery))
    rows.append(
        Result(
            "lighthouse",
            "fsync floor (one durable SQLite append)",
            "ms",
            fsync_ms,
            p99=percentile(fsync, 99),
            extra={"appends": len(fsync)},
        )  # fmt: skip
    )
    return rows


def _latency_row(ours: list[float], theirs: Any, fsync_ms: float) -> Result:
    extra: dict[str, Any] = {"rounds": len(ours), "fsync_ms": round(fsync_ms, 3)}
    if isinstance(theirs, Exception):
        return Result("lighthouse", LATENCY, "ms", median(ours), p99=percentile(ours, 99),
                      baseline=PEER, target="<= torchft + 2 fsyncs + 1 ms",
                      extra={**extra, "baseline_error": str(theirs)[:500]})  # fmt: skip
    # the target's bound, from this run's figures: torchft's median + 2 fsyncs + 1 ms
    bound = median(theirs) + 2 * fsync_ms + 1.0
    extra |= {"target": "torchft + 2 fsyncs + 1 ms"}
    return Result(
        "lighthouse", LATENCY, "ms", median(ours), p99=percentile(ours, 99), baseline=PEER,
        baseline_median=median(theirs), ratio=lower_is_better_ratio(median(ours), median(theirs)),
        target=f"<= {bound:.2f} ms", extra=extra,
    )  # fmt: skip


def _recovery_row(ours: list[float], theirs: Any) -> Result:
    extra: dict[str, Any] = {"samples_s": [round(s, 3) for s in ours]}
    if isinstance(theirs, Exception):
        return Result("lighthouse", RECOVERY, "s", median(ours), p99=percentile(ours, 99),
                      baseline=PEER, target=">= 2.0x torchft",
                      extra={**extra, "baseline_error": str(theirs)[:500]})  # fmt: skip
    return Result(
        "lighthouse", RECOVERY, "s", median(ours), p99=percentile(ours, 99), baseline=PEER,
        baseline_median=median(theirs), ratio=lower_is_better_ratio(median(ours), median(theirs)),
        target=">= 2.0x torchft",
        extra={**extra, "baseline_samples_s": [round(s, 3) for s in theirs]},
    )  # fmt: skip


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "worker":
        raise SystemExit(_worker(int(sys.argv[2]), sys.argv[3], int(sys.argv[4])))
    raise SystemExit(f"unknown mode {mode!r}")
