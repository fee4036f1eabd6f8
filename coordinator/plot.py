"""``replay --plot FILE``: the view history as a picture, for a postmortem.

One step line per group: active ranks per committed version over time (seconds since the
group's first view), a marker per version coloured by its cause (formation, proposal,
auto-deactivation) and labelled with the version and the ranks that left or joined.

When the log holds epoch plans (docs/data.md), a second panel below, on the same time axis,
draws the data plan of one group (the ``--group`` asked for, else the first that has one): a
lane per rank, and in it, as filled steps, how many positions of the epoch the rank *held*
(light: it grows when the rank takes over a leaver's remainder, shrinks when it gives some up)
and how many it had *processed* (dark, as the coordinator accepted them); each move of a
committed decision is an arrow from the donor's lane to the taker's, labelled with its size;
dashed lines mark where each epoch was planned and where it completed. When the log holds
refits (docs/refit.md), a last panel draws a lane per refit (over the ``--group`` asked for,
if any): its admitted epochs shaded, a tick where each epoch began, and each transfer attempt
as a bar from its start to its end, green completed, red failed (labelled), grey still
running. The data comes from the same fold as the view history (:class:`EpochTimeline` sees
every record replay folds).

PNG or SVG, chosen by the file's extension. matplotlib is imported only here, and only when a
plot is asked for (it is the ``[plot]`` extra), with its file-only backend: no display is
needed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from foldplane.coordinator.fold.effects import (
    AssignmentChanged,
    Effect,
    EpochCompleted,
    EpochPlanned,
    RefitEpochChanged,
    Refused,
    TransferChanged,
    ViewCommitted,
)
from foldplane.coordinator.fold.machine import Coordinator
from foldplane.coordinator.fold.reasons import ranks_text
from foldplane.eventlog import Record

FORMATS = {".png": "png", ".svg": "svg"}
CAUSE_COLOURS = {
    "formation": "#2b7bba",
    "proposal": "#3a9d4a",
    "auto_deactivation": "#d0452f",
}
#: Labels beyond this many versions per group would overlap; only the changes are labelled then.
LABEL_ALL = 40
#: Rank lanes drawn in the data panel (the lowest ranks that held a part; the rest are counted).
LANES = 32
#: Moves labelled with their size; beyond this many per decision only the arrows are drawn.
MOVE_LABELS = 8
HELD_COLOUR, PROCESSED_COLOUR, MOVE_COLOUR = "#b9d3ea", "#2b5d8a", "#d0452f"
#: Refit lanes drawn in the refit panel (the first by name; the rest are counted).
REFIT_LANES = 8
TRANSFER_COLOURS = {"completed": "#3a9d4a", "failed": "#d0452f", "running": "#999999"}
ADMITTED_COLOUR = "#e3eef7"


# -- what the data panel draws, gathered while replay folds ----------------------------------


@dataclass
class EpochDecision:
    """An epoch plan, a move or an epoch's end, at log time ``ts``."""

    ts: int
    epoch: int
    kind: str  # "planned", "moved" or "completed"
    #: ``(from_rank, to_rank, positions)`` per pair of ranks that moved positions
    moves: list[tuple[int, int, int]] = field(default_factory=list)
    cause: str = ""


@dataclass
class GroupTimeline:
    #: the time of the group's first committed view (the plot's zero)
    t0: int | None = None
    #: per rank: ``(ts, epoch, held, processed)`` each time either changed
    lanes: dict[int, list[tuple[int, int, int, int]]] = field(default_factory=dict)
    decisions: list[EpochDecision] = field(default_factory=list)

    def point(self, rank: int, ts: int, epoch: int, held: int, processed: int) -> None:
        lane = self.lanes.setdefault(rank, [])
        if lane and lane[-1][1:] == (epoch, held, processed):
            return
        lane.append((ts, epoch, held, processed))


@dataclass
class TransferSpan:
    """One attempt of a transfer: started at ``start``, ended at ``end`` (None: still
    running at the end of the log) as ``status``."""

    key: str
    attempt: int
    start: int
    end: int | None = None
    status: str = "running"
    detail: str = ""


