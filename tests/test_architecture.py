"""The layering rules, checked by a tool rather than by memory."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _python(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` run by a fresh interpreter of this environment from the checkout; it must
    succeed (its stderr is the message if not)."""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done


def test_pure_machines_import_no_io() -> None:
    """The fold and the agent machine import no asyncio, threads, sockets, clocks, databases or torch."""
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "broken" in done.stdout and "0 broken" in done.stdout, done.stdout


#: What a process that imports only the pure machines must not have loaded.
IO_MODULES = (
    "asyncio",
    "threading",
    "sqlite3",
    "asyncpg",
    "sqlalchemy",
    "httpx",
    "fastapi",
    "torch",
)


def test_importing_the_pure_machines_loads_no_io_module() -> None:
    """Importing ``coordinator.fold.machine`` and ``agent.machine`` (packages included), and
    making a fold (which loads every facet's declaration and fold parts), loads no I/O.

    import-linter checks the machines' own imports; this checks what the packages'
    ``__init__`` modules drag in at run time, in a fresh interpreter.
    """
    code = (
        "import foldplane.coordinator.fold.machine, foldplane.agent.machine, sys; "
        # a fold loads every registered facet's declaration and fold parts
        "foldplane.coordinator.fold.machine.Coordinator(); "
        f"print(','.join(m for m in {IO_MODULES!r} if m in sys.modules))"
    )
    done = _python(code)
    loaded = [m for m in done.stdout.strip().split(",") if m]
    assert loaded == [], f"importing the pure machines loaded {loaded}"


#: The files the fold's rules live in, each with a docstring that states its rule.
RULE_FILES = (
    "fencing",
    "fencing_ranks",
    "fencing_groups",
    "fencing_proposals",
    "fencing_fast",
    "ranks",
    "healthy_set",
    "budget",
    "proposals",
    "barrier",
    "deadlines",
    "ending",
    "formation",
    "outcomes",
)


def test_the_coordinator_is_a_dispatcher_over_files_that_state_their_rules() -> None:
    """``machine.py`` dispatches and stays short; a rule is found from the tree alone."""
    fold = ROOT / "coordinator" / "fold"
    # 360: it names each rule it composes and the checks it hands the host (``check``,
    # ``next_deadline``, ...), which it used to inherit
    assert len((fold / "machine.py").read_text().splitlines()) <= 360
    for name in RULE_FILES:
        doc = ast.get_docstring(ast.parse((fold / f"{name}.py").read_text()))
        assert doc and len(doc.splitlines()) >= 3, f"coordinator/fold/{name}.py states no rule"


#: The rule files with a declared interface: each function reads what it is handed and returns
#: its decision as a value that ``apply.py`` applies; it changes nothing it is handed. The
#: exception, by name: the heartbeat's fast path (``ranks.Ranks``), which takes a current
#: rank's beat in place because most records are beats.
DECLARED_RULES = (
    "budget",
    "healthy_set",
    "ranks",
    "ending",
    "formation",
    "barrier.missed_acks",
    "deadlines.resumed",
    "deadlines.window_closed",
    "barrier.prepare",
    "barrier.form",
    "barrier.resolve_stall",
    "barrier.ViewChange.commit",
    "barrier.ViewChange._commit_without_target",
    "barrier.ViewChange._view",
    "proposals",
    "reconfigure",
)
IN_PLACE_BY_NAME = {("ranks", "Ranks")}
#: Calls that change a set, dict, list or deque in place.
IN_PLACE = {"add", "discard", "remove", "pop", "popleft", "clear", "update", "move_to_end"}


def _owner(node: ast.expr) -> str:
    """The name a chain such as ``g.ranks[r].down`` or ``d.setdefault(a, x)`` starts from."""
    while isinstance(node, ast.Attribute | ast.Subscript | ast.Call):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else ""


