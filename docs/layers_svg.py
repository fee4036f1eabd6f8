"""Draw docs/layers.svg from the import graph: ``python docs/layers_svg.py [--check]``.

Each box is a part of the house (a folder, or the modules of the facets' folders that sit in one
layer); an arrow A → B says some module of A imports a module of B (``grimp``, the graph
``lint-imports`` checks, built from the code as it is). Boxes stand in their layers, top to
bottom: the composition roots, the API, the host, the pure fold, the log and the wire. A grey
arrow points down or sideways; a red one points up, a lower layer reaching a higher one. The
same code always gives the same bytes; ``--check`` compares instead of writing, and
tests/test_docs.py runs it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from xml.sax.saxutils import escape

OUT = Path(__file__).resolve().parent / "layers.svg"
WIDTH = 1000
BOX_W, BOX_H = 200, 46

#: Facet modules by the layer they belong to (any other module of a facet is its pure part).
FACET_API = ("routes", "models", "console")
FACET_HOST = ("host", "story", "plot", "service", "serve")
#: A facet's worker part (a module, or a package of modules): of the worker side, over the agent.
FACET_WORKER = "worker"
#: A facet's part of the simulator and its benchmark are drawn in the simulator's and the
#: benchmarks' boxes, where they stand.
FACET_SIM = ("sim",)
FACET_BENCHMARK = ("benchmark",)

#: node -> (title, description, column, row); columns 0..3 of a 4-column grid, rows are layers.
NODES: dict[str, tuple[str, str, int, int]] = {
    "roots": ("the composition roots", "cli.py · demo.py · coordinator/__main__", 0, 0),
    "sim": ("sim/", "the simulator, facets' sim parts", 1, 0),
    "benchmarks": ("benchmarks/", "the rows, facets' benchmarks", 2, 0),
    "api": ("api/", "FastAPI routes", 0, 1),
    "facet_api": ("facets/*: routes", "routes, bodies, console panels", 1, 1),
    "facet_worker": ("facets/*: worker parts", "trackers, the Agent's hooks", 3, 1),
    "coordinator": ("coordinator/", "auth · plot · runtime", 2, 2),
    "host": ("coordinator/host/", "the execution host", 0, 2),
    "facet_host": ("facets/*: host parts", "host parts, stories, plots", 1, 2),
    "agent": ("agent/", "the worker side", 3, 2),
    "fold": ("coordinator/fold/", "the pure fold", 0, 3),
    "facet_fold": ("facets/*: folds", "Structs, folds, effects, rows", 1, 3),
    "eventlog": ("eventlog/", "the durable log", 0, 4),
    "migrations": ("migrations/", "the log's schema steps", 1, 4),
    "wire": ("wire/", "the protocol, inputs, codes", 3, 4),
}


def node_of(module: str) -> str | None:
    """The box a module of foldplane belongs to (None: the root package itself)."""
    parts = module.split(".")[1:]
    if not parts:
        return None
    top = parts[0]
    if top in ("cli", "demo") or parts[:2] in (
        ["coordinator", "__main__"],
        ["coordinator", "commands"],
    ):
        return "roots"
    if top == "coordinator":
        if len(parts) > 1 and parts[1] in ("host", "fold"):
            return parts[1]
        return "coordinator"
    if top == "facets":
        if len(parts) > 2 and parts[2] == FACET_WORKER:
            return "facet_worker"
        leaf = parts[-1] if len(parts) > 2 else ""
        if leaf in FACET_API:
            return "facet_api"
        if leaf in FACET_HOST:
            return "facet_host"
        if leaf in FACET_SIM:
            return "sim"
        if leaf in FACET_BENCHMARK:
            return "benchmarks"
        return "facet_fold"
    return top if top in NODES else None


def edges() -> list[tuple[str, str]]:
    """Every (importer box, imported box) pair of the import graph, sorted."""
    import grimp

    graph = grimp.build_graph("foldplane")
    found: set[tuple[str, str]] = set()
    for module in graph.modules:
        a = node_of(module)
        if a is None:
            continue
        for imported in graph.find_modules_directly_imported_by(module):
            b = node_of(imported)
            if b is not None and b != a:
                found.add((a, b))
    return sorted(found)


def _xy(node: str) -> tuple[int, int]:
    _, _, col, row = NODES[node]
    return 40 + col * 240, 60 + row * 120


def draw(pairs: list[tuple[str, str]]) -> str:
    rows = 1 + max(r for *_, r in NODES.values())
    height = 60 + (rows - 1) * 120 + BOX_H + 24
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif">',
        "<title>foldplane's layers: who imports whom, from the import graph</title>",
        '<defs><marker id="g" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6" '
        'markerHeight="6" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#777"/></marker>'
        '<marker id="r" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6" markerHeight="6" '
        'orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#c0392b"/></marker></defs>',
        "<style>.t{font-size:12px;font-weight:bold}.d{font-size:11px}"
        ".l{font-size:11px;fill:#333;font-style:italic}</style>",
        f'<rect width="{WIDTH}" height="{height}" fill="#ffffff"/>',
        '<text x="40" y="30" class="t">foldplane, from its import graph: an arrow A → B says a '
        "module of A imports one of B (red: up a layer)</text>",
    ]
    # where each arrow leaves and arrives along a box's edge: spread by its index there
    leaving: dict[str, list[tuple[str, str]]] = {}
    arriving: dict[str, list[tuple[str, str]]] = {}
    for a, b in pairs:
        leaving.setdefault(a, []).append((a, b))
        arriving.setdefault(b, []).append((a, b))
    for k, (a, b) in enumerate(pairs):
        (ax, ay), (bx, by) = _xy(a), _xy(b)
        i, n = leaving[a].index((a, b)), len(leaving[a])
        j, m = arriving[b].index((a, b)), len(arriving[b])
        x1 = ax + BOX_W * (i + 1) // (n + 1)
        x2 = bx + BOX_W * (j + 1) // (m + 1)
        lane = 6 + 5 * (k % 12)  # each arrow its own lane in the gaps it runs through
        ra, rb = NODES[a][3], NODES[b][3]
        if ra == rb:  # sideways: over the row, through the gap above it
            y = ay - lane // 2 - 4
            points = [(x1, ay), (x1, y), (x2, y), (x2, by)]
        elif rb > ra:  # down: the gap below the source, the gutter right of the target's
            gutter = bx + BOX_W + 4 + lane // 2  # column, the gap above the target
            below, above = ay + BOX_H + lane, by - lane
            points = [(x1, ay + BOX_H), (x1, below), (gutter, below), (gutter, above)]
            points += [(x2, above), (x2, by)]
            if rb == ra + 1:
                points = [(x1, ay + BOX_H), (x1, below), (x2, below), (x2, by)]
        else:  # up: the same, mirrored
            gutter = bx + BOX_W + 4 + lane // 2
            above, below = ay - lane, by + BOX_H + lane
            points = [(x1, ay), (x1, above), (gutter, above), (gutter, below)]
            points += [(x2, below), (x2, by + BOX_H)]
        colour, head = ("#c0392b", "r") if rb < ra else ("#777", "g")
        path = " ".join(f"{x},{y}" for x, y in points)
        out.append(
            f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.1" '
            f'marker-end="url(#{head})"/>'
        )
    for node, (title, description, _, _) in NODES.items():
        x, y = _xy(node)
        out.append(
            f'<rect x="{x}" y="{y}" width="{BOX_W}" height="{BOX_H}" rx="6" fill="#f6f6f6" '
            'stroke="#555" stroke-width="1"/>'
        )
        out.append(f'<text x="{x + 10}" y="{y + 18}" class="t">{escape(title)}</text>')
        out.append(f'<text x="{x + 10}" y="{y + 34}" class="d">{escape(description)}</text>')
    return "\n".join(out) + "\n</svg>\n"


def main(argv: list[str]) -> int:
    svg = draw(edges())
    if "--check" in argv:
        if not OUT.exists() or OUT.read_text() != svg:
            print(f"{OUT.name} is not what {Path(__file__).name} draws; run it", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(svg)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