@dataclass
class RefitLane:
    """What the refit panel draws of one refit."""

    groups: tuple[str, str]
    #: ``(ts, epoch, status, cause)`` each time the epoch changed status
    epochs: list[tuple[int, int, str, str]] = field(default_factory=list)
    transfers: list[TransferSpan] = field(default_factory=list)

    def transfer(self, ts: int, effect: TransferChanged) -> None:
        span = next(
            (
                t
                for t in reversed(self.transfers)
                if (t.key, t.attempt) == (effect.key, effect.attempt)
            ),
            None,
        )
        if span is None:
            span = TransferSpan(effect.key, effect.attempt, ts)
            self.transfers.append(span)
        if effect.status != "running":
            span.end, span.status, span.detail = ts, effect.status, effect.detail


class EpochTimeline:
    """The data panel's input, gathered from the records replay folds (pass :meth:`fresh` as
    replay's ``on_record``): per group, each rank's held and processed counts over log time,
    and the plans, moves and ends. It keeps a point only when a count changed."""

    def __init__(self, group: str | None = None) -> None:
        self.group = group
        self.groups: dict[str, GroupTimeline] = {}
        #: per refit (over ``group`` when one is asked for): its epochs and transfer attempts
        self.refits: dict[str, RefitLane] = {}

    def fresh(self) -> Any:
        """The hook for one replay attempt (a retried replay starts over)."""
        self.groups = {}
        self.refits = {}
        return self.on_record

    def on_record(self, record: Record, effects: list[Effect], machine: Coordinator) -> None:
        for effect in effects:
            if isinstance(effect, ViewCommitted):
                g = self._timeline(effect.view.group)
                if g is not None and g.t0 is None:
                    g.t0 = record.ts
            elif isinstance(effect, EpochPlanned | AssignmentChanged):
                g = self._timeline(effect.group)
                if g is None:
                    continue
                if isinstance(effect, EpochPlanned):
                    for r in effect.ranges:
                        held = r.processed + sum(n for _, n in r.remaining)
                        g.point(r.rank, record.ts, effect.epoch, held, r.processed)
                    g.decisions.append(EpochDecision(record.ts, effect.epoch, "planned"))
                else:
                    # a move carries only what moved: the parts after it are the fold's
                    e = machine.facet("epochs").epoch(effect.group)
                    touched = {m.from_rank for m in effect.moves} | {
                        m.to_rank for m in effect.moves
                    }
                    for rank in sorted(touched):
                        h = None if e is None else e.holdings.get(rank)
                        if h is not None:
                            g.point(rank, record.ts, effect.epoch, h.held, h.processed)
                    pairs: dict[tuple[int, int], int] = {}
                    for m in effect.moves:  # a donor's tail may be several segments
                        pairs[(m.from_rank, m.to_rank)] = (
                            pairs.get((m.from_rank, m.to_rank), 0) + m.length
                        )
                    moves = [(a, b, n) for (a, b), n in pairs.items()]
                    g.decisions.append(
                        EpochDecision(record.ts, effect.epoch, "moved", moves, effect.cause)
                    )
            elif isinstance(effect, EpochCompleted):
                g = self._timeline(effect.group)
                if g is not None:
                    g.decisions.append(EpochDecision(record.ts, effect.epoch, "completed"))
            elif isinstance(effect, RefitEpochChanged):
                lane = self._refit(effect.refit, effect.groups)
                if lane is not None:
                    lane.epochs.append((record.ts, effect.epoch, effect.status, effect.cause))
            elif isinstance(effect, TransferChanged):
                lane = self._refit(effect.refit, effect.groups)
                if lane is not None:
                    lane.transfer(record.ts, effect)
        if record.kind == "progress" and record.group is not None and record.rank is not None:
            if any(isinstance(e, Refused) for e in effects):
                return
            g = self._timeline(record.group)
            e = machine.facet("epochs").epoch(record.group)
            if g is None or e is None or e.number != record.payload.get("epoch"):
                return
            h = e.holdings.get(record.rank)
            if h is not None:
                g.point(record.rank, record.ts, e.number, h.held, h.processed)

    def _timeline(self, group: str) -> GroupTimeline | None:
        if self.group is not None and group != self.group:
            return None
        return self.groups.setdefault(group, GroupTimeline())

    def _refit(self, name: str, groups: tuple[str, str]) -> RefitLane | None:
        if self.group is not None and self.group not in groups:
            return None
        return self.refits.setdefault(name, RefitLane(groups))

    def shown(self) -> tuple[str, GroupTimeline] | None:
        """The group the data panel draws: the first (by name) with an epoch plan."""
        for name in sorted(self.groups):
            if self.groups[name].decisions:
                return name, self.groups[name]
        return None


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


