"""``python -m benchmarks.report RUN.json... [--check FILE]`` — render docs/benchmarks.md from runs.

The page is generated, never edited: each benchmark gets one table, the rows of the newest run
given that measured it (``run.date`` decides; a later file on the command line wins a tie), with
the same-run baselines and ratios, under the benchmark module's docstring (what it measures) and
how to reproduce it. A run file is what ``python -m benchmarks --json FILE`` writes:
``{"run": {...}, "results": [...]}``; ``run`` says when and how it was made (see ``RUN_FIELDS``).

``--check FILE`` renders and compares with FILE instead of printing: exit status 1 and a short
diff when they differ, so the page cannot drift from its data.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import re
import sys
from pathlib import Path

#: What a run file's ``run`` object may say; ``date`` (ISO 8601, as precise as known) is required.
RUN_FIELDS = ("date", "command", "quick", "load_average", "reference_ms", "note")

HERE = Path(__file__).resolve().parent
NOT_BENCHES = {"harness", "report", "__main__", "__init__"}

#: The command that regenerates the page; the test runs the same.
REGENERATE = "python -m benchmarks.report docs/benchmark-runs/*.json > docs/benchmarks.md"

INTRO = """\
Every figure here comes from `python -m benchmarks` on this project's reference machine: 2 vCPUs
(shared), 24 GiB, no GPU, SQLite on ext4 over virtio, PostgreSQL 15 on 127.0.0.1. Each benchmark
repeats its trials and reports the **median** (and p99 where latency matters); where a peer or a
baseline exists it is measured **in the same run**, and `ratio` is always "how many times better
foldplane is" (baseline ÷ ours for latencies, ours ÷ baseline for throughputs), so a ratio below 1
means the baseline was better on that metric. The machine is shared and its speed drifts by more
than a third within an hour, so absolute figures from different runs compare poorly; the ratios
against same-run baselines are the steadier part.

This page is generated from the run files in [benchmark-runs/](benchmark-runs/) by
`benchmarks/report.py`; each table shows the newest recorded run of its benchmark. To change a
figure, record a run and regenerate; to change a description, edit the benchmark module's
docstring (or `benchmarks/report.py`) and regenerate. `tests/test_docs.py` fails when this page
differs from what its data renders."""

REPRODUCE = """\
```bash
.venv/bin/pip install -q -c constraints-dev.txt -e '.[dev,bench]'   # bench adds torchft 0.2.0
.venv/bin/python -m benchmarks --quick --json bench.json            # all of them, smaller sizes
.venv/bin/python -m benchmarks eventlog fold healthy_set            # full sizes, a few at a time
.venv/bin/python -m benchmarks --help
# record a run and regenerate this page:
.venv/bin/python -m benchmarks NAME... --json docs/benchmark-runs/YYYY-MM-DD-NAME.json
.venv/bin/{regenerate}
```

`--quick` uses smaller sizes (e.g. replay over 200,000 records instead of 1,000,000; 3 kills
instead of 8). `--json FILE` writes `{{"run": {{"date", "command", "quick", "load_average",
"reference_ms"}}, "results": [{{"bench", "metric", "unit", "median", "p99"?, "baseline"?,
"baseline_median"?, "ratio"?, "target"?, "extra"?}}]}}`; the notes column below shows each
row's scalar `extra` values, the run file holds them all. `reference_ms` is the CPU time of a
fixed piece of plain Python (`benchmarks.harness.machine_reference_ms`) at the run's start and
end: the shared machine's speed drifts by several times between days, and this tells a slow
day from a slower program (runs recorded before it was added do not have it)."""

#: Reference notes under a benchmark's table: how to read it, what its limits are.
NOTES = {
    "ddp": """\
