"""What every benchmark returns, and how the results are printed and saved.

A benchmark module ``benchmarks/<name>.py`` defines ``run(quick: bool) -> list[Result]``.
Each Result is one metric's median over repeated trials (the machine is shared and noisy, so
single times mean little); where a peer or baseline was measured in the same run, ``ratio`` says
how foldplane compares (``median / baseline_median`` for throughputs, the other way round for
latencies, so that a ratio above 1 always means foldplane is better).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Result:
    bench: str
    metric: str
    unit: str
    median: float
    p99: float | None = None
    baseline: str | None = None
    baseline_median: float | None = None
    ratio: float | None = None
    target: str | None = None
    extra: dict = field(default_factory=dict)

    def as_json(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if v is not None and v != {}}
        return d


def _reference_work() -> int:
    table: dict[str, tuple[int, list[int]]] = {}
    for i in range(20_000):
        table[f"k{i % 512}"] = (i, [i, i + 1])
    return len(table)


def machine_reference_ms(repeats: int = 7) -> float:
    """CPU milliseconds of a fixed piece of plain Python (dicts, tuples, lists, formatting: what
    an interpreter-bound service does), the median of ``repeats``. The machine is shared and
    its speed drifts by several times between sessions; a run records this at its start and
    end, so runs on different days can be compared, and a target missed on a slow day is told
    apart from a slower program."""
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        _reference_work()
        times.append((time.process_time() - t0) * 1e3)
    return median(times)


def median(xs) -> float:
    return float(statistics.median(xs))


def percentile(xs, q: float) -> float:
    s = sorted(xs)
    if not s:
        return float("nan")
    k = min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))
    return float(s[k])


def higher_is_better_ratio(ours: float, theirs: float) -> float | None:
    return ours / theirs if theirs else None


def lower_is_better_ratio(ours: float, theirs: float) -> float | None:
    return theirs / ours if ours else None


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.3g}"


def print_table(results: list[Result]) -> None:
    cols = [
        "bench",
        "metric",
        "unit",
        "median",
        "p99",
        "baseline",
        "baseline median",
        "ratio",
        "target",
    ]
    rows = [
        [
            r.bench,
            r.metric,
            r.unit,
            _fmt(r.median),
            _fmt(r.p99),
            r.baseline or "-",
            _fmt(r.baseline_median),
            "-" if r.ratio is None else f"{r.ratio:.2f}x",
            r.target or "-",
        ]
        for r in results
    ]
    widths = [
        max(len(c), *(len(row[i]) for row in rows)) if rows else len(c) for i, c in enumerate(cols)
    ]
    line = "  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))
    print(line)
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)), flush=True)


def write_json(path: str, results: list[Result], run: dict | None = None) -> None:
    """Save a run: ``run`` says when and how it was made (``benchmarks.report`` reads it)."""
    data = {"run": run} if run else {}
    data["results"] = [r.as_json() for r in results]
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