def plot_views(views: list[dict[str, Any]], path: str, epochs: EpochTimeline | None = None) -> None:
    """Draw ``views`` (view documents, as replay reports them) to ``path``, and below them the
    data plan of ``epochs`` when it holds one, and its refits when there are any."""
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
    data = epochs.shown() if epochs is not None else None
    refits = sorted(epochs.refits.items())[:REFIT_LANES] if epochs is not None else []
    heights = [4.5]
    if data is not None:
        heights.append(max(3.0, 0.45 * min(LANES, len(data[1].lanes))))
    if refits:
        heights.append(max(1.6, 0.6 * len(refits)))
    fig, axes = plt.subplots(
        len(heights),
        1,
        figsize=(10, sum(heights)),
        dpi=100,
        squeeze=False,
        gridspec_kw={"height_ratios": heights},
    )
    ax = axes[0][0]
    dax = axes[1][0] if data is not None else None
    rax = axes[-1][0] if refits else None
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
        if data is not None:
            t0 = min((v["ts"] for v in views if v["group"] == data[0]), default=None)
            _draw_epochs(dax, data[0], data[1], t0, plt)
            dax.set_xlim(ax.get_xlim())
        if refits:
            assert epochs is not None
            _draw_refits(rax, refits, len(epochs.refits), views, plt)
            if views:
                rax.set_xlim(ax.get_xlim())
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


def _draw_epochs(ax: Any, group: str, g: GroupTimeline, t0: int | None, plt: Any) -> None:
    """A lane per rank: held (light) and processed (dark) positions as filled steps, scaled to
    the largest part any rank held; moves as arrows; plans and ends as dashed lines."""
    zero = t0 if t0 is not None else (g.t0 or 0)
    ranks = sorted(g.lanes)[:LANES]
    row = {r: i for i, r in enumerate(ranks)}
    end = max([ts for lane in g.lanes.values() for ts, *_ in lane] + [d.ts for d in g.decisions])
    tail = (end - zero) / 1e9 * 1.02 + 0.1
    scale = max((held for lane in g.lanes.values() for _, _, held, _ in lane), default=1) or 1
    for rank in ranks:
        lane = g.lanes[rank]
        xs = [(ts - zero) / 1e9 for ts, *_ in lane] + [tail]
        base = row[rank]
        for index, colour in ((2, HELD_COLOUR), (3, PROCESSED_COLOUR)):
            ys = [base + 0.8 * point[index] / scale for point in lane]
            ax.fill_between(xs, base, [*ys, ys[-1]], step="post", color=colour, linewidth=0)
    for d in g.decisions:
        x = (d.ts - zero) / 1e9
        if d.kind in ("planned", "completed"):
            ax.axvline(x, color="#555555", linestyle="--", linewidth=0.8)
            ax.annotate(
                f"epoch {d.epoch} {d.kind}",
                (x, len(ranks) - 0.1),
                textcoords="offset points",
                xytext=(3, 0),
                fontsize="x-small",
                va="top",
            )
            continue
        for i, (giver, taker, n) in enumerate(d.moves):
            if giver not in row or taker not in row:
                continue
            at = x + i * tail * 0.006  # the moves of one decision side by side
            ax.annotate(
                "",
                xy=(at, row[taker] + 0.4),
                xytext=(at, row[giver] + 0.4),
                arrowprops={"arrowstyle": "->", "color": MOVE_COLOUR, "linewidth": 1.0},
            )
            if i < MOVE_LABELS:
                ax.annotate(
                    f"{n:,}",
                    (at, row[taker] + 0.4),
                    textcoords="offset points",
                    xytext=(3, -3 - 7 * (i % 3)),
                    fontsize="xx-small",
                    color=MOVE_COLOUR,
                )
    ax.set_yticks([row[r] + 0.4 for r in ranks], [f"rank {r}" for r in ranks])
    ax.set_ylim(-0.2, len(ranks) + 0.2)
    ax.set_xlabel("seconds since the group's first view")
    more = f" (the first {LANES} of {len(g.lanes)} ranks)" if len(g.lanes) > LANES else ""
    ax.set_title(f"data plan of group {group}: positions held and processed per rank{more}")
    ax.legend(
        handles=[
            plt.Rectangle((0, 0), 1, 1, color=HELD_COLOUR, label="held"),
            plt.Rectangle((0, 0), 1, 1, color=PROCESSED_COLOUR, label="processed"),
            plt.Line2D([], [], color=MOVE_COLOUR, label="a move (positions)"),
        ],
        loc="upper right",
        fontsize="x-small",
    )
    ax.grid(True, axis="x", alpha=0.3)


