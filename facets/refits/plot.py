"""The refits facet's panel in ``replay --plot`` (``coordinator/plot.py``): a lane per refit
(over the ``--group`` asked for, if any): its admitted epochs shaded, a tick where each epoch
began, and each transfer attempt as a bar from its start to its end, green completed, red
failed (labelled), grey still running."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...coordinator.fold.effects import Effect
from ...coordinator.fold.machine import Coordinator
from ...coordinator.plot import FacetPanel
from ...eventlog import Record
from .effects import RefitEpochChanged, TransferChanged

#: Refit lanes drawn in the refit panel (the first by name; the rest are counted).
REFIT_LANES = 8
TRANSFER_COLOURS = {"completed": "#3a9d4a", "failed": "#d0452f", "running": "#999999"}
ADMITTED_COLOUR = "#e3eef7"


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


class RefitPanel(FacetPanel):
    """Per refit (over ``group`` when one is asked for): its epochs and transfer attempts."""

    def __init__(self, group: str | None = None) -> None:
        super().__init__(group)
        self.refits: dict[str, RefitLane] = {}

    def on_record(self, record: Record, effects: list[Effect], machine: Coordinator) -> None:
        for effect in effects:
            if isinstance(effect, RefitEpochChanged):
                lane = self._refit(effect.refit, effect.groups)
                if lane is not None:
                    lane.epochs.append((record.ts, effect.epoch, effect.status, effect.cause))
            elif isinstance(effect, TransferChanged):
                lane = self._refit(effect.refit, effect.groups)
                if lane is not None:
                    lane.transfer(record.ts, effect)

    def _refit(self, name: str, groups: tuple[str, str]) -> RefitLane | None:
        if self.group is not None and self.group not in groups:
            return None
        return self.refits.setdefault(name, RefitLane(groups))

    def height(self) -> float | None:
        shown = min(REFIT_LANES, len(self.refits))
        return max(1.6, 0.6 * shown) if shown else None

    def draw(self, ax: Any, main: Any, views: list[dict[str, Any]], plt: Any) -> None:
        refits = sorted(self.refits.items())[:REFIT_LANES]
        _draw_refits(ax, refits, len(self.refits), views, plt)
        if views:
            ax.set_xlim(main.get_xlim())


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


PANEL = RefitPanel
