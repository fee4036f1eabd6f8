"""``python -m benchmarks NAME... [--quick] [--json FILE]`` — run benchmarks, print medians."""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import sys
import time

from foldplane.benchmarks.harness import Result, machine_reference_ms, print_table, write_json
from foldplane.benchmarks.kit.catalog import benchmarks
from foldplane.coordinator.fold.registry import FACETS_ENV


def available() -> list[str]:
    """Every benchmark: a module of ``benchmarks/`` (``benchmarks.kit``, a package, is what
    they share) or one a facet declares in its folder (``benchmarks.kit.catalog``)."""
    return list(benchmarks(os.environ.get(FACETS_ENV)))


def main(argv: list[str] | None = None) -> int:
    modules = benchmarks(os.environ.get(FACETS_ENV))
    names = list(modules)
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    p.add_argument(
        "names", nargs="*", metavar="NAME", help=f"benchmarks to run (default: all of {names})"
    )
    p.add_argument(
        "--quick", action="store_true", help="smaller sizes; about a minute per benchmark"
    )
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = p.parse_args(argv)
    chosen = args.names or names
    unknown = [n for n in chosen if n not in names]
    if unknown:
        p.error(f"unknown benchmark(s) {unknown}; available: {names}")
    run = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%MZ"),
        # what was run, not where it was saved: the JSON file's own path stays out of it
        "command": " ".join(
            ["python -m benchmarks", *args.names, *(["--quick"] if args.quick else [])]
        ),
        "quick": args.quick,
        "load_average": round(os.getloadavg()[0], 1),
        "reference_ms": [round(machine_reference_ms(), 2)],
    }
    results: list[Result] = []
    for name in chosen:
        mod = importlib.import_module(modules[name])
        t0 = time.monotonic()
        print(f"# {name} ...", file=sys.stderr, flush=True)
        got = mod.run(quick=args.quick)
        print(f"# {name} took {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
        results.extend(got)
    run["reference_ms"].append(round(machine_reference_ms(), 2))
    print_table(results)
    print(
        f"# machine reference (benchmarks.harness.machine_reference_ms): "
        f"{run['reference_ms'][0]} ms at the start, {run['reference_ms'][1]} ms at the end",
        file=sys.stderr,
    )
    if args.json:
        write_json(args.json, results, run)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
