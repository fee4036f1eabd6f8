"""Data that survives a dead rank: the epoch's part of this rank, and the torch ``Sampler`` that
reads it (docs/data.md).

>>> sampler = ElasticSampler(len(dataset))          # the foldplane default group's agent
>>> loader = DataLoader(dataset, batch_size=32, sampler=sampler, num_workers=2)
>>> for epoch in range(epochs):
...     sampler.set_epoch(epoch)                      # every rank: the same plan, declared once
...     while sampler.next_pass():                    # False once the whole epoch is processed
...         for batch in loader:                      # one pass over what this rank holds
...             train_step(batch)
...             sampler.mark_processed(len(batch))    # these samples are done: reported

The coordinator gives each active rank a *sequence* of ranges of the epoch's permutation
(the facet's ``fold.py``); the facet's worker part follows it:

- ``EpochTracker`` (``tracker.py``, one per agent, ``agent.data``) holds what the coordinator
  said about this rank's part (the plan, the latest assignment, the epoch's end) and reports
  progress through the agent: one report in flight, the newest replacing one not yet sent.
- :class:`ElasticSampler` yields the dataset indices of this rank's positions, in order. It
  never runs more than the plan's ``lookahead`` positions ahead of the progress the
  coordinator has accepted (the coordinator moves only positions beyond that window, so what
  it hands out is never taken away), and reports early enough that the window keeps moving.
  A pass over the loader reads what the rank holds, including what it is given meanwhile (a
  dead rank's remainder, a reclaim); the pass ends when the part is used up, so the loader can
  hand out its last, partial batch. :meth:`ElasticSampler.next_pass` then reports everything
  processed and waits: for more work (another pass) or for the epoch's end.

A position is *processed* when the training loop says so (``mark_processed``), in the order
the sampler yielded them; what a rank yielded and did not report when it died is read again by
the ranks that take its remainder over. The count follows the part (``cursor.ReadCursor``,
kept by the tracker and moved with every change of the part under the same lock): a position
yielded from a share this rank no longer holds (a deactivation took it, a resync replaced it)
counts nothing when it is marked, so every report counts positions of the part it is sent
against and a late mark is never credited to a share given after it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import Sampler

from ..cursor import ReadCursor
from .tracker import EpochError, EpochTracker


class ElasticSampler(Sampler[int]):
    """A torch ``Sampler`` over this rank's part of each epoch (see the module docstring).

    ``dataset_size`` is the dataset's length (or pass the dataset). The plan's fields
    (``seed``, ``shuffle``, ``split``: ``"equal"``, ``"ratios"`` with ``partition_ratios``,
    or ``"throughput"``; ``grain``, ``lookahead``, ``reclaim``) are declared by
    :meth:`set_epoch`, identically on every rank; see docs/data.md. ``agent`` defaults to the
    agent of the foldplane default group (``dist.init_process_group("foldplane")``).
    ``wait_s`` bounds every wait for the coordinator (None: wait as long as it takes).
    """

    def __init__(
        self,
        dataset_size: int | Sequence[Any],
        agent: Any = None,
        *,
        seed: int = 0,
        shuffle: bool = True,
        split: str = "equal",
        partition_ratios: Sequence[float] | None = None,
        grain: int = 1,
        lookahead: int = 1024,
        reclaim: bool | None = None,
        wait_s: float | None = 600.0,
    ) -> None:
        size = dataset_size if isinstance(dataset_size, int) else len(dataset_size)
        if size < 1:
            raise ValueError(f"an epoch needs at least one sample, got a dataset of {size}")
        if agent is None:
            import torch.distributed as dist

            agent = getattr(dist.group.WORLD, "agent", None)
            if agent is None:
                raise RuntimeError(
                    "ElasticSampler needs the foldplane agent: pass agent=..., or call "
                    'dist.init_process_group("foldplane") first'
                )
        self.agent = agent
        self.dataset_size = size
        self.plan: dict[str, Any] = {
            "dataset_size": size,
            "seed": seed,
            "shuffle": shuffle,
            "split": split,
            "grain": grain,
            "lookahead": lookahead,
        }
        if partition_ratios is not None:
            self.plan["partition_ratios"] = [float(r) for r in partition_ratios]
        if reclaim is not None:
            self.plan["reclaim"] = reclaim
        self.wait_s = wait_s
        self.tracker: EpochTracker = agent.data
        self.epoch: int | None = None
        self._perm: torch.Tensor | None = None
        #: where this sampler stands in the rank's part of its epoch (kept by the tracker,
        #: which moves it with the part; read and changed under the tracker's lock)
        self._cursor = ReadCursor()
        #: for the rate: processed at the epoch's start, and the time spent reading (waits for
        #: the coordinator do not count)
        self._counted_since = 0
        self._reading_s = 0.0
        self._read_from = time.monotonic()
        #: the thread that marked samples processed last
        self._marker: int | None = threading.get_ident()

    # -- the epoch --------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Declare epoch ``epoch`` (every rank calls it with the same plan: the first call
        appends it, the others get the same answer) and wait until this rank knows its part.
        An epoch begins once the one before it is complete."""
        if epoch == self.epoch:
            return
        if self.epoch is not None:
            self._wait(
                lambda: self.epoch in self.tracker.complete,
                f"epoch {self.epoch} to complete before epoch {epoch}",
            )
        self.agent.plan_epoch(epoch=epoch, **self.plan)
        self._wait(lambda: epoch in self.tracker.plans, f"the plan of epoch {epoch}")
        self.epoch = epoch
        plan = self.tracker.plans[epoch]
        if plan.lookahead < 1:
            raise EpochError(
                f"epoch {epoch}'s lookahead is {plan.lookahead}: a sampler needs at least one "
                "position (a batch and the loader's prefetch is a good size)"
            )
        if plan.shuffle:
            gen = torch.Generator().manual_seed(plan.seed + epoch)
            self._perm = torch.randperm(self.dataset_size, generator=gen)
        else:
            self._perm = None
        self._cursor = self.tracker.start_reading(epoch)
        self._counted_since, self._reading_s = self._cursor.processed, 0.0
        self._read_from = time.monotonic()

    @property
    def lookahead(self) -> int:
        assert self.epoch is not None
        return self.tracker.plans[self.epoch].lookahead

    def __len__(self) -> int:
        """What this rank holds of the epoch and has not yet read (it may grow or shrink as
        ranks come and go)."""
        if self.epoch is None:
            return 0
        with self.tracker.lock:
            part = self.tracker.parts.get(self.epoch)
            return 0 if part is None else max(0, part.end - self._cursor.yielded)

    def __iter__(self) -> Iterator[int]:
        if self.epoch is None:
            raise RuntimeError("call sampler.set_epoch(epoch) before iterating")
        epoch = self.epoch
        tracker = self.tracker
        cursor = self._cursor
        while True:
            with tracker.lock:
                part = tracker.parts[epoch]
                window = tracker.accepted.get(epoch, 0) + self.lookahead
                ahead = cursor.yielded < min(part.end, window)
                position = part.position(cursor.take()) if ahead else None
                used_up = cursor.yielded >= part.end
            if position is not None:
                yield self._index(position)
                continue
            if used_up:
                return  # the pass is over: next_pass() waits for more or for the epoch's end
            # the read-ahead window is closed: report what is processed, wait for it to move
            self._check_not_stuck(epoch)
            self._report(urgent=True)
            self._wait(
                lambda: self._window_open(epoch),
                f"the coordinator to accept epoch {epoch}'s progress (read {cursor.yielded}, "
                f"processed {cursor.processed}, lookahead {self.lookahead})",
            )

    def _check_not_stuck(self, epoch: int) -> None:
        """A closed window opens only when the coordinator accepts more progress. If all that
        was marked processed is accepted already and the thread marking it is this one (a
        ``DataLoader`` asks for indices in the thread that trains), nothing can open it:
        say why instead of waiting forever."""
        accepted = self.tracker.accepted.get(epoch, 0)
        if self._cursor.processed <= accepted and self._marker == threading.get_ident():
            raise EpochError(
                f"rank {self.tracker.rank}: the sampler read {self._cursor.unmarked} "
                f"positions ahead of what is processed, its whole lookahead "
                f"({self.lookahead}), and the thread that marks them processed is waiting for "
                "more: the loader reads further ahead than the lookahead. Plan a lookahead of "
                "at least batch_size x (num_workers x prefetch_factor + 2)"
            )

    def next_pass(self) -> bool:
        """Whether there is a pass to read: True at once while this rank holds positions it
        has not read; otherwise everything processed is reported and it waits until the rank
        is given more (True) or every rank's part is processed and the epoch is complete
        (False). Every position yielded must be marked processed first."""
        if self.epoch is None:
            raise RuntimeError("call sampler.set_epoch(epoch) first")
        epoch = self.epoch
        if self._cursor.unmarked:
            raise RuntimeError(
                f"{self._cursor.unmarked} samples of this pass are not marked "
                "processed: mark_processed() every batch before the next pass (the epoch ends "
                "only when every rank's part is reported)"
            )
        self._report(urgent=True)

        def ready() -> bool:
            part = self.tracker.parts[epoch]
            return self._cursor.yielded < part.end or epoch in self.tracker.complete

        self._wait(ready, f"more of epoch {epoch} or its end (processed {self._cursor.processed})")
        with self.tracker.lock:
            return self._cursor.yielded < self.tracker.parts[epoch].end

    @property
    def epoch_complete(self) -> bool:
        """Every position of the epoch was reported processed (by some rank)."""
        return self.epoch is not None and self.epoch in self.tracker.complete

    def _window_open(self, epoch: int) -> bool:
        part = self.tracker.parts[epoch]
        window = self.tracker.accepted.get(epoch, 0) + self.lookahead
        yielded = self._cursor.yielded
        return yielded < min(part.end, window) or yielded >= part.end

    def _index(self, position: int) -> int:
        return int(self._perm[position]) if self._perm is not None else position

    # -- progress ---------------------------------------------------------------------------

    def mark_processed(self, count: int) -> None:
        """The next ``count`` samples this sampler yielded are processed (reported to the
        coordinator, early enough that the read-ahead window never closes)."""
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        assert self.epoch is not None
        with self.tracker.lock:
            cursor = self._cursor
            if count > cursor.unmarked:
                raise ValueError(
                    f"marking {count} more processed would pass what this sampler yielded "
                    f"({cursor.unmarked} not marked yet)"
                )
            cursor.mark(count)
            behind = cursor.processed - self.tracker.accepted.get(self.epoch, 0)
            used_up = cursor.processed >= self.tracker.parts[self.epoch].end
        self._marker = threading.get_ident()
        self._report(urgent=behind >= max(1, self.lookahead // 2) or used_up)

    @property
    def processed(self) -> int:
        """Positions of this rank's part counted processed: what it reports (a position
        yielded from a share the rank no longer holds counts nothing when marked)."""
        return self._cursor.processed

    def _report(self, *, urgent: bool) -> None:
        if self.epoch is None:
            return
        reading = self._reading_s + (time.monotonic() - self._read_from)
        rate = None
        processed = self._cursor.processed
        if reading > 0 and processed > self._counted_since:
            rate = (processed - self._counted_since) / reading
        self.tracker.want_report(self.epoch, rate, urgent)

    def _wait(self, predicate: Callable[[], bool], what: str) -> None:
        self._reading_s += time.monotonic() - self._read_from
        try:
            ok = self.tracker.wait(predicate, self.wait_s)
        finally:
            self._read_from = time.monotonic()
        if not ok:
            raise TimeoutError(
                f"rank {self.tracker.rank}: waited {self.wait_s} s for {what}; "
                f"last error: {self.tracker.error or 'none'}"
            )