def _made_here(fn: ast.FunctionDef, method: bool) -> set[str]:
    """The names ``fn`` binds to a value it made (a call's result, a literal, an operation),
    not to a part of what it was handed (``alive = g.alive`` is the group's, not its own)."""
    made = {"self"} if method else set()
    for n in ast.walk(fn):
        if isinstance(n, ast.Assign | ast.AnnAssign) and n.value is not None:
            if isinstance(n.value, ast.Name | ast.Attribute | ast.Subscript):
                continue
            for t in n.targets if isinstance(n, ast.Assign) else [n.target]:
                if isinstance(t, ast.Name):
                    made.add(t.id)
    return made


def test_a_rule_with_a_declared_interface_returns_its_decision_and_changes_nothing() -> None:
    """In ``DECLARED_RULES`` no function is handed the step's ``effects`` to append to, and
    none assigns to an attribute or an item, or changes a collection in place, except of a
    value it made itself (``self`` in a method of the rule's own scratch object, such as the
    Healthy Set's search): the machine applies the decision it returns (``apply.py``)."""
    fold = ROOT / "coordinator" / "fold"
    for declared in DECLARED_RULES:
        name, *qualified = declared.split(".")
        tree = ast.parse((fold / f"{name}.py").read_text())
        classes = [c for c in ast.walk(tree) if isinstance(c, ast.ClassDef)]
        methods = {id(f) for c in classes for f in c.body}
        exempt = {id(n) for c in classes if (name, c.name) in IN_PLACE_BY_NAME for n in ast.walk(c)}
        if qualified:  # one function of the file: the others are not declared yet
            node: ast.AST = tree
            for part in qualified:
                (node,) = [n for n in ast.iter_child_nodes(node) if getattr(n, "name", "") == part]
            exempt = {id(n) for n in ast.walk(tree)} - {id(n) for n in ast.walk(node)}
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef) or id(fn) in exempt:
                continue
            where = f"coordinator/fold/{name}.py: {fn.name}"
            params = {a.arg for a in (*fn.args.args, *fn.args.kwonlyargs)}
            assert "effects" not in params, f"{where} is handed the step's effects"
            made = _made_here(fn, id(fn) in methods) - (params - {"self"})
            for n in ast.walk(fn):
                if isinstance(n, ast.Assign | ast.AnnAssign | ast.AugAssign):
                    for t in n.targets if isinstance(n, ast.Assign) else [n.target]:
                        if isinstance(t, ast.Attribute | ast.Subscript):
                            assert _owner(t) in made, f"{where} changes {ast.unparse(t)}"
                func = n.func if isinstance(n, ast.Call) else None
                if isinstance(func, ast.Attribute) and func.attr in IN_PLACE:
                    changed = ast.unparse(func.value)
                    assert _owner(func) in made, f"{where} changes {changed} in place"


#: What a mixin declares on its class to reach the fold's state through a shared ``self``.
FOLD_STATE = {"_groups", "_proposals", "_now", "facets", "_facet_of"}


def test_the_coordinator_composes_its_rules_and_inherits_none() -> None:
    """No mixins over a shared ``self``: ``Coordinator`` has no base class, and no class of a
    rule file inherits another rule's class or declares the fold's state on its class (the
    mixin's ``_groups: dict[...]``): a rule is handed what it reads."""
    fold = ROOT / "coordinator" / "fold"
    machine = ast.parse((fold / "machine.py").read_text())
    (coordinator,) = [
        n for n in machine.body if isinstance(n, ast.ClassDef) and n.name == "Coordinator"
    ]
    bases = [ast.unparse(b) for b in coordinator.bases]
    assert not bases, f"Coordinator inherits from {bases}; compose the rules instead"
    classes: dict[str, tuple[str, ast.ClassDef]] = {}
    for name in (*RULE_FILES, "reconfigure"):
        tree = ast.parse((fold / f"{name}.py").read_text())
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                classes[node.name] = (name, node)
    for cls_name, (name, cls) in classes.items():
        inherited = [ast.unparse(b) for b in cls.bases if ast.unparse(b) in classes]
        assert not inherited, f"{name}.py: {cls_name} inherits the rule classes {inherited}"
        shared = [
            ast.unparse(n.target)
            for n in cls.body
            if isinstance(n, ast.AnnAssign) and ast.unparse(n.target) in FOLD_STATE
        ]
        assert not shared, f"{name}.py: {cls_name} expects the fold's state {shared} on self"


