"""``docs/torch-compat.md`` from the recorded runs of torch's backend suite.

    python -m tests.torch_suite.report --write      # regenerate the page
    python -m tests.torch_suite.report --check      # exit 1 if the page differs from its runs

The runs are ``docs/torch-compat-runs/<backend>-<world>.json``, as ``python -m tests.torch_suite``
writes them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "docs" / "torch-compat-runs"
PAGE = ROOT / "docs" / "torch-compat.md"
REGENERATE = "python -m tests.torch_suite.report --write"
RECORD = "python -m tests.torch_suite --backend {backend} --world {world} --out {out}"


def load_runs(folder: Path = RUNS) -> list[dict[str, Any]]:
    runs = [json.loads(p.read_text()) | {"file": p.name} for p in sorted(folder.glob("*.json"))]
    return sorted(runs, key=lambda r: (r["world_size"], r["backend"] != "gloo"))


def outcomes(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["test"]: t for t in run["tests"]}


def counts(run: dict[str, Any]) -> dict[str, int]:
    out = {"passed": 0, "failed": 0, "skipped": 0}
    for t in run["tests"]:
        out[t["outcome"]] += 1
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").strip()


def _why(t: dict[str, Any]) -> str:
    detail = _cell(t.get("detail", ""))
    if t.get("skipped_by"):
        detail += f" (skipped by `{_cell(t['skipped_by'])}`)"
    if t.get("declared"):
        detail += f" (declared: `{_cell(t['declared'])}`)"
    if t.get("gates"):
        detail += f" (gates read as for {t['gates']})"
    return detail


def render(runs: list[dict[str, Any]]) -> str:
    by_world: dict[int, dict[str, dict[str, Any]]] = defaultdict(dict)
    for run in runs:
        by_world[run["world_size"]][run["backend"]] = run
    first = runs[0]
    lines = [
        "# torch's backend suite on foldplane",
        "",
        "torch ships the conformance suite of its process-group backends: "
        "`DistributedTest._DistTestBase` in "
        "`torch/testing/_internal/distributed/distributed_test.py` "
        f"({first['of']} tests in torch {first['torch']}). `tests/torch_suite/` runs it on "
        '`"foldplane"` (gloo underneath) and, as the reference, on gloo itself, the way '
        "torch's own runner does: one process per rank, `init_process_group(backend=BACKEND)`, "
        "the suite's barrier around each test. For foldplane a real coordinator serves the "
        "run, each test gets a group of its own, and each rank's agent joins it and waits for "
        "the first committed view before the test starts.",
        "",
        "This page is rendered from the recorded runs in "
        f"[torch-compat-runs/](torch-compat-runs/); regenerate it with `{REGENERATE}`. "
        "A run is recorded with "
        f"`{RECORD.format(backend='foldplane', world=2, out='docs/torch-compat-runs/foldplane-2.json')}`. "
        "The slow test `tests/torch_suite/test_torch_suite.py` runs foldplane again and checks "
        "that every test gloo passes in these runs passes on foldplane too, unless foldplane "
        "declares it unsupported (below, each with its reason).",
        "",
        "The tests the suite keeps for gloo by name (`BACKEND != 'gloo'`: timeouts, coalesced "
        "all-reduce, `get_future`, sparse all-reduce, ...) run on foldplane too, with the "
        'suite\'s `BACKEND` reading gloo while every rank initialises `"foldplane"` '
        "(foldplane runs gloo underneath); their rows say *gates read as for gloo*. The ranks "
        "are forked from the harness rather than spawned as in torch's runner, so that a test "
        "does not import torch again per rank.",
        "",
        "## Counts",
        "",
        "| processes | tests | gloo passed | foldplane passed | gloo failed | foldplane failed "
        "| gloo skipped | foldplane skipped |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for world, pair in sorted(by_world.items()):
        g = counts(pair["gloo"]) if "gloo" in pair else None
        f = counts(pair["foldplane"]) if "foldplane" in pair else None
        sel = next(iter(pair.values()))["selected"]
        row = [str(world), str(sel)]
        for key in ("passed", "failed", "skipped"):
            row += [str(g[key]) if g else "–", str(f[key]) if f else "–"]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    if any(r["selected"] != r["of"] for r in runs):
        lines += ["A run with fewer tests than the suite holds ran a chosen subset.", ""]
    lines += ["## Where foldplane and gloo differ", ""]
    for world, pair in sorted(by_world.items()):
        if "gloo" not in pair or "foldplane" not in pair:
            continue
        g, f = outcomes(pair["gloo"]), outcomes(pair["foldplane"])
        differ = [n for n in sorted(set(g) & set(f)) if g[n]["outcome"] != f[n]["outcome"]]
        lines += [f"### {world} processes", ""]
        if not differ:
            lines += ["Every test has the same outcome on both.", ""]
            continue
        lines += ["| test | gloo | foldplane | why |", "|---|---|---|---|"]
        for n in differ:
            why = _why(f[n]) if f[n]["outcome"] != "passed" else _why(g[n])
            lines.append(f"| `{n}` | {g[n]['outcome']} | {f[n]['outcome']} | {why} |")
        lines.append("")
    decl = next((r["declarations"] for r in runs if r["backend"] == "foldplane"), {})
    has = next((r.get("has", {}) for r in runs if r["backend"] == "foldplane"), {})
    lines += [
        "## What foldplane declares",
        "",
        'The harness adds `"foldplane"` to torch\'s `DistTestCases` sets before the suite is '
        "imported (`tests/torch_suite/declared.py`). It has these features:",
        "",
        "| `backend_feature` | why |",
        "|---|---|",
        *(f"| `{_cell(k)}` | {_cell(v)} |" for k, v in has.items()),
        "",
        "and declares these unsupported, each with the tests it makes the suite skip (or, "
        "for `refused[...]`, the test that fails because torch itself refuses the backend):",
        "",
        "| declaration | reason | tests |",
        "|---|---|---|",
    ]
    for name, reason in decl.items():
        skipped = sorted(
            {
                t["test"]
                for r in runs
                if r["backend"] == "foldplane"
                for t in r["tests"]
                if name in (t.get("skipped_by"), t.get("declared"))
            }
        )
        names = ", ".join(f"`{n}`" for n in skipped) or "none"
        lines.append(f"| `{_cell(name)}` | {_cell(reason)} | {names} |")
    lines += [
        "",
        "## Beyond the suite: `dist.split_group`",
        "",
        "The suite has no test of `dist.split_group`. torch refuses it before any group is "
        "reached unless the default group is bound to a device (`init_process_group(..., "
        "device_id=...)`) and an accelerator is present: on this CPU build every backend gets "
        '"No device associated with the default pg, not safe to split any process groups", '
        "gloo included. `tests/agent/test_dist.py::"
        "test_init_process_group_foldplane_and_every_dist_collective` checks that foldplane's "
        "ranks get the same answer as a plain gloo default group. With a GPU, torch then asks "
        "the parent's backend whether it supports splitting; foldplane's group has not been "
        "run there (no GPU in this project's CI), so `split_group` on a foldplane group is "
        "unsupported for now. `dist.new_group` over the same ranks works everywhere "
        "(`subgroup` above).",
        "",
        "## torch versions",
        "",
        "foldplane requires `torch>=2.11,<2.14` (pyproject.toml): the versions it is tested with.",
        "",
        "| torch | where | what runs |",
        "|---|---|---|",
        "| 2.13.0+cpu | CI and the development machines (`constraints-dev.txt`) | the default "
        "and slow suites, this page's runs of torch's backend suite |",
        "| 2.11.0+cu130 (NCCL 2.28.9) | the GPU machine | `tests/gpu` and `python -m benchmarks "
        "gpu` through `scripts/gpu-check` ([gpu.md](gpu.md)); no run is recorded yet in "
        "[gpu-runs/](gpu-runs/) |",
        "",
        "## Every test that did not pass",
        "",
        "Grouped by the first line of the error, or the reason of the skip.",
        "",
    ]
    for run in runs:
        lines += [
            f"### {run['backend']}, {run['world_size']} processes",
            "",
            f"From [{run['file']}](torch-compat-runs/{run['file']}) "
            f"(started {run['started']}, {run['timeout_s']} s per test).",
            "",
            "| outcome | why | tests |",
            "|---|---|---|",
        ]
        groups: dict[tuple[str, str], list[str]] = defaultdict(list)
        for t in run["tests"]:
            if t["outcome"] != "passed":
                groups[(t["outcome"], _why(t))].append(t["test"])
        for (outcome, why), names in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
            listed = ", ".join(f"`{n}`" for n in sorted(names))
            lines.append(f"| {outcome} ({len(names)}) | {why} | {listed} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.torch_suite.report", description=__doc__)
    p.add_argument("--runs", type=Path, default=RUNS)
    p.add_argument("--page", type=Path, default=PAGE)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help="write the page")
    g.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    args = p.parse_args(argv)
    text = render(load_runs(args.runs))
    if args.write:
        args.page.write_text(text)
    elif args.check:
        if not args.page.exists() or args.page.read_text() != text:
            print(f"{args.page} differs from its runs; regenerate: {REGENERATE}", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
