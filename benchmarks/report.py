"""``python -m benchmarks.report RUN.json... [--check FILE]`` — render docs/benchmarks.md from runs.

The page is generated, never edited: each benchmark gets one table, the rows of the newest run
given that measured it (``run.date`` decides; a later file on the command line wins a tie), with
the same-run baselines and ratios, under the benchmark module's docstring (what it measures) and
how to reproduce it. A run file is what ``python -m benchmarks --json FILE`` writes:
``{"run": {...}, "results": [...]}``; ``run`` says when and how it was made (see ``RUN_FIELDS``).

``--check FILE`` renders and compares with FILE instead of printing: exit status 1 and a short
diff when they differ, so the page cannot drift from its data. ``--plot FILE`` writes the
scale benchmark's growth picture instead (:func:`growth_svg`, docs/scale-growth.svg).
``--figures NAME PAGE`` rewrites the block of one benchmark's figures that a page of docs/
shows beside its text (:func:`with_figures`; docs/data.md has the ``data`` benchmark's).
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import math
import re
import sys
from pathlib import Path

from foldplane.benchmarks.kit.catalog import benchmarks, source

#: What a run file's ``run`` object may say; ``date`` (ISO 8601, as precise as known) is required.
RUN_FIELDS = ("date", "command", "quick", "load_average", "reference_ms", "note")


#: The command that regenerates the page; the test runs the same.
REGENERATE = "python -m benchmarks.report docs/benchmark-runs/*.json > docs/benchmarks.md"
#: The command that redraws the scale benchmark's growth picture.
REPLOT = "python -m benchmarks.report --plot docs/scale-growth.svg docs/benchmark-runs/*.json"

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
differs from what its data renders.

Each benchmark is one module of `benchmarks/`, or of a facet's folder when it measures that
facet alone (its plugin's `benchmarks`: `data` is `facets/epochs/benchmark.py`, `refit`
`facets/refits/benchmark.py`): its scenario
(its workers are the module run as a script) and its rows. What they share is written once in
`benchmarks/kit/`: the coordinator process and the launchers of workers on it (`service`), the
workers' JSON lines (`workers`), the clock from a kill to the last survivor's recovery
(`kills`), the torchrun and torchft peers (`baselines`), a torchrun job of several nodes on any
rendezvous backend (`torchrun`), the simulated agent hosts of the service benchmarks
(`simulated`), and the list of every benchmark, the facets' found through the facet list
(`catalog`)."""

REPRODUCE = """\
```bash
.venv/bin/pip install -q -c constraints-dev.txt -e '.[dev,bench]'   # bench adds torchft-nightly (cp311)
.venv/bin/python -m benchmarks --quick --json bench.json            # all of them, smaller sizes
.venv/bin/python -m benchmarks eventlog fold healthy_set            # full sizes, a few at a time
.venv/bin/python -m benchmarks --help
# record a run and regenerate this page (and, for a scale run, its picture):
.venv/bin/python -m benchmarks NAME... --json docs/benchmark-runs/YYYY-MM-DD-NAME.json
.venv/bin/{regenerate}
.venv/bin/{replot}
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
    "reconfigure": """\
A cycle's recovery varies from about 5 to 60 ms on the shared machine, for both paths alike,
so only a long run tells them apart: runs of 10 and 30 cycles within one hour gave ratios from
0.52x to 1.33x. Over 60 cycles the two recover equally fast on a CPU (building a gloo backend
costs little next to the rendezvous both paths make through the store, and reconfiguring adds
a round of handles through it), and the fresh path stays the default; docs/dataplane.md says
why, and what is not measured (`nccl2`, on a GPU).""",
    "budget": """\
Reading the phases: each is the gap between two marks on the machine's wall clock; the
benchmark's own marks (proposal or SIGKILL sent), the log's `ts` (trigger record, ACKs; the
view's `ts` is its last ACK's), and the workers' (new view installed by the agent, first
successful all_reduce on it). `-> first ACK appended` holds the fold, the prepare pushed through
the launcher's relay to the agent, the agent's ACK back through the relay and its durable
append; `-> new view held by every agent` is the commit pushed to the slowest agent; the last
phase is the survivors' new gloo group and the workers' 5 ms pause between steps. The floors
say what one durable append and one channel round trip cost in the same run: a phase many
times their sum is time spent waiting or in Python, not in the disk or the network.""",
    "data": """\
