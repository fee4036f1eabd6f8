"""docs/torch-compat.md is what its recorded runs render, and the rendering says what differs."""

from __future__ import annotations

from tests.torch_suite import declared, harness, report


def test_the_page_is_what_its_recorded_runs_render() -> None:
    assert report.PAGE.read_text() == report.render(report.load_runs()), (
        f"docs/torch-compat.md differs from docs/torch-compat-runs/; regenerate: {report.REGENERATE}"
    )


def _run(backend: str, tests: list[dict]) -> dict:
    return {
        "backend": backend, "world_size": 2, "torch": "2.13.0+cpu", "selected": len(tests),
        "of": len(tests), "started": "2026-12-03T06:00:00Z", "timeout_s": 90, "file": f"{backend}-2.json",
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
    assert "| 2 | 3 | 2 | 1 | 0 | 0 | 1 | 2 |" in text
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
