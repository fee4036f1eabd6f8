"""A facet's benchmarks live in its folder and are found through the facet list
(``benchmarks/kit/catalog.py``): ``python -m benchmarks`` lists and runs them beside the modules
of ``benchmarks/``, under the name its plugin gives, and the kit names no facet."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from foldplane.benchmarks.kit.catalog import benchmarks, source
from tests.service.conftest import ROOT

TOY = {"FOLDPLANE_FACETS": "tests.facets.toy"}


def bench(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args],
        cwd=ROOT,
        env={**{k: v for k, v in os.environ.items() if k != "FOLDPLANE_FACETS"}, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_facets_benchmarks_are_listed_beside_the_kits() -> None:
    found = benchmarks()
    assert found["data"] == "foldplane.facets.epochs.benchmark"  # the epochs facet's
    assert found["refit"] == "foldplane.facets.refits.benchmark"  # the refits facet's
    assert found["fold"] == "foldplane.benchmarks.fold"
    assert (
        source(found["data"]).resolve() == (ROOT / "facets" / "epochs" / "benchmark.py").resolve()
    )
    assert list(found) == sorted(found) and "toy" not in found
    assert benchmarks("tests.facets.toy")["toy"] == "tests.facets.toy.benchmark"


def test_a_deployments_facet_benchmark_runs_with_its_one_line(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    done = bench(["toy", "--quick", "--json", str(out)], TOY)
    assert done.returncode == 0, done.stderr
    rows = json.loads(out.read_text())["results"]
    assert [(r["bench"], r["metric"]) for r in rows] == [("toy", "toy bumps folded per second")]
    assert rows[0]["median"] > 0
    # twin: without the line, no such benchmark
    unknown = bench(["toy", "--quick"], {})
    assert unknown.returncode == 2 and "unknown benchmark(s) ['toy']" in unknown.stderr
