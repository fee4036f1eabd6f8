"""``replay --plot FILE``: the view history as a picture, for a postmortem.

One step line per group: active ranks per committed version over time (seconds since the
group's first view), a marker per version coloured by its cause (formation, proposal,
auto-deactivation) and labelled with the version and the ranks that left or joined. PNG or SVG,
chosen by the file's extension. matplotlib is imported only here, and only when a plot is
asked for (it is the ``[plot]`` extra), with its file-only backend: no display is needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from coordinator.fold.reasons import ranks_text

FORMATS = {".png": "png", ".svg": "svg"}
CAUSE_COLOURS = {
    "formation": "#2b7bba",
    "proposal": "#3a9d4a",
    "auto_deactivation": "#d0452f",
}
#: Labels beyond this many versions per group would overlap; only the changes are labelled then.
LABEL_ALL = 40


class PlotError(Exception):
    """The plot cannot be written: an unknown extension, or matplotlib is not installed."""


def check_target(path: str) -> str:
    """The format for ``path`` (``png`` or ``svg``), or :class:`PlotError` naming the problem."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise PlotError(f"{path!r} must end in .png or .svg (got {suffix or 'no extension'!r})")
    return FORMATS[suffix]


def plot_views(views: list[dict[str, Any]], path: str) -> None:
    """Draw ``views`` (view documents, as replay reports them) to ``path``."""
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
    fig, ax = plt.subplots(figsize=(10, 4.5), dpi=100)
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
