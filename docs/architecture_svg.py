"""Draw docs/architecture.svg: ``python docs/architecture_svg.py [--check]``.

The picture is written from this file alone (no renderer, no fonts measured), so the same source
always gives the same bytes; ``--check`` compares instead of writing, and tests/test_docs.py runs
it. Boxes are the packages and the modules that carry the design; arrows are the flows between
them. Change the layers here, not in the SVG.
"""

from __future__ import annotations

import sys
from pathlib import Path
from xml.sax.saxutils import escape

OUT = Path(__file__).resolve().parent / "architecture.svg"
WIDTH, HEIGHT = 1000, 925

#: Fill colours by layer, light enough for black text.
FILL = {
    "worker": "#eef6ee",
    "node": "#e4f0e4",
    "ops": "#f6f1e7",
    "wire": "#e8ecf8",
    "coord": "#fbfbfb",
    "api": "#e8f1fb",
    "roots": "#f1f1f1",
    "host": "#fdf3e6",
    "fold": "#f3ecfa",
    "log": "#fbeaea",
    "inner": "#ffffff",
}


class Svg:
    def __init__(self) -> None:
        self.parts: list[str] = []

    def box(
        self, x: int, y: int, w: int, h: int, lines: list[str], fill: str, title_at: str = "left"
    ) -> None:
        """A rectangle; the first line is its title (bold), the others its description."""
        self.parts.append(
            f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="6" fill="{FILL[fill]}" '
            'stroke="#555" stroke-width="1"/>'
        )
        for i, line in enumerate(lines):
            if i == 0 and title_at == "right":
                self.text(x + w - 10, y + 17, line, "t", anchor="end")
            else:
                self.text(x + 10, y + 17 + 13 * i, line, "t" if i == 0 else "d")

    def text(
        self, x: int, y: int, s: str, cls: str, anchor: str = "start", rotate: int = 0
    ) -> None:
        extra = f' transform="rotate({rotate} {x} {y})"' if rotate else ""
        end = ' text-anchor="end"' if anchor == "end" else ""
        self.parts.append(f'<text x="{x}" y="{y}" class="{cls}"{end}{extra}>{escape(s)}</text>')

    def arrow(self, points: list[tuple[int, int]], both: bool = False) -> None:
        """An orthogonal line through ``points``, with a head at the end (and the start)."""
        pts = " ".join(f"{x},{y}" for x, y in points)
        start = ' marker-start="url(#head)"' if both else ""
        self.parts.append(
            f'<polyline points="{pts}" fill="none" stroke="#333" stroke-width="1.4" '
            f'marker-end="url(#head)"{start}/>'
        )

    def render(self) -> str:
        head = (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
            f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif">\n'
            "<title>foldplane: workers, the wire, the API, the host, the fold and the log</title>\n"
            '<defs><marker id="head" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
            'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#333"/>'
            "</marker></defs>\n"
            "<style>.t{font-size:12px;font-weight:bold}.d{font-size:11px}"
            ".l{font-size:11px;fill:#333;font-style:italic}</style>\n"
            f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>\n'
        )
        return head + "\n".join(self.parts) + "\n</svg>\n"


