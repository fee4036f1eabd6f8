"""Following NCCL operations on the GPU: when each one ends, and whether it failed.

A NCCL operation's ``Work`` says nothing useful on the CPU: its future is completed when the
operation is *enqueued*, and its kernels may then run, finish, or hang on a dead peer. So each
CUDA operation gets an end event, recorded on a side stream made to wait for the operation
(:meth:`EndEvents.after`): the event completes when the operation's kernels have ended, whether
they finished or were aborted. A failure is known on the CPU from three sources:

- NCCL reports an error on the communicator (a peer's socket closed: ``is_completed()`` turns
  True while the end event has not completed);
- the operation's deadline passes (the collective or p2p timeout, counted from issue);
- a member's liveness counter stopped (it died, or hangs), checked once an operation has run
  longer than one liveness window: a dead peer is named without waiting out the deadline.

Each fails the view (``ViewGroup.fail``), which aborts the view's communicator on this rank and
poisons the other members, who abort theirs: the hung kernels return and every stream moves on.
The :class:`CudaWatch` thread polls the operations in flight (a few microseconds each), so an
operation nobody waits for still fails its view; ``Work.wait`` polls its own operation too, so
the success path pays no thread hop.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol

import torch

log = logging.getLogger(__name__)

#: How long the watch thread sleeps between looks while operations are in flight: from the
#: first to the last, doubling (reset whenever an operation ended).
POLL_MIN_S = 5e-5
POLL_MAX_S = 0.002


class Followed(Protocol):
    """What the watch needs of an operation (``agent.dataplane.work.Work``)."""

    #: when it was issued (``time.monotonic()``)
    _issued: float
    #: its view (``agent.dataplane.view.ViewGroup``): ``failure``, ``version``, ``check_liveness``
    _view: Any

    def _poll_cuda(self, now: float) -> bool: ...


class EndEvents:
    """Per-device side streams on which each CUDA operation's end event is recorded."""

    def __init__(self) -> None:
        self._streams: dict[int, torch.cuda.Stream] = {}
        self._lock = threading.Lock()

    def stream(self, device: torch.device) -> torch.cuda.Stream:
        index = device.index if device.index is not None else torch.cuda.current_device()
        with self._lock:
            stream = self._streams.get(index)
            if stream is None:
                stream = self._streams[index] = torch.cuda.Stream(torch.device("cuda", index))
        return stream

    def after(self, backend_work: object, device: torch.device) -> torch.cuda.Event:
        """An event that completes once ``backend_work``'s kernels have ended on ``device``.

        The side stream waits on the work's CUDA future (its events are recorded on the NCCL
        stream after the operation), not on ``work.wait()``: that would also hand the
        operation's stashed tensors back to the allocator, ordered after a stream the caller
        never uses.
        """
        stream = self.stream(device)
        event = torch.cuda.Event()
        try:
            future = backend_work.get_future()  # type: ignore[attr-defined]
        except RuntimeError:
            future = None
        with torch.cuda.stream(stream):
            if future is not None:
                future.wait()  # a CUDA future: the current (side) stream waits, the CPU does not
            else:
                backend_work.wait()  # type: ignore[attr-defined]
            event.record(stream)
        return event


class CudaWatch:
    """A daemon thread that follows every CUDA operation in flight until its end is known."""

    def __init__(self, closed: threading.Event, liveness_window_s: float) -> None:
        self._closed = closed
        self._window_s = liveness_window_s
        self._cond = threading.Condition()
        self._works: list[Followed] = []
        self._thread: threading.Thread | None = None
        self._checking: set[int] = set()  # views whose liveness is being checked now (by id)

    def track(self, work: Followed) -> None:
        with self._cond:
            self._works.append(work)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="dataplane-cuda-watch", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def in_flight(self) -> int:
        with self._cond:
            return len(self._works)

    def _run(self) -> None:
        delay = 0.0
        while True:
            with self._cond:
                while not self._works:
                    if self._closed.is_set():
                        return
                    self._cond.wait(0.5)
                    delay = 0.0
                works = list(self._works)
            now = time.monotonic()
            ended = [w for w in works if self._look(w, now)]
            for work in works:
                if work not in ended and now - work._issued > self._window_s:
                    self._suspect(work)
            if ended:
                with self._cond:
                    self._works = [w for w in self._works if w not in ended]
                delay = 0.0
                continue
            delay = min(max(delay * 2, POLL_MIN_S), POLL_MAX_S)
            time.sleep(delay)

    @staticmethod
    def _look(work: Followed, now: float) -> bool:
        """Poll ``work``; a CUDA error while looking fails its view (the watch goes on)."""
        try:
            return work._poll_cuda(now)
        except Exception as e:  # a broken device must not end the watch
            log.exception("following a CUDA operation failed")
            view = work._view
            if view is not None:
                view.fail(f"following a CUDA operation failed: {type(e).__name__}: {e}")
            return True

    def _suspect(self, work: Followed) -> None:
        """``work`` has run longer than a liveness window: check its view's members, once at a
        time per view, in a thread of its own (the check waits one window)."""
        view = work._view
        if view is None or view.failure is not None:
            return
        key = id(view)
        with self._cond:
            if key in self._checking:
                return
            self._checking.add(key)

        def check() -> None:
            try:
                view.check_liveness()  # type: ignore[attr-defined]
            except Exception:  # never let a liveness read kill the watch
                log.exception("liveness check of view %d failed", view.version)
            finally:
                with self._cond:
                    self._checking.discard(key)

        threading.Thread(
            target=check, name=f"dataplane-suspect-v{view.version}", daemon=True
        ).start()


def nccl_error(backend_work: object) -> str | None:
    """The error NCCL reported for ``backend_work``, if any (None while it runs or if it
    succeeded). ``is_completed()`` turns True on an error before the kernels have ended.
    A graph replay has no backend work: None (its failures are found by liveness)."""
    if backend_work is None:
        return None
    try:
        if not backend_work.is_completed():  # type: ignore[attr-defined]
            return None
    except RuntimeError as e:
        return str(e)
    try:
        exc = backend_work.exception()  # type: ignore[attr-defined]
    except (RuntimeError, TypeError):
        exc = None
    return "" if exc is None else str(exc)
