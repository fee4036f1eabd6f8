"""docs/torch-compat.md is what its recorded runs render, and the rendering says what differs."""

from __future__ import annotations

from tests.torch_suite import declared, harness, report


def test_the_page_is_what_its_recorded_runs_render() -> None:
    text = report.render(report.load_runs(), report.load_torch_runs())
    assert report.PAGE.read_text() == text, (
        f"docs/torch-compat.md differs from docs/torch-compat-runs/; regenerate: {report.REGENERATE}"
    )


def _run(backend: str, tests: list[dict], torch: str = "2.13.0+cpu") -> dict:
    return {
        "backend": backend, "world_size": 2, "torch": torch, "selected": len(tests),
        "of": len(tests), "started": "2026-12-03T06:00:00Z", "timeout_s": 90, "file": f"{torch}/{backend}-2.json",
        "declarations": {'skip_collective["x"]': "x is not implemented"} if backend == "foldplane" else {},
        "tests": tests,
    }  # fmt: skip


def test_counts_side_by_side_and_every_difference_with_its_reason() -> None:
    gloo = _run("gloo", [{"test": "test_a", "outcome": "passed"}, {"test": "test_b", "outcome": "passed"},
                         {"test": "test_c", "outcome": "skipped", "detail": "no GPU"}])  # fmt: skip
    fold = _run("foldplane", [
        {"test": "test_a", "outcome": "passed"},
        {"test": "test_b", "outcome": "skipped", "detail": "foldplane lacks x", "skipped_by": 'skip_collective["x"]'},
        {"test": "test_c", "outcome": "skipped", "detail": "no GPU"},
    ])  # fmt: skip
    text = report.render([fold, gloo])
    assert "| 2.13.0+cpu | 2 | 3 | 2 | 1 | 0 | 0 | 1 | 2 |" in text
    assert (
        '| `test_b` | passed | skipped | foldplane lacks x (skipped by `skip_collective["x"]`) |'
        in text
    )
    assert '| `skip_collective["x"]` | x is not implemented | `test_b` |' in text
    assert "| skipped (1) | no GPU | `test_c` |" in text


def test_regressions_excuse_only_what_foldplane_declares(monkeypatch) -> None:
    monkeypatch.setattr(declared, "SKIPS", {"sendrecv anysource": "no recv from any source"})
    gloo = {"tests": [{"test": f"t{i}", "outcome": "passed"} for i in range(5)]}
    fold = {
        "tests": [
            {"test": "t0", "outcome": "passed"},
            {
                "test": "t1",
                "outcome": "skipped",
                "skipped_by": 'skip_collective["sendrecv anysource"]',
            },
            {"test": "t2", "outcome": "skipped", "skipped_by": harness.NAME_GATE},
            {
                "test": "t3",
                "outcome": "failed",
                "declared": 'refused["test_monitored_barrier_gloo"]',
            },
            {"test": "t4", "outcome": "failed", "detail": "RuntimeError: boom"},
        ]
    }
    assert [t["test"] for t in harness.regressions(gloo, fold)] == ["t2", "t4"]


def test_each_torch_version_has_its_runs_and_the_changes_between_them_are_listed() -> None:
    old = [{"test": "test_a", "outcome": "passed"}, {"test": "test_b", "outcome": "failed",
           "detail": "RuntimeError: boom"}, {"test": "test_c", "outcome": "passed"}]  # fmt: skip
    new = [{"test": "test_a", "outcome": "passed"}, {"test": "test_b", "outcome": "passed"},
           {"test": "test_d", "outcome": "skipped", "detail": "no GPU"}]  # fmt: skip
    runs = [_run("gloo", old), _run("foldplane", old), _run("gloo", new, "2.14.1"),
            _run("foldplane", new, "2.14.1")]  # fmt: skip
    text = report.render(runs)
    assert "| 2.13.0+cpu | 2 | 3 | 2 | 2 | 1 | 1 | 0 | 0 |" in text
    assert "| 2.14.1 | 2 | 3 | 2 | 2 | 0 | 0 | 1 | 1 |" in text
    assert "## From torch 2.13.0+cpu to 2.14.1" in text
    assert "| `test_b` | failed | passed | RuntimeError: boom |" in text
    assert "In one version's suite only: `test_c` (2.13.0+cpu), `test_d` (2.14.1)." in text
    assert "On torch 2.14.1, grouped by" in text  # the newest version's failures are listed


def test_the_recorded_runs_on_other_releases_are_listed_with_their_failures() -> None:
    record = {
        "date": "2026-12-06T23:00:00Z", "file": "2026-12-06-torch-2.15.0.json", "commit": "58f5953567",
        "versions": {"torch": "2.15.0+cu132", "nccl": "2.30.7", "python": "3.11.7"},
        "install": {"torch_before_foldplane": "2.15.0+cu132", "torch_after_foldplane": "2.15.0+cu132"},
        "runs": [{"run": "default", "seconds": 612.4, "cut_at_limit_s": None,
                  "counts": {"passed": 10, "failed": 1, "error": 0, "skipped": 2},
                  "failures": [{"test": "tests/x.py::test_y", "outcome": "failed", "error": "E"}]}],
    }  # fmt: skip
    text = report.render([_run("gloo", [{"test": "t", "outcome": "passed"}])], [record])
    assert (
        "| [2026-12-06 23:00](torch-runs/2026-12-06-torch-2.15.0.json) | 58f5953 | 2.15.0+cu132 "
        "| 2.30.7 | 3.11.7 "
        "| kept torch 2.15.0+cu132 | default | 10 | 1 | 0 | 2 | 612 | `tests/x.py::test_y` |"
    ) in text
    assert "No run is recorded yet." in report.render([_run("gloo", [])], [])