What is promised (exactly once per epoch, by the fold's accounting), the plan and the sampler are
in [data.md](data.md), which shows this table too.""",
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
How the costs grow with N (the picture divides each figure by its value at 1,024 ranks, from
the table's run; `python -m benchmarks.report --plot` draws it, see "How to reproduce"):

![each scale figure against N, beside a constant and N itself](scale-growth.svg)

Bytes to agents per view change are constant per rank (the deltas of one rank lost, pushed once per
host's channel; the largest report and update at 65,536 ranks are bounded by
`tests/scale/test_limits.py`); log bytes per rank-hour fall with N, since a shared heartbeat record
costs its fixed overhead plus a rank set (a bitmap of the group at most); coordinator memory grows
far slower than N (its fixed part dominates); coordinator CPU per heartbeat is constant, a little
lower at larger N, where the fixed work of a second (a snapshot now and then, the flush of the
shared records) is shared by more beats. Per heartbeat it is a host's message on its channel (a
WebSocket frame of 8 beats: its header and mask, then the batch decoded and checked), the host's
work for the batch (one input for its beats, each checked by one test, the shared record's append,
the answer), and the log's writer thread. Formation and the view change grow about linearly: every
rank joins, reports and ACKs once, and every host gets each push once; the view change somewhat
faster, since at 16,384 ranks the heartbeats (16,384 a second) take a larger share of both
processes' cores while it runs. The simulated agents (N real agent machines in the benchmark's
process, on the same two cores) spend about as much CPU over a view change as the coordinator: each
view change's wall time is bounded by the two together (`coordinator_cpu_s` is the coordinator's
part). How fast the machine ran is in the run line (`reference_ms`).""",
}


def bench_names() -> list[str]:
    """Every benchmark of foldplane, as ``python -m benchmarks`` lists them: the modules of
    ``benchmarks/`` and those the facets of foldplane declare (``benchmarks.kit.catalog``)."""
    return list(benchmarks())


def describe(name: str) -> str:
    """The benchmark module's docstring as markdown, read without importing the module."""
    doc = ast.get_docstring(ast.parse(source(benchmarks()[name]).read_text())) or ""
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
        REPRODUCE.format(regenerate=REGENERATE, replot=REPLOT),
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
        if name == "budget" and name in chosen:
            out += ["", *budget_shares([r for r in chosen[name]["results"] if r["bench"] == name])]
    return "\n".join(out) + "\n"


def budget_shares(rows: list[dict]) -> list[str]:
    """Where the milliseconds go, from the budget rows: per scenario (the metric's text before
    ``": "``), its total and each phase's share of it, largest first."""
    scenarios: dict[str, dict[str, float]] = {}
    for r in rows:
        scenario, sep, phase = r["metric"].partition(": ")
        if sep:
            scenarios.setdefault(scenario, {})[phase] = r["median"]
    out = []
    for scenario, got in scenarios.items():
        total = got.pop("total", None)
        if not total:
            continue
        shares = sorted(got.items(), key=lambda kv: -kv[1])
        parts = ", ".join(
            f"{cell(phase.split(' -> ')[-1])} {num(ms)} ms ({ms / total:.0%})"
            for phase, ms in shares
        )
        out.append(
            f"- **{cell(scenario)}**, {num(total)} ms (medians, so the shares need not add "
            f"up to 100%), by the mark each phase ends at: {parts}."
        )
    return out


#: The scale rows the growth picture draws: (metric prefix, label, colour).
GROWTH_ROWS = (
    ("formation", "formation", "#1f77b4"),
    ("view change", "view change", "#d62728"),
    ("coordinator cpu per heartbeat", "cpu per heartbeat", "#2ca02c"),
    ("bytes to agents per view change", "bytes per view change", "#9467bd"),
    ("log bytes per rank-hour", "log bytes per rank-hour", "#8c564b"),
    ("coordinator rss", "coordinator rss", "#ff7f0e"),
)