def test_the_contracts_cover_the_agent_and_the_benchmarks() -> None:
    """No import loop among the agent's modules nor the benchmarks'; the benchmarks (and the
    facets' benchmarks beside them), which measure the product, import no tests and no
    command-line internals."""
    import tomllib

    linter = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert linter["root_packages"] == ["foldplane"]
    contracts = linter["contracts"]
    acyclic = [c for c in contracts if c["type"] == "acyclic_siblings"]
    ancestors = {a for c in acyclic for a in c["ancestors"]}
    assert {"foldplane.agent", "foldplane.benchmarks", "foldplane.benchmarks.kit"} <= ancestors
    forbidden = [
        set(c["forbidden_modules"])
        for c in contracts
        if c["type"] == "forbidden" and "foldplane.benchmarks" in c["source_modules"]
    ]
    assert any({"tests", "foldplane.cli"} <= f for f in forbidden), forbidden


#: The repository's top folders that are packages of foldplane.
PACKAGES = tuple(
    sorted(p.parent.name for p in ROOT.glob("*/__init__.py") if p.parent.name != "tests")
)
#: Modules run as ``python -m <short name>`` in the root: each imports foldplane by its long
#: name, so that nothing it loads has a second name (``coordinator/__main__.py`` is a door).
SHORT_FORMS = ("coordinator/__main__.py", "benchmarks/__main__.py", "benchmarks/report.py")


def _product_modules() -> list[Path]:
    """Every module of the package foldplane (the repository's root and its top packages),
    but the migrations' scripts, which Alembic loads by path."""
    return [
        path
        for name in PACKAGES
        for path in (ROOT / name).rglob("*.py")
        if not path.relative_to(ROOT).as_posix().startswith("migrations/")
    ]


def test_every_module_has_one_name() -> None:
    """The root is the package ``foldplane``: no link stands in for a folder and no package's
    ``__path__`` is extended, and the modules import each other relatively, so a tool reading
    imports as text (no link followed) sees every arrow; ``python -m coordinator --help`` in
    the root loads nothing under a short name but its empty door."""
    links = subprocess.run(
        ["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert not [line for line in links.splitlines() if line.startswith("120000")], links
    absolute = []
    for path in _product_modules():
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Name) and node.id == "__path__":
                raise AssertionError(f"{rel}:{node.lineno} changes its package's __path__")
            named = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom) and node.level == 0
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            if rel not in SHORT_FORMS and any(n.split(".")[0] == "foldplane" for n in named):
                absolute.append(f"{rel}:{node.lineno}")
    assert absolute == [], f"imports of foldplane by its long name in the package: {absolute}"
    code = (
        "import runpy, sys; sys.argv = ['coordinator', '--help']\n"
        "try: runpy.run_module('coordinator', run_name='__main__', alter_sys=True)\n"
        "except SystemExit: pass\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {PACKAGES!r}))"
    )
    done = _python(code)
    assert "serve" in done.stdout, done.stdout
    assert done.stdout.strip().splitlines()[-1] == "['coordinator']", done.stdout


def test_the_wheel_lists_every_package_of_the_tree() -> None:
    """pyproject.toml lists the packages a wheel holds (the root is ``foldplane``, each folder
    with an ``__init__.py`` below its top packages one of its packages): none left out."""
    import tomllib

    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    tree = {"foldplane"} | {
        "foldplane." + ".".join(p.parent.relative_to(ROOT).parts)
        for name in PACKAGES
        for p in (ROOT / name).rglob("__init__.py")
    }
    assert listed["package-dir"] == {"foldplane": "."}
    assert sorted(listed["packages"]) == sorted(tree)


#: A facet's modules that hold or change its live state (its fold object and its rules).
FACET_FOLD_PARTS = ("fold", "state", "checks", "moves", "partition", "rounds", "quorum")


