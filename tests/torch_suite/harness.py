"""Run torch's backend suite (``DistributedTest._DistTestBase``) on one backend, record each test.

``run(backend, world, names, out)`` imports the suite with ``BACKEND=<backend>`` and
``WORLD_SIZE=<world>``, and runs every selected test the way torch's own runner does (one
process per rank, ``init_process_group(backend=BACKEND, init_method="file://...")``, the
suite's file barrier around the test), then writes one record per test to ``out`` as it goes:
``passed``, ``failed`` (with the first line of the error) or ``skipped`` (with the reason).

For ``"foldplane"`` the harness starts a real coordinator (``python -m coordinator serve`` on
a SQLite file) for the whole run, and, before each test, creates a group of ``world`` ranks
for it; each rank process gets ``FOLDPLANE_COORDINATOR``, ``FOLDPLANE_GROUP`` and its own
``FOLDPLANE_RANK``, so ``init_process_group("foldplane")`` builds the agent, which joins, waits
for the group's first view and runs every collective on gloo underneath.

The rank processes are forked from this process once the suite is imported (torch's runner
spawns them; forking skips importing torch again per rank, the slowest part of a test on a
small machine). ``start="spawn"`` runs them as torch does.

Tests the suite keeps for gloo by name (``BACKEND != "gloo"``: timeouts, coalesced
all-reduce, ``get_future``, sparse all-reduce...) run on foldplane from a second copy of the
suite imported with ``BACKEND=gloo`` (foldplane runs gloo underneath); the harness's own rank
entry point still initialises ``"foldplane"``. Their records say ``"gates": "gloo"``. This
needs forked ranks; with ``start="spawn"`` they are skipped (:data:`NAME_GATE`).

A skip is attributed: ``skipped_by`` names the entry of :mod:`tests.torch_suite.declared`
that made the suite skip it (found by importing the suite again with that declaration lifted,
and comparing which tests are skipped), so a reader can tell foldplane's own declarations
from the suite's other gates (no GPU, world size). A failure that ``declared.REFUSED`` names
carries ``declared``.
"""

from __future__ import annotations

import importlib
import itertools
import json
import os
import re
import sys
import tempfile
import time
import unittest
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from tests.torch_suite import declared

SUITE = "torch.testing._internal.distributed.distributed_test"
BACKENDS = ("gloo", "foldplane")

#: Per-test settings of a foldplane group: quick formation, deadlines a test can live with.
GROUP_CONFIG = {
    "heartbeat_timeout_s": 10.0,
    "ack_timeout_s": 20.0,
    "admission_timeout_s": 30.0,
    "formation_timeout_s": 60.0,
    "reconcile_window_s": 0.2,
}


@dataclass(frozen=True)
class Outcome:
    """One test's result: ``passed``, ``failed`` or ``skipped``, and why (the first line)."""

    test: str
    outcome: str
    detail: str = ""
    seconds: float = 0.0
    #: what skipped it on foldplane: a declaration (``declared.reasons()``) or :data:`NAME_GATE`
    skipped_by: str | None = None
    #: ``"gloo"``: run on foldplane with the suite's gates on backend names read as for gloo
    gates: str | None = None
    #: the declaration that says why it fails on foldplane (``declared.REFUSED``)
    declared: str | None = None


# -- the suite, imported for one backend and world size ---------------------------------------


