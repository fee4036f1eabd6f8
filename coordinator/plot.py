"""``replay --plot FILE``: the view history as a picture, for a postmortem.

One step line per group: active ranks per committed version over time (seconds since the
group's first view), a marker per version coloured by its cause (formation, proposal,
auto-deactivation) and labelled with the version and the ranks that left or joined.

Below it, on the same time axis, each facet that has something to show draws its panel (a
:class:`FacetPanel`, the module its plugin names as ``plot``, ``coordinator/fold/registry.py``),
in the facets' order: the data plan of one group's epochs (docs/data.md), the refits' epochs
and transfers (docs/refit.md). The panels' data comes from the same fold as the view history
(:class:`Timeline` hands them every record replay folds).

PNG or SVG, chosen by the file's extension. matplotlib is imported only here, and only when a
plot is asked for (it is the ``[plot]`` extra), with its file-only backend: no display is
needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..eventlog import Record
from .fold import registry
from .fold.effects import Effect
from .fold.machine import Coordinator
from .fold.reasons import ranks_text

FORMATS = {".png": "png", ".svg": "svg"}
CAUSE_COLOURS = {
    "formation": "#2b7bba",
    "proposal": "#3a9d4a",
    "exit": "#8c8c8c",
    "auto_deactivation": "#d0452f",
    "reconfigure": "#8a5bb5",
}
#: Labels beyond this many versions per group would overlap; only the changes are labelled then.
LABEL_ALL = 40


# -- what the facets' panels draw, gathered while replay folds --------------------------------


class FacetPanel:
    """A facet's panel below the view history: it sees every record replay folds
    (:meth:`on_record`), says how tall it is (:meth:`height`; None: nothing to draw) and draws
    itself on its own axes. ``group``: the ``--group`` asked for, if any."""

    def __init__(self, group: str | None = None) -> None:
        self.group = group

    def on_record(self, record: Record, effects: list[Effect], machine: Coordinator) -> None:
        """One record folded, with its effects and the fold just after it."""

    def height(self) -> float | None:
        return None

    def draw(self, ax: Any, main: Any, views: list[dict[str, Any]], plt: Any) -> None:
        """Draw on ``ax``; ``main`` is the view history's axes, ``views`` its documents."""


class Timeline:
    """The panels' input (pass :meth:`fresh` as replay's ``on_record``): one panel per facet
    that has one, in the facets' order."""

    def __init__(self, group: str | None = None) -> None:
        self.group = group
        self.panels: dict[str, FacetPanel] = {}

    def fresh(self) -> Any:
        """The hook for one replay attempt (a retried replay starts over)."""
        self.panels = {
            p.name: module.PANEL(self.group)
            for p in registry.plugins()
            if (module := registry.part(p, "plot")) is not None
        }
        return self.on_record

    def panel(self, name: str) -> Any:
        """The panel of the facet named ``name``."""
        return self.panels[name]

    def on_record(self, record: Record, effects: list[Effect], machine: Coordinator) -> None:
        for panel in self.panels.values():
            panel.on_record(record, effects, machine)


class PlotError(Exception):
    """The plot cannot be written: an unknown extension, or matplotlib is not installed."""


def check_target(path: str) -> str:
    """The format for ``path`` (``png`` or ``svg``), or :class:`PlotError` naming the problem:
    a wrong extension, or no matplotlib to draw with (checked before a replay, not after)."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise PlotError(f"{path!r} must end in .png or .svg (got {suffix or 'no extension'!r})")
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise PlotError(
            f"matplotlib is not installed ({exc}); pip install 'foldplane[plot]'"
        ) from None
    return FORMATS[suffix]


def plot_views(views: list[dict[str, Any]], path: str, timeline: Timeline | None = None) -> None:
    """Draw ``views`` (view documents, as replay reports them) to ``path``, and below them each
    panel of ``timeline`` that has something to draw."""
    fmt = check_target(path)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError as exc:
        raise PlotError(
            f"matplotlib is not installed ({exc}); pip install 'foldplane[plot]'"
        ) from None

    by_group: dict[str, list[dict[str, Any]]] = {}
    for view in views:
        by_group.setdefault(view["group"], []).append(view)
    heights = [4.5]
    panels = []
    for panel in timeline.panels.values() if timeline is not None else ():
        height = panel.height()
        if height is not None:
            heights.append(height)
            panels.append(panel)
    fig, axes = plt.subplots(
        len(heights),
        1,
        figsize=(10, sum(heights)),
        dpi=100,
        squeeze=False,
        gridspec_kw={"height_ratios": heights},
    )
    ax = axes[0][0]
    try:
        if not by_group:
            ax.text(
                0.5, 0.5, "no committed views", ha="center", va="center", transform=ax.transAxes
            )
        for group in sorted(by_group):
            _draw_group(ax, group, sorted(by_group[group], key=lambda v: v["version"]))
        ax.set_xlabel("seconds since the group's first view")
        ax.set_ylabel("active ranks")
        ax.set_title("foldplane view history")
        ax.grid(True, alpha=0.3)
        handles = [
            plt.Line2D([], [], marker="o", linestyle="", color=colour, label=cause)
            for cause, colour in CAUSE_COLOURS.items()
        ]
        lines = [h for h in ax.get_lines() if not h.get_label().startswith("_")]
        ax.legend(handles=[*lines, *handles], loc="best", fontsize="small")
        top = max((len(v["active_ranks"]) for v in views), default=1)
        ax.set_ylim(0, top * 1.15 + 0.5)
        ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.margins(x=0.08)
        for i, panel in enumerate(panels, start=1):
            panel.draw(axes[i][0], ax, views, plt)
        fig.tight_layout()
        fig.savefig(path, format=fmt)
    finally:
        plt.close(fig)


def _draw_group(ax: Any, group: str, views: list[dict[str, Any]]) -> None:
    t0 = views[0]["ts"]
    xs = [(v["ts"] - t0) / 1e9 for v in views]
    ys = [len(v["active_ranks"]) for v in views]
    # the last version holds until the end of the history: draw it as a segment, not a point
    tail = xs[-1] + ((xs[-1] - xs[0]) * 0.1 or 1.0)
    ax.step([*xs, tail], [*ys, ys[-1]], where="post", label=f"group {group}", linewidth=1.5)
    previous: set[int] = set()
    for i, (x, y, view) in enumerate(zip(xs, ys, views, strict=True)):
        active = set(view["active_ranks"])
        left, joined = previous - active, active - previous
        previous = active
        kind = view["cause"].get("kind", "?")
        ax.plot([x], [y], marker="o", color=CAUSE_COLOURS.get(kind, "#777777"), zorder=3)
        if len(views) > LABEL_ALL and i and not (left or joined):
            continue
        label = f"v{view['version']}"
        if left:
            label += f" -{ranks_text(left, limit=4)}"
        if joined and i:
            label += f" +{ranks_text(joined, limit=4)}"
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, 6), fontsize="x-small")