def test_the_api_reads_the_published_read_model_never_the_live_fold() -> None:
    """The API's modules and the facets' routes read ``host.reads`` (published once per cycle,
    ``coordinator/host/reads.py``; a facet's own part of it is its ``reads.py``), never
    ``host.machine``: the import contract forbids them the fold's modules and every facet's
    fold parts, and this the attributes through which a host or a facet's host part would hand
    them the live fold anyway (``.machine``, ``.published``, a host part's ``.fold``)."""
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    forbidding = [
        set(c["forbidden_modules"])
        for c in contracts["contracts"]
        if c["type"] == "forbidden" and "foldplane.facets.*.routes" in c["source_modules"]
    ]
    parts = {f"foldplane.facets.*.{part}" for part in FACET_FOLD_PARTS}
    assert any(parts | {"foldplane.coordinator.fold.machine"} <= f for f in forbidding)
    sources = [*(ROOT / "api").rglob("*.py"), *ROOT.glob("facets/*/routes.py")]
    sources += [*ROOT.glob("facets/*/models.py"), ROOT / "tests" / "facets" / "toy" / "routes.py"]
    reaching = []
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in {"machine", "published", "fold"}:
                reaching.append(f"{path.relative_to(ROOT)}:{node.lineno} .{node.attr}")
            module = node.module or "" if isinstance(node, ast.ImportFrom) else ""
            if isinstance(node, ast.ImportFrom) and module.split(".")[0] in FACET_FOLD_PARTS:
                reaching.append(f"{path.relative_to(ROOT)}:{node.lineno} .{module}")
    assert not reaching, reaching


#: The product's folders and top modules (the tests, docs and examples are not the product).
PRODUCT = (
    "agent",
    "api",
    "benchmarks",
    "coordinator",
    "eventlog",
    "facets",
    "migrations",
    "sim",
    "wire",
    "cli.py",
    "demo.py",
)

#: How many product files outside its folder each facet of foldplane is named by (the goal:
#: one, its line in ``BUILTIN_FACETS``). A facet that moves a part into its folder lowers its
#: number here; a change that names a facet from outside once more fails until it is counted.
OUTSIDE_FILES = {"epochs": 1, "refits": 1, "lighthouse": 1, "rendezvous": 1}


def _module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(("foldplane", *(parts[:-1] if parts[-1] == "__init__" else parts)))


def _names_a_facet(path: Path, package: str, structs: frozenset[str]) -> bool:
    """Whether ``path`` imports a module of the facet ``package`` (``foldplane.facets.x``),
    names it in a string (the registry's line), or imports or declares one of its Structs."""
    here = _module_of(path)
    base = here.split(".") if path.name == "__init__.py" else here.split(".")[:-1]

    def facets_module(name: str) -> bool:
        return name == package or name.startswith(package + ".")

    def names(node: ast.AST) -> bool:
        if isinstance(node, ast.Import):
            return any(facets_module(a.name) for a in node.names)
        if isinstance(node, ast.ImportFrom):
            parent = base[: len(base) - node.level + 1] if node.level else []
            module = ".".join([*parent, *(node.module or "").split(".")]).strip(".")
            full = [module, *(f"{module}.{a.name}" for a in node.names)]
            return any(facets_module(m) for m in full) or any(a.name in structs for a in node.names)
        if isinstance(node, ast.ClassDef):
            return node.name in structs
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return facets_module(node.value.split(":")[0])
        return False

    return any(names(node) for node in ast.walk(ast.parse(path.read_text())))


def outside_files(package: str, folder: Path) -> list[str]:
    """The product files outside ``folder`` that name the facet ``package`` or its Structs."""
    import importlib

    plugin = importlib.import_module(package).PLUGIN
    structs = frozenset(c.__name__ for c in (*plugin.updates, *plugin.events))
    files = [
        p
        for name in PRODUCT
        for p in ((ROOT / name).rglob("*.py") if (ROOT / name).is_dir() else [ROOT / name])
    ]
    return sorted(
        str(p.relative_to(ROOT))
        for p in files
        if folder not in p.parents and _names_a_facet(p, package, structs)
    )