def _draw_refits(
    ax: Any,
    refits: list[tuple[str, RefitLane]],
    total: int,
    views: list[dict[str, Any]],
    plt: Any,
) -> None:
    """A lane per refit: its admitted epochs shaded, a tick where each epoch began (labelled
    with its number), and each transfer attempt as a bar from its start to its end, coloured
    by how it ended (a failed one labelled with its key and attempt)."""
    publisher = refits[0][1].groups[0]
    times = [ts for _, lane in refits for ts, *_ in lane.epochs]
    times += [t.end or t.start for _, lane in refits for t in lane.transfers]
    zero = min((v["ts"] for v in views if v["group"] == publisher), default=min(times))
    tail = (max(times) - zero) / 1e9 * 1.02 + 0.1
    for row, (_, lane) in enumerate(refits):
        marks = lane.epochs
        for i, (ts, epoch, status, _cause) in enumerate(marks):
            x = (ts - zero) / 1e9
            nxt = (marks[i + 1][0] - zero) / 1e9 if i + 1 < len(marks) else tail
            if status == "admitted":
                ax.fill_between([x, nxt], row, row + 0.8, color=ADMITTED_COLOUR, linewidth=0)
            elif status == "waiting":
                ax.plot([x, x], [row, row + 0.8], color="#555555", linewidth=0.8)
                ax.annotate(
                    f"e{epoch}",
                    (x, row + 0.8),
                    textcoords="offset points",
                    xytext=(2, -7),
                    fontsize="xx-small",
                )
        for t in lane.transfers:
            x0 = (t.start - zero) / 1e9
            x1 = (t.end - zero) / 1e9 if t.end is not None else tail
            colour = TRANSFER_COLOURS.get(t.status, "#777777")
            ax.plot([x0, max(x1, x0 + tail * 0.004)], [row + 0.3] * 2, color=colour, linewidth=4)
            if t.status == "failed":
                ax.annotate(
                    f"{t.key} #{t.attempt} failed",
                    (x1, row + 0.3),
                    textcoords="offset points",
                    xytext=(2, -9),
                    fontsize="xx-small",
                    color=colour,
                )
    ax.set_yticks(
        [i + 0.4 for i in range(len(refits))],
        [f"{name} ({lane.groups[0]} -> {lane.groups[1]})" for name, lane in refits],
        fontsize="x-small",
    )
    ax.set_ylim(-0.2, len(refits) + 0.2)
    ax.set_xlabel(f"seconds since group {publisher}'s first view")
    more = f" (the first {REFIT_LANES} of {total})" if total > REFIT_LANES else ""
    ax.set_title(f"refits: epochs and transfers{more}")
    ax.legend(
        handles=[
            plt.Rectangle((0, 0), 1, 1, color=ADMITTED_COLOUR, label="epoch admitted"),
            *(
                plt.Line2D([], [], color=c, linewidth=4, label=f"transfer {s}")
                for s, c in TRANSFER_COLOURS.items()
            ),
        ],
        loc="best",
        fontsize="x-small",
    )
    ax.grid(True, axis="x", alpha=0.3)