def growth_svg(runs: list[dict]) -> str:
    """How each scale row grows with N in the newest scale run: every figure divided by its
    value at the smallest N, on log scales, beside the lines of a constant and of N."""
    chosen = newest_runs(runs).get("scale")
    if chosen is None:
        raise SystemExit("no run of the scale benchmark to draw")
    series: dict[str, dict[int, float]] = {}
    for r in chosen["results"]:
        found = re.fullmatch(r"(.+) (\d+) ranks", r["metric"])
        if r["bench"] == "scale" and found and r["median"] == r["median"]:  # not NaN
            series.setdefault(found.group(1), {})[int(found.group(2))] = float(r["median"])
    # the sizes that more than one row measures (256 ranks has the view change rows alone)
    measured = [n for values in series.values() for n in values]
    sizes = sorted({n for n in measured if measured.count(n) > 1})
    if len(sizes) < 2:
        raise SystemExit("the newest scale run has fewer than two group sizes to draw")
    width, height, left, right, top, bottom = 600, 300, 56, 200, 28, 40
    lo, hi = -5.0, 5.0  # log2 of the growth: 1/32 to 32 times

    def x(n: int) -> float:
        span = math.log2(sizes[-1] / sizes[0])
        return left + (width - left - right) * math.log2(n / sizes[0]) / span

    def y(growth: float) -> float:
        g = min(max(math.log2(growth), lo), hi)
        return top + (height - top - bottom) * (hi - g) / (hi - lo)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="16" font-size="12">scale: each figure at N / at N = '
        f"{sizes[0]:,} ({chosen['run']['date']})</text>",
    ]
    for g in range(int(lo), int(hi) + 1):
        out.append(
            f'<line x1="{left}" y1="{y(2**g):.1f}" x2="{width - right}" y2="{y(2**g):.1f}" '
            'stroke="#eee"/>'
        )
        label = f"{2**g:g}x" if g >= 0 else f"1/{2**-g:g}"
        out.append(f'<text x="{left - 6}" y="{y(2**g) + 4:.1f}" text-anchor="end">{label}</text>')
    for n in sizes:
        out.append(
            f'<text x="{x(n):.1f}" y="{height - bottom + 16}" text-anchor="middle">N = {n:,}</text>'
        )
    for ref, label in ((lambda n: n / sizes[0], "∝ N"), (lambda n: 1.0, "constant")):
        points = " ".join(f"{x(n):.1f},{y(ref(n)):.1f}" for n in sizes)
        out.append(
            f'<polyline points="{points}" fill="none" stroke="#999" stroke-dasharray="4,3"/>'
        )
        middle = sizes[len(sizes) // 2]
        out.append(
            f'<text x="{x(middle) - 4:.1f}" y="{y(ref(middle)) - 5:.1f}" fill="#777" '
            f'text-anchor="end">{label}</text>'
        )
    labels: list[tuple[float, str, str]] = []
    for prefix, label, colour in GROWTH_ROWS:
        values = series.get(prefix, {})
        drawn = [n for n in sizes if n in values and values[n] > 0]
        if len(drawn) < 2 or drawn[0] != sizes[0]:
            continue
        base = values[drawn[0]]
        points = " ".join(f"{x(n):.1f},{y(values[n] / base):.1f}" for n in drawn)
        out.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"/>')
        growth = values[drawn[-1]] / base
        labels.append((y(growth), f"{label} x{growth:.2g}", colour))
    at = -1e9
    for ly, text, colour in sorted(labels):  # keep the labels at the right from overlapping
        at = max(ly + 4, at + 13)
        out.append(f'<text x="{width - right + 8}" y="{at:.1f}" fill="{colour}">{text}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


#: The command that regenerates the figures docs/data.md shows (the block between the markers).
REFIGURE = "python -m benchmarks.report --figures data docs/data.md docs/benchmark-runs/*.json"


def _markers(name: str) -> tuple[str, str]:
    return (
        f"<!-- The figures of `{name}`, generated from its newest run by "
        f"`python -m benchmarks.report --figures {name} PAGE RUN.json...`. Do not edit by hand. -->",
        f"<!-- End of the figures of `{name}`. -->",
    )


def figures(name: str, runs: list[dict]) -> str:
    """The newest run of benchmark ``name`` as a page of docs/ shows it: its run line and its
    table, between the markers :func:`with_figures` looks for."""
    chosen = newest_runs(runs).get(name)
    begin, end = _markers(name)
    if chosen is None:
        body = ["No run of it is recorded in [benchmark-runs/](benchmark-runs/) yet."]
    else:
        body = [run_line(chosen), ""]
        body += table([r for r in chosen["results"] if r["bench"] == name])
    return "\n".join([begin, "", *body, "", end])


def with_figures(page: str, name: str, runs: list[dict]) -> str:
    """``page`` with its block of ``name``'s figures rendered anew from ``runs``."""
    begin, end = _markers(name)
    head, sep, rest = page.partition(begin)
    if not sep or end not in rest:
        raise SystemExit(
            f"the page has no block of figures of {name!r} (markers {begin!r} .. {end!r})"
        )
    return head + figures(name, runs) + rest.split(end, 1)[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__)
    p.add_argument("runs", nargs="+", metavar="RUN.json", type=Path)
    p.add_argument("--check", metavar="FILE", type=Path, help="compare with FILE, do not print")
    p.add_argument("--plot", metavar="FILE", type=Path, help="write the scale growth picture")
    p.add_argument(
        "--figures",
        nargs=2,
        metavar=("NAME", "PAGE"),
        help="rewrite the block of NAME's figures in PAGE (e.g. data docs/data.md)",
    )
    args = p.parse_args(argv)
    if args.figures is not None:
        name, page = args.figures[0], Path(args.figures[1])
        page.write_text(with_figures(page.read_text(), name, [load(path) for path in args.runs]))
        return 0
    if args.plot is not None:
        args.plot.write_text(growth_svg([load(path) for path in args.runs]))
        return 0
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
