"""``docs/torch-compat.md`` from the recorded runs of torch's backend suite and of the suites on
other torch releases.

    python -m tests.torch_suite.report --write      # regenerate the page
    python -m tests.torch_suite.report --check      # exit 1 if the page differs from its runs

The backend suite's runs are ``docs/torch-compat-runs/<torch>/<backend>-<world>.json``, as
``python -m tests.torch_suite`` writes them (one folder per torch version: the slow test compares
foldplane with the gloo run of the torch it runs on). The suites' runs on other torch releases
are ``docs/torch-runs/*.json``, as ``scripts/torch-run`` writes them.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "docs" / "torch-compat-runs"
TORCH_RUNS = ROOT / "docs" / "torch-runs"
PAGE = ROOT / "docs" / "torch-compat.md"
REGENERATE = "python -m tests.torch_suite.report --write"
RECORD = (
    "python -m tests.torch_suite --backend {backend} --world {world} "
    "--out docs/torch-compat-runs/{torch}/{backend}-{world}.json"
)


def torch_key(version: str) -> tuple[int, ...]:
    """``2.14.1`` and ``2.13.0+cpu`` in release order."""
    return tuple(int(n) for n in re.findall(r"\d+", version.split("+")[0])[:3])


def run_path(torch: str, backend: str, world: int, folder: Path = RUNS) -> Path:
    return folder / torch / f"{backend}-{world}.json"


def load_runs(folder: Path = RUNS) -> list[dict[str, Any]]:
    runs = [
        json.loads(p.read_text()) | {"file": f"{p.parent.name}/{p.name}"}
        for p in sorted(folder.glob("*/*.json"))
    ]
    return sorted(
        runs, key=lambda r: (torch_key(r["torch"]), r["world_size"], r["backend"] != "gloo")
    )


def load_torch_runs(folder: Path = TORCH_RUNS) -> list[dict[str, Any]]:
    runs = [json.loads(p.read_text()) | {"file": p.name} for p in sorted(folder.glob("*.json"))]
    return sorted(runs, key=lambda r: r["date"])


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


def render(runs: list[dict[str, Any]], torch_runs: list[dict[str, Any]] | None = None) -> str:
    by_torch: dict[str, dict[int, dict[str, dict[str, Any]]]] = defaultdict(
        lambda: defaultdict(dict)
    )
    for run in runs:
        by_torch[run["torch"]][run["world_size"]][run["backend"]] = run
    versions = sorted(by_torch, key=torch_key)
    newest = versions[-1]
    first = next(r for r in runs if r["torch"] == newest)
    named = " and ".join(f"torch {v}" for v in versions)
    lines = [
        "# torch's backend suite on foldplane",
        "",
        "torch ships the conformance suite of its process-group backends: "
        "`DistributedTest._DistTestBase` in "
        "`torch/testing/_internal/distributed/distributed_test.py` "
        f"({first['of']} tests in torch {newest}). `tests/torch_suite/` runs it on "
        '`"foldplane"` (gloo underneath) and, as the reference, on gloo itself, the way '
        "torch's own runner does: one process per rank, `init_process_group(backend=BACKEND)`, "
        "the suite's barrier around each test. For foldplane a real coordinator serves the "
        "run, each test gets a group of its own, and each rank's agent joins it and waits for "
        "the first committed view before the test starts.",
        "",
        "This page is rendered from the recorded runs in "
        f"[torch-compat-runs/](torch-compat-runs/), one folder per torch version ({named} "
        f"here), and `docs/torch-runs/`; regenerate it with `{REGENERATE}`. "
        "A run is recorded with "
        f"`{RECORD.format(backend='foldplane', world=2, torch=newest)}`. "
        "The slow test `tests/torch_suite/test_torch_suite.py` runs foldplane again and checks "
        "that every test gloo passes in the runs of the torch it runs on passes on foldplane "
        "too, unless foldplane declares it unsupported (below, each with its reason).",
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
        "| torch | processes | tests | gloo passed | foldplane passed | gloo failed "
        "| foldplane failed | gloo skipped | foldplane skipped |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for version in versions:
        for world, pair in sorted(by_torch[version].items()):
            g = counts(pair["gloo"]) if "gloo" in pair else None
            f = counts(pair["foldplane"]) if "foldplane" in pair else None
            sel = next(iter(pair.values()))["selected"]
            row = [version, str(world), str(sel)]
            for key in ("passed", "failed", "skipped"):
                row += [str(g[key]) if g else "–", str(f[key]) if f else "–"]
            lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    if any(r["selected"] != r["of"] for r in runs):
        lines += ["A run with fewer tests than the suite holds ran a chosen subset.", ""]
    lines += ["## Where foldplane and gloo differ", ""]
    for version in versions:
        for world, pair in sorted(by_torch[version].items()):
            if "gloo" not in pair or "foldplane" not in pair:
                continue
            g, f = outcomes(pair["gloo"]), outcomes(pair["foldplane"])
            differ = [n for n in sorted(set(g) & set(f)) if g[n]["outcome"] != f[n]["outcome"]]
            lines += [f"### torch {version}, {world} processes", ""]
            if not differ:
                lines += ["Every test has the same outcome on both.", ""]
                continue
            lines += ["| test | gloo | foldplane | why |", "|---|---|---|---|"]
            for n in differ:
                why = _why(f[n]) if f[n]["outcome"] != "passed" else _why(g[n])
                lines.append(f"| `{n}` | {g[n]['outcome']} | {f[n]['outcome']} | {why} |")
            lines.append("")
    lines += _changes(by_torch, versions)
    newest_runs = [r for r in runs if r["torch"] == newest]
    newest_foldplane = [r for r in reversed(runs) if r["backend"] == "foldplane"][:1]
    decl = next((r["declarations"] for r in newest_foldplane), {})
    has = next((r.get("has", {}) for r in newest_foldplane), {})
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
        "device_id=...)`) and an accelerator is present: on a CPU every backend gets "
        '"No device associated with the default pg, not safe to split any process groups", '
        "gloo included (torch 2.13 and 2.14 alike). `tests/agent/test_dist.py::"
        "test_init_process_group_foldplane_and_every_dist_collective` checks that foldplane's "
        "ranks get the same answer as a plain gloo default group. With a GPU, torch then asks "
        "the parent's backend whether it supports splitting; foldplane's group has not been "
        "run there (no GPU in this project's CI), so `split_group` on a foldplane group is "
        "unsupported for now. `dist.new_group` over the same ranks works everywhere "
        "(`subgroup` above).",
        "",
        *VERSIONS.splitlines(),
        "",
        *_torch_runs(torch_runs or []),
        "## Every test that did not pass",
        "",
        f"On torch {newest}, grouped by the first line of the error, or the reason of the skip "
        "(the other versions' are in their runs' files).",
        "",
    ]
    for run in newest_runs:
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


def _changes(by_torch: dict, versions: list[str]) -> list[str]:
    """Each test whose outcome on one backend changed from one torch version to the next."""
    lines: list[str] = []
    for old, new in zip(versions, versions[1:], strict=False):
        lines += [f"## From torch {old} to {new}", ""]
        for world in sorted(set(by_torch[old]) & set(by_torch[new])):
            for backend in ("gloo", "foldplane"):
                if backend not in by_torch[old][world] or backend not in by_torch[new][world]:
                    continue
                a = outcomes(by_torch[old][world][backend])
                b = outcomes(by_torch[new][world][backend])
                lines += [f"### {backend}, {world} processes", ""]
                only = sorted(set(a) ^ set(b))
                if only:
                    lines += [
                        "In one version's suite only: "
                        + ", ".join(f"`{n}` ({old if n in a else new})" for n in only)
                        + ".",
                        "",
                    ]
                changed = [n for n in sorted(set(a) & set(b)) if a[n]["outcome"] != b[n]["outcome"]]
                if not changed:
                    lines += ["Every test has the same outcome on both.", ""]
                    continue
                lines += [f"| test | {old} | {new} | why |", "|---|---|---|---|"]
                for n in changed:
                    why = _why(b[n]) if b[n]["outcome"] != "passed" else _why(a[n])
                    lines.append(f"| `{n}` | {a[n]['outcome']} | {b[n]['outcome']} | {why} |")
                lines.append("")
    return lines


def _torch_runs(records: list[dict[str, Any]]) -> list[str]:
    """The table of ``scripts/torch-run``'s recorded runs."""
    lines = [
        "### Recorded runs on other releases",
        "",
        "`scripts/torch-run VERSION` builds an environment with that torch from the package "
        "registry and runs the default suite (and torch's reconfigure contract, "
        "`tests/torch_suite/test_reconfigure.py`, where it exists); it records the run in "
        "`docs/torch-runs/`.",
        "",
    ]
    if not records:
        return [*lines, "No run is recorded yet.", ""]
    lines += [
        "| date (UTC) | commit | torch | NCCL | Python | foldplane's install | run | passed "
        "| failed | error | skipped | seconds | failures |",
        "|---|---|---|---|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for rec in records:
        v = rec["versions"]
        for r in rec["runs"]:
            c = r["counts"]
            failures = ", ".join(f"`{f['test']}`" for f in r["failures"]) or "none"
            if r.get("cut_at_limit_s"):
                failures += f" (cut at {r['cut_at_limit_s']:.0f} s)"
            install = rec.get("install")
            kept = (
                f"kept torch {install['torch_after_foldplane']}"
                if install and install["torch_after_foldplane"] == install["torch_before_foldplane"]
                else ("replaced torch" if install else "–")
            )
            lines.append(
                f"| [{rec['date'][:10]} {rec['date'][11:16]}](torch-runs/{rec['file']}) "
                f"| {rec.get('commit', '')[:7] or '–'} | {v['torch']} "
                f"| {v.get('nccl') or '–'} | {v['python']} | {kept} | {r['run']} | {c['passed']} "
                f"| {c['failed']} | {c['error']} | {c['skipped']} | {r['seconds']:.0f} "
                f"| {failures} |"
            )
    return [*lines, ""]


#: The page's section on torch versions (what ran where, what each version gives).
VERSIONS = """\
## torch versions

foldplane asks for `torch>=2.11` (pyproject.toml) with no upper bound, so installing it never
replaces the torch an environment already has: in the default suite, on torch 2.14.1 and
2.13.0 alike, `pip install --dry-run --report` of the checkout into the suite's own environment
would install no torch
(`tests/test_install.py::test_pip_would_install_foldplane_beside_the_torch_this_environment_has`);
in the slow suite, foldplane's wheel installed by a plain `pip install` into a new environment
holding torch 2.14.1 leaves it there
(`tests/test_install.py::test_the_wheel_keeps_the_users_torch_and_a_users_own_modules_do_not_break_it`);
and `scripts/torch-run` checks the same for the release it runs (below).
It is tested with torch 2.11 through 2.15 (`foldplane.agent.torch_range.TESTED`): 2.13 and
2.14 in CI; 2.11, 2.12 and 2.15 in recorded runs (below). A worker
with a torch outside that range runs, and gets one warning per process when foldplane's data
plane (`foldplane.agent.dataplane`: what an `Agent`'s process group and
`init_process_group("foldplane")` load, the first foldplane module that imports torch) is
imported:

```
TorchVersionWarning: foldplane is tested with torch 2.11 through 2.15, and torch 2.16.0 is
installed: it may work, but no suite has run on it (docs/torch-compat.md#torch-versions)
```

(`tests/test_torch_range.py`; `warnings.filterwarnings("ignore", category=TorchVersionWarning)`
silences it).

| torch | where | what runs |
|---|---|---|
| 2.14.1 (the CUDA build, NCCL 2.30.7, run on the CPU) | CI and the development machines: the README's `.venv` (`constraints-dev.txt`) | the default and slow suites (the slow suite runs the demo, `tests/agent/test_demo.py`, and the examples, `tests/agent/test_example.py`, `tests/fsdp/test_example.py`, `tests/agent/test_torchrun.py`); torch's backend suite (this page) |
| 2.13.0+cpu | CI: `.venv-2.13` (`constraints-2.13.txt`) | the default suite; torch's backend suite (this page) |
| 2.15.0 | `scripts/torch-run 2.15.0`, by hand (it downloads about 4 GB; never in CI) | foldplane's install beside it, the default suite and torch's reconfigure contract ([recorded runs](#recorded-runs-on-other-releases)) |
| 2.11.0, 2.12.1 | `scripts/torch-run 2.11.0`, `scripts/torch-run 2.12.1`, by hand (about 4 GB each) | foldplane's install beside it and the default suite ([recorded runs](#recorded-runs-on-other-releases)); torch's reconfigure contract is skipped there (no reconfigure API before 2.14) |
| 2.11.0+cu130 (NCCL 2.28.9) | the GPU machine | `tests/gpu` and `python -m benchmarks gpu` through `scripts/gpu-check` ([gpu.md](gpu.md)); no run is recorded yet in [gpu-runs/](gpu-runs/) |

### What each version gives

| torch | what changes for foldplane |
|---|---|
| 2.14 | torch's reconfigure API (`init_process_group(..., enable_reconfigure=True)`, `dist._supports_reconfigure`, `dist._get_reconfigure_handle`, `dist._reconfigure`; gloo and `nccl2` implement it); before 2.14 none of it exists. |
| 2.14 | C++ calls a Python process group's own `reduce`, `gather`, `scatter`, `alltoall`, `recvAnysource`, `start_coalescing`/`end_coalescing`, `all_gather_single` and `reduce_scatter_single` (2.13 called only `allreduce`, `allgather`, `broadcast`, `reduce_scatter`, `send`, `recv`, `barrier` and the coalesced ones): see [C++ callers on torch 2.14](#c-callers-on-torch-214). |
| 2.14 | `dist.all_gather_single` and `dist.reduce_scatter_single` are the new names of `all_gather_into_tensor` and `reduce_scatter_tensor` (the old ones still work and call the new). |
| 2.15 | nothing foldplane uses changes (the recorded run below). |

### C++ callers on torch 2.14

torch 2.14's C++ `ProcessGroup` hands these calls to a Python group's own methods, where 2.13
sent them to a C++ backend that a Python group does not have ("No backend type associated with
device type cpu"). Each of foldplane's returns a real `Work` (a None would reach C++ as a null
one) with global ranks and the view's holes as in the Python calls
([dataplane.md](dataplane.md#operations-and-ranks)). `tests/dataplane/test_cpp_overrides.py`
calls each through C++ on torch 2.14; `tests/dataplane/test_torch_callers.py` runs torch's own
callers on a registered group across processes, on 2.13 and 2.14.

| the group's method | what reaches it from C++ on torch 2.14 | torch 2.13 |
|---|---|---|
| `reduce`, `gather`, `scatter` | the C++ method (`dist.ProcessGroup.reduce(pg, ...)`, and any C++ holder of the group) | not reached from C++; `dist.reduce`, `dist.gather`, `dist.scatter` call the Python method on both |
| `all_gather_single`, `reduce_scatter_single` | the C++ method; functional collectives' `all_gather_into_tensor_out` | not reached from C++; `dist.all_gather_into_tensor` and `dist.reduce_scatter_tensor` call the Python method on both |
| `alltoall` | the C++ method; `dist.all_to_all` calls it from Python | `dist.all_to_all` (Python) |
| `recvAnysource` (C++'s name; `recv_anysource` is the same method) | the C++ method. What comes back through C++ answers `wait()` and `get_future()` only (torch's wrapper forwards nothing else), so the sender's rank is for Python callers: `dist.recv(t)` returns it on both | not reached from C++ |
| `start_coalescing`, `end_coalescing` | `_start_coalescing`/`_end_coalescing`: the coalescing manager with a device, and `dist.batch_isend_irecv`, which 2.14 coalesces when the group's `_get_backend(device)` says it does | not reached: the coalescing manager with a device fails on a Python group; `batch_isend_irecv` sends one by one |
| `all_gather_single_coalesced`, `reduce_scatter_single_coalesced`, `all_to_all_single` (2.13's C++ called them too) | functional collectives (`all_gather_tensor`, `reduce_scatter_tensor`, `all_to_all_single`), so DTensor's `full_tensor()` and `redistribute`; the coalescing manager's fast path | the same, under 2.13's names too |
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.torch_suite.report", description=__doc__)
    p.add_argument("--runs", type=Path, default=RUNS)
    p.add_argument("--torch-runs", type=Path, default=TORCH_RUNS)
    p.add_argument("--page", type=Path, default=PAGE)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help="write the page")
    g.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    args = p.parse_args(argv)
    text = render(load_runs(args.runs), load_torch_runs(args.torch_runs))
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