def test_a_facet_is_named_outside_its_folder_by_the_counted_files_only() -> None:
    """Counts the product files outside each facet's folder that import it, name its package
    or import or declare its Structs (docs/architecture.md says which and why); the toy facet
    (``tests/facets/toy/``, plugged in by ``FOLDPLANE_FACETS`` alone) is named by none."""
    counted = {
        name: outside_files(f"foldplane.facets.{name}", ROOT / "facets" / name)
        for name in OUTSIDE_FILES
    }
    assert {k: len(v) for k, v in counted.items()} == OUTSIDE_FILES, counted
    assert outside_files("tests.facets.toy", ROOT / "tests" / "facets" / "toy") == []


def test_importing_a_facet_package_loads_none_of_its_server_side() -> None:
    """A facet's package declares its ``PLUGIN`` lazily (``plugin.py``, loaded when the registry
    asks for it), so a worker that imports a facet's worker modules loads no fold, no registry
    and no host; asking for ``PLUGIN`` loads its declaration."""
    code = (
        "import sys, importlib; "
        f"names = {tuple(OUTSIDE_FILES)!r}; "
        "[importlib.import_module('foldplane.facets.' + n) for n in names]; "
        "print(sorted(m for m in sys.modules if m.startswith(('foldplane.coordinator', "
        "'foldplane.facets.')) and m.count('.') > 2)); "
        "print(importlib.import_module('foldplane.facets.refits').PLUGIN.name)"
    )
    done = _python(code)
    assert done.stdout.split("\n")[:2] == ["[]", "refits"], done.stdout


def test_the_worker_side_loads_of_a_facet_its_protocol_only() -> None:
    """An agent reads the facets' Structs from their ``protocol`` modules (``agent/facets.py``),
    whose events are made from the facet's ``inputs`` (the one declaration of a kind's fields):
    importing the agent loads those and nothing else of a facet (the data cursor, which only
    the data tracker imports, aside), and nothing of the server."""
    code = (
        "import sys, foldplane.agent.host, foldplane.agent.relay, foldplane.agent.facets as f; "
        "print(sorted(m for m in sys.modules if m.startswith(('foldplane.coordinator', "
        "'foldplane.api', 'foldplane.facets.')))); "
        "print(sorted(c.__struct_config__.tag for c in f.FACET_EVENTS))"
    )
    done = _python(code)
    loaded, events = done.stdout.strip().split("\n")[-2:]
    # the facets' packages (their declarations are loaded only when asked for) and one module
    modules = [
        m
        for m in ast.literal_eval(loaded)
        if m.count(".") > 2 or not m.startswith("foldplane.facets")
    ]
    assert modules == [
        "foldplane.facets.epochs.inputs",
        "foldplane.facets.epochs.protocol",
        "foldplane.facets.refits.inputs",
        "foldplane.facets.refits.protocol",
    ], loaded
    assert events == str(
        ["progress", "refit_bootstrap", "refit_join", "transfer", "transfer_status"]
    )


def test_a_worker_making_the_facets_worker_parts_loads_nothing_of_the_server() -> None:
    """An agent makes each facet's worker part by the name its ``protocol`` module declares
    (``agent/facets.py``): making them all loads, of the facets, their worker modules only
    (protocol, inputs, the data cursor, the worker parts) and nothing of the server, as the
    import contracts say of the code."""
    code = (
        "import sys; from foldplane.agent.host import Agent; "
        "a = Agent('http://127.0.0.1:9', group='g', rank=0, backend='gloo'); "
        "print([type(a.facet(n)).__name__ for n in ('refits', 'epochs')]); "
        "print(sorted(m for m in sys.modules if m.startswith(('foldplane.coordinator', "
        "'foldplane.api', 'foldplane.eventlog', 'foldplane.facets.')) and m.count('.') > 2))"
    )
    made, loaded = _python(code).stdout.strip().split("\n")[-2:]
    assert made == str(["RefitsWorker", "EpochsWorker"])
    assert ast.literal_eval(loaded) == [
        "foldplane.facets.epochs.cursor",
        "foldplane.facets.epochs.inputs",
        "foldplane.facets.epochs.protocol",
        "foldplane.facets.epochs.worker",
        "foldplane.facets.epochs.worker.sampler",
        "foldplane.facets.epochs.worker.tracker",
        "foldplane.facets.refits.inputs",
        "foldplane.facets.refits.protocol",
        "foldplane.facets.refits.worker",
    ], loaded
