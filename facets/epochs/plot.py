"""The epochs facet's panel in ``replay --plot`` (``coordinator/plot.py``): the data plan of
one group (the ``--group`` asked for, else the first that has one): a lane per rank, and in it,
as filled steps, how many positions of the epoch the rank *held* (light: it grows when the rank
takes over a leaver's remainder, shrinks when it gives some up) and how many it had *processed*
(dark, as the coordinator accepted them); each move of a committed decision is an arrow from
the donor's lane to the taker's, labelled with its size; dashed lines mark where each epoch was
planned and where it completed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...coordinator.fold.effects import Effect, Refused, ViewCommitted
from ...coordinator.fold.machine import Coordinator
from ...coordinator.plot import FacetPanel
from ...eventlog import Record
from .effects import (
    AssignmentChanged,
    EpochCompleted,
    EpochPlanned,
)

#: Rank lanes drawn in the data panel (the lowest ranks that held a part; the rest are counted).
LANES = 32
#: Moves labelled with their size; beyond this many per decision only the arrows are drawn.
MOVE_LABELS = 8
HELD_COLOUR, PROCESSED_COLOUR, MOVE_COLOUR = "#b9d3ea", "#2b5d8a", "#d0452f"


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


class EpochPanel(FacetPanel):
    """The data panel's input, gathered from the records replay folds: per group, each rank's
    held and processed counts over log time, and the plans, moves and ends. It keeps a point
    only when a count changed."""

    def __init__(self, group: str | None = None) -> None:
        super().__init__(group)
        self.groups: dict[str, GroupTimeline] = {}

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

    def shown(self) -> tuple[str, GroupTimeline] | None:
        """The group the data panel draws: the first (by name) with an epoch plan."""
        for name in sorted(self.groups):
            if self.groups[name].decisions:
                return name, self.groups[name]
        return None

    def height(self) -> float | None:
        data = self.shown()
        return None if data is None else max(3.0, 0.45 * min(LANES, len(data[1].lanes)))

    def draw(self, ax: Any, main: Any, views: list[dict[str, Any]], plt: Any) -> None:
        data = self.shown()
        assert data is not None
        t0 = min((v["ts"] for v in views if v["group"] == data[0]), default=None)
        _draw_epochs(ax, data[0], data[1], t0, plt)
        ax.set_xlim(main.get_xlim())


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


PANEL = EpochPanel