def draw() -> str:
    s = Svg()
    # -- the worker side: one process per rank, one launcher and relay per node -----------------
    for d in (12, 6):  # the other ranks' workers, behind this one
        s.parts.append(
            f'<rect x="{30 + d}" y="{36 - d}" width="560" height="200" rx="6" '
            f'fill="{FILL["worker"]}" stroke="#999" stroke-width="1"/>'
        )
    s.box(30, 36, 560, 200, ["worker process, one per rank (agent/)"], "worker")
    s.box(
        50, 62, 520, 44,
        ["training loop · elastic DDP (agent/ddp.py)",
         'init_process_group("foldplane") · pg.all_reduce(t) → Work → wait() → bool'],
        "inner",
    )  # fmt: skip
    s.box(
        50, 126, 250, 94,
        ["data plane (agent/dataplane/)", "one gloo / NCCL group per view,",
         "collectives between the ranks,", "failed_ranks_hint: who failed,",
         "fails fast on a dead peer"],
        "inner",
    )  # fmt: skip
    s.box(330, 140, 105, 64, ["host thread", "agent/host.py", "HTTP, timers"], "inner")
    s.box(455, 140, 125, 64, ["AgentMachine", "agent/machine.py", "sans-I/O"], "inner")
    s.arrow([(175, 106), (175, 126)], both=True)
    s.arrow([(300, 172), (330, 172)], both=True)
    s.arrow([(435, 172), (455, 172)], both=True)
    s.box(
        330, 256, 260, 76,
        ["per node: launcher + relay", "agent/launch.py · agent/relay/",
         "starts workers, reports deaths,", "one host channel per node"],
        "node",
    )  # fmt: skip
    s.arrow([(382, 204), (382, 256)], both=True)
    s.text(388, 250, "local HTTP", "l")
    s.box(
        620, 36, 350, 96,
        ["operators and schedulers", "POST /groups · POST /proposals?wait=",
         "GET /views/history · /events · /events/stream", "the console: GET /ui",
         "python -m coordinator replay · compact · explain"],
        "ops",
    )  # fmt: skip

    # -- the wire between them --------------------------------------------------------------------
    s.parts.append(
        f'<rect x="20" y="350" width="960" height="44" fill="{FILL["wire"]}" stroke="#8890b0" '
        'stroke-dasharray="5,3"/>'
    )
    s.text(
        110,
        377,
        "HTTP and the host channel (WebSocket) · the agent wire protocol and its codes, in wire/",
        "t",
    )
    s.text(96, 290, "TCPStore in the coordinator:", "l")
    s.text(96, 303, "rendezvous, liveness counters,", "l")
    s.text(96, 316, "the view's poison notice", "l")
    s.text(466, 420, "agent events, deaths,", "l")
    s.text(466, 433, "pushed updates", "l")
    s.text(646, 420, "operator routes, /ui, SSE", "l")
    s.text(826, 420, "command line", "l")

    # -- the coordinator process ------------------------------------------------------------------
    s.parts.append(
        f'<rect x="30" y="410" width="940" height="500" rx="8" fill="{FILL["coord"]}" '
        'stroke="#333" stroke-width="1.5"/>'
    )
    s.text(
        42, 902,
        "coordinator process: one leader; standbys fold the same PostgreSQL log and take over",
        "t",
    )  # fmt: skip
    s.box(
        300, 452, 370, 56,
        ["api/ — FastAPI: operator and agent routes", "auth, validation, limits: bad input gets a 4xx",
         "agent hot paths ahead of routing (fastpath.py)"],
        "api",
    )  # fmt: skip
    s.box(
        690, 452, 260, 56,
        ["the composition roots", "cli.py · demo.py (the root)", "coordinator/__main__.py · commands.py"],
        "roots",
    )  # fmt: skip
    s.arrow([(460, 332), (460, 452)], both=True)
    s.arrow([(640, 132), (640, 452)])
    s.arrow([(820, 132), (820, 452)])
    s.arrow([(690, 480), (670, 480)])

    s.box(50, 522, 900, 186, ["coordinator/host/ — the execution host"], "host", title_at="right")
    s.box(
        65, 550, 210, 50,
        ["store_server.py", "hosts the TCPStore of the", "data planes' process groups"],
        "inner",
    )  # fmt: skip
    s.box(
        290, 550, 645, 50,
        ["loop.py — one serialized loop: check → append → step the fold → carry out the effects",
         "a tick when next_deadline() passes · woken readers answered in shares · snapshots"],
        "inner",
    )  # fmt: skip
    s.box(65, 610, 145, 44, ["journal.py", "update journals"], "inner")
    s.box(220, 610, 145, 44, ["leadership.py", "lease and term"], "inner")
    s.box(375, 610, 145, 44, ["replica.py", "a standby's fold"], "inner")
    s.box(
        65, 664, 455, 34,
        ["compaction · retention · replay · story · metrics · facets.py"],
        "inner",
    )  # fmt: skip
    s.arrow([(90, 220), (90, 550)], both=True)  # drawn over the boxes it crosses
    s.arrow([(400, 508), (400, 550)])
    s.text(406, 533, "inputs", "l")
    s.arrow([(520, 550), (520, 508)])
    s.text(526, 533, "answers, pushes, long polls, SSE", "l")

    s.box(
        50, 728, 900, 56,
        ["coordinator/fold/ — the pure fold: step(record) → effects; deterministic, no I/O, no clock",
         "machine.py: each input (wire/inputs.py) to its rule: fencing · ranks · healthy_set · proposals · barrier · …",
         "facets beside membership, one folder each (facets/: epochs · refits · lighthouse · rendezvous)"],
        "fold",
    )  # fmt: skip
    s.arrow([(700, 600), (700, 728)])
    s.text(706, 670, "step(durable record)", "l")
    s.arrow([(850, 728), (850, 600)])
    s.text(856, 670, "effects", "l")

    s.box(50, 804, 900, 80, ["eventlog/ — the durable append-only log"], "log")
    s.box(
        65, 832, 430, 42,
        ["SQLite (eventlog/sqlite.py)", "WAL, synchronous=FULL, one group-commit writer thread"],
        "inner",
    )  # fmt: skip
    s.box(
        505, 832, 430, 42,
        ["PostgreSQL (eventlog/postgres.py)", "shared by the coordinators; every append fenced by term"],
        "inner",
    )  # fmt: skip
    s.arrow([(935, 575), (962, 575), (962, 844), (950, 844)])
    s.text(956, 798, "append (durable)", "l", anchor="end")
    return s.render()


def main(argv: list[str]) -> int:
    svg = draw()
    if "--check" in argv:
        if not OUT.exists() or OUT.read_text() != svg:
            print(f"{OUT.name} is not what {Path(__file__).name} draws; run it", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(svg)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
