"""The docs cannot drift: generated pages match their data, and every relative link resolves."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from foldplane.benchmarks import report
from foldplane.wire import reference

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _runs() -> list[Path]:
    return sorted((DOCS / "benchmark-runs").glob("*.json"))


def test_benchmarks_page_is_what_its_runs_render() -> None:
    """docs/benchmarks.md is exactly ``python -m benchmarks.report docs/benchmark-runs/*.json``."""
    rendered = report.render([report.load(p) for p in _runs()])
    assert (DOCS / "benchmarks.md").read_text() == rendered, (
        f"docs/benchmarks.md differs from its data; regenerate: {report.REGENERATE}"
    )


def test_data_page_figures_are_what_the_newest_data_run_renders() -> None:
    """docs/data.md's block of figures is exactly what ``report.REFIGURE`` writes into it."""
    page = (DOCS / "data.md").read_text()
    rendered = report.with_figures(page, "data", [report.load(p) for p in _runs()])
    assert rendered == page, f"docs/data.md's figures differ from its data; run: {report.REFIGURE}"


def test_refit_page_figures_are_what_the_newest_refit_run_renders() -> None:
    """docs/refit.md's block of figures is exactly what ``--figures refit`` writes into it."""
    page = (DOCS / "refit.md").read_text()
    rendered = report.with_figures(page, "refit", [report.load(p) for p in _runs()])
    assert rendered == page, (
        "docs/refit.md's figures differ from its data; run: python -m benchmarks.report "
        "--figures refit docs/refit.md docs/benchmark-runs/*.json"
    )


def test_check_mode_says_when_the_page_drifted(tmp_path: Path) -> None:
    page = tmp_path / "benchmarks.md"
    page.write_text((DOCS / "benchmarks.md").read_text().replace("| 314,018 |", "| 314,019 |", 1))
    assert report.main([*map(str, _runs()), "--check", str(page)]) == 1
    page.write_text((DOCS / "benchmarks.md").read_text())
    assert report.main([*map(str, _runs()), "--check", str(page)]) == 0


def test_scale_growth_picture_is_what_the_newest_scale_run_draws() -> None:
    """docs/scale-growth.svg is exactly what ``report.REPLOT`` writes, and the page shows it."""
    drawn = report.growth_svg([report.load(p) for p in _runs()])
    assert (DOCS / "scale-growth.svg").read_text() == drawn, (
        f"docs/scale-growth.svg is stale; redraw: {report.REPLOT}"
    )
    assert "](scale-growth.svg)" in (DOCS / "benchmarks.md").read_text()
    for label in ("view change", "cpu per heartbeat", "bytes per view change", "∝ N"):
        assert label in drawn, label


def test_every_benchmark_has_a_section_with_the_rows_of_its_newest_run() -> None:
    text = (DOCS / "benchmarks.md").read_text()
    for name in report.bench_names():
        assert f"\n## `{name}`\n" in text, name
    chosen = report.newest_runs([report.load(p) for p in _runs()])
    for name, run in chosen.items():
        section = text.split(f"\n## `{name}`\n", 1)[1].split("\n## ", 1)[0]
        assert run["file"] in section, name
        for r in run["results"]:
            if r["bench"] == name:
                assert f"| {r['metric']} |" in section, (run["file"], r["metric"])


def _run(tmp_path: Path, name: str, date: str, median: float) -> Path:
    path = tmp_path / name
    path.write_text(
        json.dumps(
            {
                "run": {"date": date, "command": "python -m benchmarks fold", "quick": False},
                "results": [
                    {"bench": "fold", "metric": "fold throughput", "unit": "records/s",
                     "median": median, "baseline": "b", "baseline_median": median / 2,
                     "ratio": 2.0, "target": ">= 300,000"}
                ],
            }
        )
    )  # fmt: skip
    return path


def test_each_table_comes_from_the_newest_run_of_its_benchmark(tmp_path: Path) -> None:
    new = _run(tmp_path, "b.json", "2026-12-02T10:00Z", 2_000_000)
    old = _run(tmp_path, "a.json", "2026-12-01", 1_000_000)
    text = report.render([report.load(new), report.load(old)])
    assert (
        "| fold throughput | records/s | 2,000,000 | – | b | 1,000,000 | 2.00x | >= 300,000 |"
        in text
    )
    assert "1,000,000 | – | b | 500,000" not in text
    assert "Recorded run: 2026-12-02T10:00Z, full size" in text
    assert "No run of it is recorded" in text  # the benchmarks without a run still have a section


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("not json", "not a readable JSON run file"),
        ('{"results": []}', 'no "run" object with a "date"'),
        ('{"run": {"date": "2026-12-01", "when": 1}, "results": [{}]}', "unknown run fields"),
        ('{"run": {"date": "2026-12-01"}, "results": []}', 'no "results" list'),
        ('{"run": {"date": "2026-12-01"}, "results": [{"bench": "fold"}]}', "result 0 lacks"),
    ],
)
def test_a_bad_run_file_is_named_with_what_is_wrong(
    tmp_path: Path, content: str, says: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(SystemExit, match=says) as err:
        report.load(path)
    assert "bad.json" in str(err.value)


def test_results_of_an_unknown_benchmark_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text('{"run": {"date": "2026-12-01"}, "results": '
                    '[{"bench": "nope", "metric": "m", "unit": "s", "median": 1}]}')  # fmt: skip
    with pytest.raises(SystemExit, match=r"unknown benchmark\(s\) \['nope'\]"):
        report.render([report.load(path)])


# -- links ----------------------------------------------------------------------------------------

LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(path.read_text()).splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if m:
            slug = _slug(m.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _prose(text: str) -> str:
    return re.sub(r"```.*?```", "", text, flags=re.S)


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(_prose(page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target} (no {dest.relative_to(ROOT)})")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.relative_to(ROOT)})")
    assert broken == [], f"{page.relative_to(ROOT)}: {broken}"


# -- figures live in docs/benchmarks.md only -------------------------------------------------------

#: How a run's figures read when they creep into code: a machine named, a time that something took.
RUN_FIGURE = re.compile(
    r"reference (?:machine|VM)|\b2-core\b|this VM|\btook \d|\d ?(?:ms|µs|us) on the\b", re.I
)


def test_code_states_rules_not_a_runs_figures() -> None:
    """Docstrings and comments say what a rule is and why; measured figures are in benchmarks.md."""
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for pkg in ("coordinator", "api", "agent", "eventlog", "wire")
        for path in sorted((ROOT / pkg).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if RUN_FIGURE.search(line)
    ]
    assert found == [], "a run's figures in code (put them in docs/benchmarks.md):\n" + "\n".join(
        found
    )


# -- the architecture picture ----------------------------------------------------------------------


def test_architecture_picture_is_what_its_source_draws() -> None:
    """docs/architecture.svg is exactly what ``python docs/architecture_svg.py`` writes."""
    import runpy

    drawn = runpy.run_path(str(DOCS / "architecture_svg.py"))["draw"]()
    assert (DOCS / "architecture.svg").read_text() == drawn, (
        "docs/architecture.svg is stale; run: python docs/architecture_svg.py"
    )
    assert "](architecture.svg)" in (DOCS / "architecture.md").read_text()
    for layer in ("agent/", "wire/", "api/", "coordinator/host/", "coordinator/fold/", "eventlog/"):
        assert layer in drawn, layer


def test_the_layers_picture_is_the_import_graph() -> None:
    """docs/layers.svg is exactly what ``python docs/layers_svg.py`` draws from the import
    graph as it is now, every module has its box, and no arrow points up a layer."""
    import runpy

    import grimp

    source = runpy.run_path(str(DOCS / "layers_svg.py"))
    pairs = source["edges"]()
    assert (DOCS / "layers.svg").read_text() == source["draw"](pairs), (
        "docs/layers.svg is stale; run: python docs/layers_svg.py"
    )
    assert "](layers.svg)" in (DOCS / "architecture.md").read_text()
    nodes = source["NODES"]
    unplaced = [
        m for m in grimp.build_graph("foldplane").modules
        if m != "foldplane" and source["node_of"](m) is None
    ]  # fmt: skip
    assert unplaced == [], unplaced
    up = [(a, b) for a, b in pairs if nodes[b][3] < nodes[a][3]]
    assert up == [], f"imports up a layer: {up}"


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({"unit": "ms", "median": 4.0, "p99": 12.0, "target": "p50 <= 10 ms"}, "met"),
        ({"unit": "ms", "median": 4.0, "p99": 12.0, "target": "p99 <= 10 ms"}, "**not met**"),
        ({"unit": "s", "median": 0.004, "target": "<= 10 ms"}, "met"),
        ({"unit": "ms", "median": 600.0, "target": "<= 0.5 s"}, "**not met**"),
        ({"unit": "appends/s", "median": 5e4, "ratio": 21.0, "baseline": "naive writer",
          "target": ">=40,000/s and >=20x naive"}, "met"),
        ({"unit": "appends/s", "median": 5e4, "ratio": 19.0, "baseline": "naive writer",
          "target": ">=40,000/s and >=20x naive"}, "**not met**"),
        ({"unit": "s", "median": 0.1, "ratio": 100.0, "baseline": "torchrun",
          "target": ">= 10x torchft"}, ""),  # a ratio against another peer says nothing
        ({"unit": "s", "median": 0.7, "target": "<= 5 s for 1,000,000 records"}, ""),
        ({"unit": "ms", "median": 15.0, "target": "tens of ms"}, ""),
        ({"unit": "B", "median": 100.0, "target": "<= 204,800 B (200 x N)"}, "met"),
    ],
)  # fmt: skip
def test_the_targets_column_checks_plain_bounds_only(row: dict, expected: str) -> None:
    assert report.verdict(row) == expected


# -- the test command ------------------------------------------------------------------------------


def test_ci_runs_the_readmes_test_command_verbatim() -> None:
    """.ci/run's test line is the README's, byte for byte: it installs torch 2.14.1 (and
    torchft's nightly, which the lighthouse tests run) into ``.venv`` and 2.13.0 into
    ``.venv-2.13``, runs the default suite on both and the slow suite
    on 2.14.1, each on xdist and bounded, and lets a run that collects nothing (exit code 5)
    pass while any other failure stops the command."""
    [command] = [
        line
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.startswith("python3 -m venv .venv") and "pytest" in line
    ]
    assert f"\n{command}\n" in (ROOT / "README.md").read_text()
    assert (
        "python3 -m venv .venv && .venv/bin/pip install -q -c constraints-dev.txt -e '.[dev,torchft]'"
        in command
    )
    assert (
        "python3 -m venv .venv-2.13 && .venv-2.13/bin/pip install -q -c constraints-2.13.txt"
        in command
    )
    runs = re.findall(
        r"\{ timeout (\d+) (\S+)/bin/python -m pytest (.*?) \|\| \[ \$\? -eq 5 \]; \}", command
    )
    assert [(venv, args) for _, venv, args in runs] == [
        (".venv", "-q -m 'not slow' -n 2 --dist loadgroup"),
        (".venv-2.13", "-q -m 'not slow' -n 2 --dist loadgroup"),
        (".venv", "-q -m slow -n 2 --dist loadgroup"),
    ], command
    assert command.count("pytest") == 3 and command.count(" && ") == 6, command
    assert sum(int(limit) for limit, _, _ in runs) <= 60 * 60, "CI's runs must fit in an hour"
    pins = {
        name: (ROOT / name).read_text() for name in ("constraints-dev.txt", "constraints-2.13.txt")
    }
    assert "\ntorch==2.14.1\n" in pins["constraints-dev.txt"]
    assert "\ntorch==2.13.0\n" in pins["constraints-2.13.txt"]


def test_the_readme_lists_every_page() -> None:
    """Each page of docs/ is named in the README's list, so a reader finds it from there."""
    readme = (ROOT / "README.md").read_text()
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if f"](docs/{p.name}" not in readme]
    assert missing == [], f"the README's Documentation list misses {missing}"


def test_the_protocol_reference_is_what_the_types_say() -> None:
    """docs/protocol.md's event fields, updates and codes are written from ``wire.protocol``'s
    event types, ``wire.updates``' update types and ``wire.codes``; a change to any of them
    changes the page (``reference.REGENERATE``)."""
    page = (DOCS / "protocol.md").read_text()
    for block in ("events", "updates", "codes"):
        assert f"<!-- generated: {block} -->" in page, block
    assert reference.render(page) == page, f"docs/protocol.md is stale; run {reference.REGENERATE}"