A torchft row without a baseline median is a run in which torchft's survivors did not commit a
step without the dead replica within the benchmark's bound: its DDP comm hook raises an
`AssertionError` from `backward()` when the allreduce failed (the benchmark reports that to the
manager, as a careful worker would), and the survivors sometimes die or never form a quorum of
three; the run file's `extra` says what happened. Per step, the elastic DDP adds the commit
agreement (three round trips to the coordinator's store) and a Python completion per bucket;
the buckets' all-reduce runs on the view's gloo backend, so with these model sizes the step is
dominated by the gradient all-reduce and the ratio moves with the machine by more than the
overhead itself. See [ddp.md](ddp.md).""",
    "eventlog": """\
What bounds each figure (group commit, the replay's per-record costs, PostgreSQL's round trips)
is in [eventlog.md](eventlog.md#performance).""",
    "fold": """\
The fold's own figures are CPU time, so other processes' noise does not inflate them. What a
heartbeat, an ACK and a failure cost in the fold is in [fold.md](fold.md#performance).""",
    "ingest": """\
How to read it, and what was taken out of the request path to reach these figures, is in
[operations.md](operations.md#figures).""",
    "scale": """\
How the costs grow with N: bytes to agents per view change are constant per rank (the deltas of
one rank lost, one long poll per host; the largest report and update at 65,536 ranks are bounded
by `tests/scale/test_limits.py`); log bytes per rank-hour fall with N, since a shared heartbeat
record costs its fixed overhead plus a rank set (a bitmap of the group at most); coordinator
memory grows linearly; coordinator CPU per heartbeat is constant. It is the HTTP request (8
beats a request: uvicorn's parsing and the connection's own answer), the API's, host's and
fold's work for each beat (reading the batch, queueing, the pre-check, the shared record, the
answer), the log's writer thread, and the steady state's periodic work (every host's long poll
timing out each 10 s, a snapshot each 30 s); the simulator, on the same two cores, spends about
as much CPU per beat as the coordinator. The view change at 16,384 ranks grows faster than N:
the heartbeats alone keep the coordinator's core busy for most of each second (16,384 beats a
second at the row above), and the change's own work gets what is left; in the recorded run the
coordinator's CPU over a change (its `coordinator_cpu_s`) is most of the change's wall time.
How fast the machine ran is in the run line (`reference_ms`).""",
}


def bench_names() -> list[str]:
    """Every benchmark module, as ``python -m benchmarks`` lists them."""
    return sorted(
        p.stem
        for p in HERE.glob("*.py")
        if p.stem not in NOT_BENCHES and not p.stem.startswith("_")
    )


def describe(name: str) -> str:
    """The benchmark module's docstring as markdown, read without importing the module."""
    doc = ast.get_docstring(ast.parse((HERE / f"{name}.py").read_text())) or ""
    return re.sub(r"``(.+?)``", r"`\1`", doc, flags=re.S).strip()


def load(path: Path) -> dict:
    """One run file, checked: a clear error names the file and what is wrong with it."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"{path}: not a readable JSON run file: {exc}") from exc
    run = data.get("run") if isinstance(data, dict) else None
    if not isinstance(run, dict) or not isinstance(run.get("date"), str):
        raise SystemExit(f'{path}: no "run" object with a "date" (ISO 8601) in it')
    unknown = sorted(set(run) - set(RUN_FIELDS))
    if unknown:
        raise SystemExit(f"{path}: unknown run fields {unknown}; known: {list(RUN_FIELDS)}")
    results = data.get("results")
    if not isinstance(results, list) or not results:
        raise SystemExit(f'{path}: no "results" list')
    for i, r in enumerate(results):
        missing = [k for k in ("bench", "metric", "unit", "median") if k not in r]
        if missing:
            raise SystemExit(f"{path}: result {i} lacks {missing}")
    return {"file": path.name, "run": run, "results": results}


def newest_runs(runs: list[dict]) -> dict[str, dict]:
    """For each benchmark, the newest run that measured it (a later file wins a tie)."""
    chosen: dict[str, dict] = {}
    for run in sorted(runs, key=lambda r: r["run"]["date"]):  # stable: ties keep file order
        for r in run["results"]:
            chosen[r["bench"]] = run
    return chosen


def num(x: float | None) -> str:
    if x is None:
        return "–"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.3g}"


def notes(extra: dict) -> str:
    parts = []
    for k, v in extra.items():
        if isinstance(v, (bool, list, dict)):
            continue
        if isinstance(v, float):
            v = num(v)
        elif isinstance(v, str) and len(v) > 120:
            continue
        parts.append(str(v) if k == "note" else f"{k.replace('_', ' ')} {v}")
    return "; ".join(parts)


_SCALE = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6}
_BOUND = re.compile(
    r"^(?P<field>p50 |p99 |median )?(?P<op><=|>=) ?(?P<value>[\d,]*\.?\d+)"
    r" ?(?P<unit>x(?: (?P<peer>\w+))?|/s|s|ms|us|µs|B|MB|%)?(?: \([^)]*\))?$"
)


def _meets(row: dict, part: str) -> bool | None:
    """Whether ``row`` meets one bound like ``p99 <= 10 ms``; None when the text says more."""
    m = _BOUND.match(part.strip())
    if m is None:
        return None
    field = "p99" if m["field"] == "p99 " else "median"
    value = float(m["value"].replace(",", ""))
    unit = m["unit"]
    if unit is not None and unit.startswith("x") and row.get("unit") != "x":
        if m["peer"] and m["peer"] not in (row.get("baseline") or ""):
            return None  # a ratio against another peer than this row's baseline
        have = row.get("ratio")
    else:
        have, row_unit = row.get(field), str(row.get("unit", ""))
        if unit in _SCALE and row_unit in _SCALE:
            value *= _SCALE[unit] / _SCALE[row_unit]
        elif not (unit in (None, "x", row_unit) or (unit == "/s" and row_unit.endswith("/s"))):
            return None  # a bound in another unit than the row's
    if have is None:
        return None
    return have <= value if m["op"] == "<=" else have >= value


def verdict(row: dict) -> str:
    """ "met", "not met", or "" where the target is prose this page cannot check."""
    target = row.get("target")
    if not target:
        return ""
    got = [_meets(row, part) for part in target.split(" and ")]
    if None in got:
        return ""
    return "met" if all(got) else "**not met**"


def cell(s: str) -> str:
    return s.replace("|", "\\|")


def run_line(run: dict) -> str:
    meta = run["run"]
    kind = "`--quick`" if meta.get("quick") else "full size"
    bits = [f"{meta['date']}", kind]
    if "load_average" in meta:
        bits.append(f"load average {meta['load_average']} at the start")
    if "reference_ms" in meta:
        start, end = meta["reference_ms"]
        bits.append(f"machine reference {start} ms at the start and {end} ms at the end")
    line = f"Recorded run: {', '.join(bits)}"
    if "command" in meta:
        line += f", `{meta['command']}`"
    line += f" ([{run['file']}](benchmark-runs/{run['file']}))."
    if "note" in meta:
        line += f" {meta['note']}"
    return line


def table(rows: list[dict]) -> list[str]:
    with_notes = any(notes(r.get("extra", {})) for r in rows)
    head = ["metric", "unit", "median", "p99", "baseline (same run)", "baseline median", "ratio"]
    head += ["target"] + (["notes"] if with_notes else [])
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        baseline = r.get("baseline")
        base_median = r.get("baseline_median")
        cells = [
            cell(r["metric"]),
            cell(r["unit"]),
            num(r["median"]),
            num(r.get("p99")),
            cell(baseline) if baseline else "–",
            num(base_median) if base_median is not None or not baseline else "no result",
            f"{r['ratio']:.2f}x" if r.get("ratio") is not None else "–",
            cell(r["target"]) if r.get("target") else "–",
        ]
        if with_notes:
            cells.append(cell(notes(r.get("extra", {}))) or "–")
        out.append("| " + " | ".join(cells) + " |")
    return out


def render(runs: list[dict]) -> str:
    chosen = newest_runs(runs)
    names = bench_names()
    unknown = sorted(set(chosen) - set(names))
    if unknown:
        raise SystemExit(f"results for unknown benchmark(s) {unknown}; known: {names}")
    out = [
        "# Benchmarks",
        "",
        f"<!-- Generated: {REGENERATE}. Do not edit by hand. -->",
        "",
        INTRO,
        "",
        "## How to reproduce",
        "",
        REPRODUCE.format(regenerate=REGENERATE),
        "",
        "## Against the targets",
        "",
        "Every row with a target, from the tables below; the last column is worked out from the",
        "target's text where it is a plain bound (`<=`/`>=` a value, on the median, the p99 or",
        "the same-run ratio), and left empty where the target says more than that.",
        "",
        "| benchmark | metric | median | p99 | ratio (same run) | target | |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in names:
        if name not in chosen:
            continue
        for r in chosen[name]["results"]:
            if r["bench"] == name and r.get("target"):
                ratio = f"{r['ratio']:.2f}x" if r.get("ratio") is not None else "–"
                out.append(
                    f"| [`{name}`](#{name}) | {cell(r['metric'])} | "
                    f"{num(r['median'])} {cell(r['unit'])} | {num(r.get('p99'))} | {ratio} | "
                    f"{cell(r['target'])} | {verdict(r) or '–'} |"
                )
    for name in names:
        out += ["", f"## `{name}`", "", describe(name), ""]
        out.append(
            f"Reproduce: `python -m benchmarks {name}` (full size) or "
            f"`python -m benchmarks {name} --quick`."
        )
        out.append("")
        if name not in chosen:
            out.append("No run of it is recorded in [benchmark-runs/](benchmark-runs/) yet.")
        else:
            out += [run_line(chosen[name]), ""]
            out += table([r for r in chosen[name]["results"] if r["bench"] == name])
        if name in NOTES:
            out += ["", NOTES[name]]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__)
    p.add_argument("runs", nargs="+", metavar="RUN.json", type=Path)
    p.add_argument("--check", metavar="FILE", type=Path, help="compare with FILE, do not print")
    args = p.parse_args(argv)
    text = render([load(path) for path in args.runs])
    if args.check is None:
        sys.stdout.write(text)
        return 0
    have = args.check.read_text() if args.check.exists() else ""
    if have == text:
        return 0
    diff = difflib.unified_diff(
        have.splitlines(), text.splitlines(), str(args.check), "rendered", lineterm="", n=1
    )
    print("\n".join(list(diff)[:60]), file=sys.stderr)
    print(f"{args.check} differs from its data; regenerate: {REGENERATE}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