def _environment(backend: str, world: int, timeout_s: int) -> None:
    os.environ["BACKEND"] = backend
    os.environ["WORLD_SIZE"] = str(world)
    # Read when torch's common_distributed is imported: the per-test limit of the runner.
    os.environ["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = str(timeout_s)
    os.environ.setdefault("TEMP_DIR", tempfile.gettempdir())
    if backend == "foldplane":
        import foldplane.agent.dataplane  # noqa: F401  (registers the backend before the suite looks)


def _static_skips(suite: Any) -> dict[str, str]:
    """The tests the suite skips by decorator, and why (the decorators ran at import)."""
    base = suite.DistributedTest._DistTestBase
    out = {}
    for name in dir(base):
        fn = getattr(base, name)
        if name.startswith("test_") and getattr(fn, "__unittest_skip__", False):
            out[name] = str(getattr(fn, "__unittest_skip_why__", ""))
    return out


#: What a skip by one of the suite's own gates on the backend's name is attributed to.
NAME_GATE = "the suite's gate on the backend's name"


def _import_suite(backend: str) -> tuple[Any, dict[str, str]]:
    """The suite module for ``backend`` and, for foldplane, what made it skip which test.

    Each declaration is lifted in turn (the suite imported as if foldplane had that feature):
    the tests it un-skips are the ones it skips. The tests still skipped with every
    declaration lifted, but not on gloo, are skipped by a gate that names backends (such as
    ``BACKEND != "gloo"``): :data:`NAME_GATE`.
    """
    attribution: dict[str, str] = {}
    if backend == "foldplane":
        declared.declare(backend)
        baseline = set(_fresh_import(backend))
        for name in declared.reasons():
            if name.startswith("refused"):
                continue
            declared.declare(backend, lift=name)
            for test in baseline - set(_fresh_import(backend)):
                attribution[test] = name
        declared.declare(backend, lift="*")
        unconstrained = set(_fresh_import(backend))
        for test in unconstrained - set(_fresh_import("gloo")):
            attribution[test] = NAME_GATE
        declared.declare(backend)
        sys.modules.pop(SUITE, None)
    return importlib.import_module(SUITE), attribution


def _gloo_gated_suite() -> Any:
    """The suite imported with ``BACKEND=gloo``, for the tests it keeps for gloo by name.

    Its gates, at import and inside the tests (``if BACKEND == "gloo": ...``), read gloo; the
    harness's own ``_run`` still initialises the ranks with the backend under test.
    """
    saved = os.environ["BACKEND"]
    os.environ["BACKEND"] = "gloo"
    try:
        sys.modules.pop(SUITE, None)
        return importlib.import_module(SUITE)
    finally:
        os.environ["BACKEND"] = saved
        sys.modules.pop(SUITE, None)


def _fresh_import(backend: str) -> dict[str, str]:
    """The static skips of the suite imported anew with ``BACKEND=<backend>``."""
    saved = os.environ["BACKEND"]
    os.environ["BACKEND"] = backend
    try:
        sys.modules.pop(SUITE, None)
        return _static_skips(importlib.import_module(SUITE))
    finally:
        os.environ["BACKEND"] = saved
        sys.modules.pop(SUITE, None)


def suite_tests(backend: str, world: int) -> list[str]:
    """Every test of ``_DistTestBase``, in the suite's order of names."""
    suite = sys.modules.get(SUITE) or _import_suite(backend)[0]
    return sorted(n for n in dir(suite.DistributedTest._DistTestBase) if n.startswith("test_"))


def make_case_class(suite: Any, backend: str, coordinator_url: str | None) -> type:
    """``TestDistBackend`` + ``_DistTestBase``, starting one process per rank per test."""

    base = suite.TestDistBackend
    tests = suite.DistributedTest._DistTestBase

    class FoldplaneSuiteCase(base, tests):  # type: ignore[misc, valid-type]
        start_method = "fork"
        group_prefix = f"ts{os.getpid()}"

        def setUp(self) -> None:
            super().setUp()
            sys.modules[SUITE] = suite  # what the ranks unpickle the suite's objects from
            if backend == "foldplane":
                assert coordinator_url is not None
                group = f"{self.group_prefix}-{next(_group_numbers)}"
                _client(coordinator_url).create_group(group, int(self.world_size), **GROUP_CONFIG)
                os.environ["FOLDPLANE_COORDINATOR"] = coordinator_url
                os.environ["FOLDPLANE_GROUP"] = group
            if self.start_method == "spawn":
                self._spawn_processes()
            else:
                import torch.multiprocessing as mp

                self._start_processes(mp.get_context("fork").Process)

        @classmethod
        def _run(cls, rank: int, test_name: str, file_name: str, pipe: Any, **kwargs: Any) -> None:
            """One rank: what torch's ``TestDistBackend._run`` does, with ``backend`` itself
            (not the suite's ``BACKEND``, which reads gloo in the gloo-gated copy)."""
            import torch.distributed as dist

            os.environ["FOLDPLANE_RANK"] = str(rank)
            self = cls(test_name)
            self.rank, self.file_name = rank, file_name
            seconds = suite.CUSTOM_PG_TIMEOUT.get(test_name, suite.default_pg_timeout)
            dist.init_process_group(
                init_method=self.init_method,
                backend=backend,
                world_size=int(self.world_size),
                rank=rank,
                timeout=timedelta(seconds=seconds),
            )
            self._barrier()  # every rank is initialised before a test that skips at once exits
            self.run_test(test_name, pipe)
            self._barrier()
            dist.destroy_process_group()
            sys.exit(0)

    FoldplaneSuiteCase.__name__ = FoldplaneSuiteCase.__qualname__ = f"Suite_{backend}"
    return FoldplaneSuiteCase


#: One sequence per harness process: every test's group is new, whichever case class runs it
#: (a group name used twice would meet the earlier test's rendezvous keys).
_group_numbers = itertools.count(1)

_clients: dict[str, Any] = {}


def _client(url: str) -> Any:
    if url not in _clients:
        from foldplane.agent.client import CoordinatorClient

        _clients[url] = CoordinatorClient(url, timeout_s=30.0)
    return _clients[url]


# -- outcomes ---------------------------------------------------------------------------------

_EXC_LINE = re.compile(
    r"^(?:[\w.]+\.)?(\w*(?:Error|Exception|Failure|Timeout)\w*|AssertionError)\b"
)


def first_error_line(text: str) -> str:
    """The first line that says what went wrong, out of a test's error text.

    A rank's error arrives as ``Process i exited with error code 10 and exception:`` and that
    rank's traceback: the answer is the traceback's exception line (the last line that starts
    with an exception name), else the first non-empty line.
    """
    lines = [ln.rstrip() for ln in text.splitlines()]
    blocks = [i for i, ln in enumerate(lines) if ln.startswith("Process ") and "exception:" in ln]
    if blocks:
        end = blocks[1] if len(blocks) > 1 else len(lines)
        body = lines[blocks[0] + 1 : end]
        prefix = lines[blocks[0]].split(" exited", 1)[0]
        exc = [ln for ln in body if _EXC_LINE.match(ln)]
        if exc:
            return f"{prefix}: {exc[-1]}"[:400]
    exc = [ln for ln in lines if _EXC_LINE.match(ln)]
    if exc:
        return exc[-1][:400]
    return next((ln.strip() for ln in lines if ln.strip()), "")[:400]


class _Recorder(unittest.TestResult):
    """Keeps one :class:`Outcome` per test and hands it to ``on_outcome`` at once."""

    def __init__(
        self, on_outcome: Any, attribution: dict[str, str], gloo_gated: set[str], backend: str
    ) -> None:
        super().__init__()
        self._backend = backend
        self._on_outcome = on_outcome
        self._attribution = attribution
        self._gloo_gated = gloo_gated
        self._started = 0.0
        self._current: Outcome | None = None

    def startTest(self, test: unittest.TestCase) -> None:  # noqa: N802 (unittest's names)
        super().startTest(test)
        self._started = time.monotonic()
        self._current = Outcome(_name(test), "passed")

    def addError(self, test: unittest.TestCase, err: Any) -> None:  # noqa: N802
        self._set("failed", self._exc_info_to_string(err, test))

    def addFailure(self, test: unittest.TestCase, err: Any) -> None:  # noqa: N802
        self._set("failed", self._exc_info_to_string(err, test))

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:  # noqa: N802
        self._set("skipped", reason)

    def _set(self, outcome: str, text: str) -> None:
        assert self._current is not None
        detail = first_error_line(text) if outcome == "failed" else text.strip()
        self._current = Outcome(self._current.test, outcome, detail)

    def stopTest(self, test: unittest.TestCase) -> None:  # noqa: N802
        super().stopTest(test)
        assert self._current is not None
        cur = self._current
        decl = self._attribution.get(cur.test) if cur.outcome == "skipped" else None
        seconds = round(time.monotonic() - self._started, 2)
        gates = "gloo" if cur.test in self._gloo_gated else None
        refused = None
        if (
            cur.outcome == "failed"
            and self._backend == "foldplane"
            and cur.test in declared.REFUSED
        ):
            refused = f'refused["{cur.test}"]'
        self._on_outcome(Outcome(cur.test, cur.outcome, cur.detail, seconds, decl, gates, refused))


def _name(test: unittest.TestCase) -> str:
    return test.id().rsplit(".", 1)[-1]


# -- a run ------------------------------------------------------------------------------------


@contextmanager
def _coordinator(backend: str, workdir: Path) -> Iterator[str | None]:
    if backend != "foldplane":
        yield None
        return
    from tests.agent.conftest import start_coordinator, stop_coordinator

    c = start_coordinator(workdir)
    try:
        yield c.url
    finally:
        stop_coordinator(c)


def run(
    backend: str,
    world: int,
    *,
    names: Iterable[str] | None = None,
    pattern: str | None = None,
    out: Path | None = None,
    timeout_s: int = 120,
    start: str = "fork",
    gloo_gates: bool = True,
    verbose: bool = True,
) -> dict[str, Any]:
    """Run the selected tests of the suite on ``backend`` over ``world`` processes.

    ``names`` (exact test names) or ``pattern`` (a regular expression searched in each name)
    select the tests; neither: all of them. Returns the run's record (also written to
    ``out`` after every test, so an interrupted run keeps what it did).

    ``gloo_gates`` (foldplane, forked ranks): the tests the suite keeps for gloo by name run on
    foldplane with the suite's ``BACKEND`` reading gloo (foldplane runs gloo underneath): its
    gates and the branches inside the tests take gloo's side, while every rank initialises
    ``"foldplane"``. Their records say ``"gates": "gloo"``. Without it they are recorded as skipped by :data:`NAME_GATE`.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    _environment(backend, world, timeout_s)
    suite, attribution = _import_suite(backend)
    every = suite_tests(backend, world)
    chosen = list(names) if names is not None else every
    unknown = sorted(set(chosen) - set(every))
    if unknown:
        raise ValueError(f"not tests of the suite: {unknown}")
    if pattern:
        chosen = [n for n in chosen if re.search(pattern, n)]
    import torch

    record: dict[str, Any] = {
        "suite": f"{SUITE}.DistributedTest._DistTestBase",
        "backend": backend,
        "world_size": world,
        "torch": torch.__version__,
        "start_method": start,
        "gloo_gates": backend == "foldplane" and gloo_gates and start == "fork",
        "timeout_s": timeout_s,
        "selected": len(chosen),
        "of": len(every),
        "has": dict(declared.HAS) if backend == "foldplane" else {},
        "declarations": declared.reasons() if backend == "foldplane" else {},
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "tests": [],
    }

    def on_outcome(o: Outcome) -> None:
        record["tests"].append({k: v for k, v in asdict(o).items() if v not in (None, "")})
        if verbose:
            tail = f": {o.detail}" if o.detail else ""
            print(
                f"[{backend} x{world}] {o.test} {o.outcome} ({o.seconds:.1f} s){tail}", flush=True
            )
        if out is not None:
            _write(out, record)

    with (
        tempfile.TemporaryDirectory(prefix="torch-suite-") as tmp,
        _coordinator(backend, Path(tmp)) as url,
    ):
        case = make_case_class(suite, backend, url)
        case.start_method = start
        gloo_gated: set[str] = set()
        if backend == "foldplane" and gloo_gates and start == "fork":
            gloo_gated = {n for n in chosen if attribution.get(n) == NAME_GATE}
            gated_case = make_case_class(_gloo_gated_suite(), backend, url)
        recorder = _Recorder(on_outcome, attribution, gloo_gated, backend)
        cases = [gated_case(n) if n in gloo_gated else case(n) for n in chosen]
        unittest.TestSuite(cases).run(recorder)
    record["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if out is not None:
        _write(out, record)
    return record


def _write(out: Path, record: dict[str, Any]) -> None:
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=False) + "\n")
    tmp.replace(out)


def counts(record: dict[str, Any]) -> dict[str, int]:
    """How many tests of a run passed, failed and were skipped."""
    out = {"passed": 0, "failed": 0, "skipped": 0}
    for t in record["tests"]:
        out[t["outcome"]] += 1
    return out


def regressions(reference: dict[str, Any], run: dict[str, Any]) -> list[dict[str, Any]]:
    """The tests ``reference`` (gloo) passes and ``run`` (foldplane) does not, unexcused.

    Excused: a skip that a declaration of :mod:`tests.torch_suite.declared` caused, and a
    failure that ``declared.REFUSED`` names. A test absent from ``run`` is not compared.
    """
    passed = {t["test"] for t in reference["tests"] if t["outcome"] == "passed"}
    return [
        t
        for t in run["tests"]
        if t["test"] in passed
        and t["outcome"] != "passed"
        and not (t["outcome"] == "skipped" and t.get("skipped_by") in declared.reasons())
        and not (t["outcome"] == "failed" and t.get("declared"))
    ]
