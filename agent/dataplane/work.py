"""``Work``: one operation of the elastic process group, and its ``failed_ranks_hint``.

``Work`` is a ``torch.distributed.Work``, so ``dist.all_reduce(t, group=pg, async_op=True)``
hands back this very object, and C++ callers (DDP's reducer) reach the overrides below.

Rules (Mooncake's contract):
- ``wait()`` never raises because a peer failed: it returns False, the hint names the failed
  ranks, and the output tensor's content is unspecified. It raises only for local misuse: the
  data plane was closed before the operation finished.
- ``wait(timeout)`` bounds the wait: an operation still running when the earlier of its own
  deadline (the collective or p2p timeout, counted from issue) and ``timeout`` passes has failed,
  and fails its view. A hung peer is a failed peer.
- ``get_future()`` completes when the operation ends, **always with a result** (the operation's
  tensors), never with an exception, even when a peer failed: a future completed with an
  exception on DDP's built-in bucket path brings the process down. ``wait()`` and the hint say
  whether it succeeded.
- The hint buffer is leased from the group's pool when the operation is issued and returned when
  the ``Work`` is dropped, so each outstanding ``Work`` keeps its own answer.

On a GPU (NCCL), torch's contract holds as well: once ``wait()`` returned True, whatever the
caller enqueues on its current stream sees the result. ``wait()`` returns once the operation's
kernels have ended on the GPU (it blocks the calling thread like ``TORCH_NCCL_BLOCKING_WAIT``,
because its answer says whether the operation succeeded; it never synchronizes the device), then
makes the current stream wait for the operation. ``get_future()`` completes then too, on a CUDA
future: its callbacks and ``wait()`` are ordered after the operation on the caller's streams.
See :mod:`agent.dataplane.cuda` for how the end and a failure are known.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Protocol

import torch
import torch.distributed as dist

from .cuda import CudaWatch, EndEvents, nccl_error
from .errors import DataPlaneError
from .hint import HintPool, fill

#: How often a synchronous operation waiting inside gloo looks up from it (poison, close).
INLINE_SLICE_S = 0.01
#: How long a NCCL operation may say it completed before its end event does, before that is
#: taken as an error NCCL reported without a readable exception.
CUDA_END_GRACE_S = 0.05
#: How many looks a caller waiting on a CUDA operation takes before it starts to sleep, and its
#: longest sleep between two looks.
CUDA_WAIT_SPIN_LOOKS = 50
CUDA_WAIT_POLL_MAX_S = 0.0005


class WorkView(Protocol):
    """What an operation needs from the view it runs on (``agent.dataplane.view.ViewGroup``):
    to leave it when it ends, to fail it, and the view's failure and decided hint."""

    version: int
    members: tuple[int, ...]

    @property
    def failure(self) -> object | None: ...

    @property
    def aborted(self) -> bool: ...

    def fail(self, reason: str) -> None: ...

    def failed_ranks(self) -> tuple[int, ...]: ...

    def unregister(self, work: Work) -> None: ...

    def op_ended(self, ok: bool = False) -> None: ...


class Work(dist.Work):
    """A handle on one operation; see the module docstring for the rules."""

    def __init__(
        self,
        name: str,
        view: WorkView | None,
        pool: HintPool,
        closed: threading.Event,
        timeout_s: float,
        result: list[torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        self.name = name
        self._view = view
        self._pool = pool
        self._hint: torch.Tensor | None = pool.acquire()
        self._closed = closed
        self._timeout_s = timeout_s
        self._deadline = time.monotonic() + timeout_s
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._backend_work: object | None = None
        self._finished = False
        #: it ended with an error after the data plane closed (``close()`` ended it)
        self._ended_by_close = False
        self._error: str | None = None
        self._outcome: bool | None = None
        self._blamed: tuple[int, ...] | None = None
        self._result = result if result is not None else []
        self._future: torch.futures.Future | None = None
        self._future_lock = threading.Lock()
        self._future_done = False
        #: a receive from any source: ``_source_rank()`` says who sent
        self._any_source = False
        self._issued = time.monotonic()
        #: CUDA operations: the event that completes when the kernels ended, and the device
        self._cuda_end: torch.cuda.Event | None = None
        self._cuda_device: torch.device | None = None
        self._completed_seen: float | None = None
        #: captured in a CUDA graph: the kernels run at each replay, never at issue
        self._captured = False

    # -- how an operation ends ----------------------------------------------------------------

    def _complete_locally(self, ok: bool, blamed: tuple[int, ...] = ()) -> Work:
        """End at once: a success that needed no peer, or a failure blaming ``blamed``."""
        self._outcome = ok
        if not ok:
            self._blamed = blamed
        self._signal()
        return self

    def _fail_with_view(self) -> Work:
        """End at once as a failure of the (already failed) view: same hint as the view."""
        self._outcome = False
        self._signal()
        return self

    def _started(self, backend_work: object) -> None:
        """An asynchronous operation: learn of the backend's end from a callback."""
        self._backend_work = backend_work
        when_ended(backend_work, self._ended)

    def _started_cuda(
        self, backend_work: object, device: torch.device, ends: EndEvents, watch: CudaWatch
    ) -> None:
        """A NCCL operation: follow its end event (see :mod:`agent.dataplane.cuda`)."""
        self._backend_work = backend_work
        self._cuda_device = device
        self._cuda_end = ends.after(backend_work, device)
        watch.track(self)

    def _started_replay(self, device: torch.device, watch: CudaWatch) -> None:
        """A CUDA graph replayed on the current stream: its end is an event recorded after it."""
        self._cuda_device = device
        end = torch.cuda.Event()
        end.record(torch.cuda.current_stream(device))
        self._cuda_end = end
        watch.track(self)

    def _captured_in_graph(self, backend_work: object) -> None:
        """A NCCL operation captured in a CUDA graph: nothing runs now, nothing is followed.

        ``wait()`` only joins the capture (the capturing stream waits for the operation, as a
        plain NCCL work does) and answers True; ``ElasticProcessGroup.replay`` follows each
        replay of the graph instead.
        """
        self._backend_work = backend_work
        self._captured = True
        self._finished = True
        assert self._view is not None
        self._view.unregister(self)
        self._view.op_ended()
        self._outcome = True
        self._signal()

    def _poll_cuda(self, now: float) -> bool:
        """Look once at a CUDA operation: True once its end is known (it then has ended).

        Called by the watch thread and by a caller in ``wait()``; cheap (an event query and,
        while it runs, NCCL's error state).
        """
        if self._finished:
            return True
        view = self._view
        end = self._cuda_end
        assert view is not None and end is not None
        if end.query():
            # The kernels ended: finished, or returned because the view's communicator was
            # aborted (a view fails before it is aborted, so its failure is visible here).
            failed = view.failure is not None or view.aborted or self._closed.is_set()
            self._ended("the view failed while the operation ran" if failed else None)
            return True
        if view.failure is not None:
            return False  # the abort ends the kernels; the waiters were woken by the failure
        error = nccl_error(self._backend_work)
        if error:
            view.fail(f"{self.name} failed: {error}")
        elif error == "":  # NCCL says completed, the end event does not (yet)
            if self._completed_seen is None:
                self._completed_seen = now
            elif now - self._completed_seen > CUDA_END_GRACE_S:
                view.fail(f"{self.name} failed: the NCCL communicator reported an error")
        elif now > self._deadline:
            view.fail(f"{self.name} did not complete within {self._timeout_s:g} s")
        return False

    def _wait_cuda(self, deadline: float) -> None:
        """Wait, polling this operation, until its end is known, the view fails, or ``deadline``.

        The first looks only yield the CPU (a small operation ends within microseconds), then
        the sleeps double up to ``CUDA_WAIT_POLL_MAX_S``; a failure of the view wakes it at once.
        """
        looks = 0
        delay = 0.0
        while not self._event.is_set():
            now = time.monotonic()
            if self._poll_cuda(now) or self._event.is_set() or now >= deadline:
                return
            looks += 1
            if looks <= CUDA_WAIT_SPIN_LOOKS:
                time.sleep(0)
                continue
            self._event.wait(delay)
            delay = min(max(delay * 2, 2e-5), CUDA_WAIT_POLL_MAX_S)

    def _ended(self, error: str | None) -> None:
        with self._lock:
            if self._finished:
                return
            self._error = error
            self._finished = True
            self._ended_by_close = error is not None and self._closed.is_set()
        assert self._view is not None
        self._view.unregister(self)
        self._view.op_ended(ok=error is None)
        self._signal()

    def _wait_inline(self, backend_work: object) -> None:
        """A synchronous operation: wait inside the backend, one slice at a time.

        No thread hop and no callback on the success path (the cheapest wait gloo offers), yet
        a poisoned view, a closed plane or the deadline still ends the wait within a slice. An
        operation left running is followed until it ends, so its view knows when its backend is
        idle (see ``ViewGroup.op_ended``).
        """
        self._backend_work = backend_work
        view = self._view
        assert view is not None
        ended = self._wait_slices(backend_work, view)
        self._finished = ended
        if ended:
            view.op_ended(ok=self._outcome is True)
        else:
            when_ended(backend_work, lambda _error: view.op_ended())
        self._signal()
        if self._outcome is None:
            self._outcome = False
            if self._closed.is_set() and view.failure is None:
                raise DataPlaneError(
                    f"{self.name} was still running when the data plane was closed"
                )

    def _wait_slices(self, backend_work: object, view: WorkView) -> bool:
        """Wait for ``backend_work``; True if it ended (the outcome is then set), False if given up."""
        while True:
            remaining = self._deadline - time.monotonic()
            if remaining <= 0:
                view.fail(f"{self.name} did not complete within {self._timeout_s:g} s")
                return False
            try:
                backend_work.wait(timedelta(seconds=min(remaining, INLINE_SLICE_S)))  # type: ignore[attr-defined]
            except RuntimeError:
                if not backend_work.is_completed():  # type: ignore[attr-defined]
                    if view.failure is not None or self._closed.is_set():
                        return False
                    continue  # only this slice timed out; the operation is still running
                # It ended meanwhile: a second wait returns, or raises the operation's own error.
                try:
                    backend_work.wait()  # type: ignore[attr-defined]
                except RuntimeError as e:
                    view.fail(f"{self.name} failed: {e}")
                    self._outcome = False
                    return True
            self._outcome = True
            return True

    def wake(self) -> None:
        """The view failed or the plane closed: stop waiting for the backend (the view calls
        it, ``agent.dataplane.view.Waiter``)."""
        self._signal()

    def _signal(self) -> None:
        """The outcome can be decided now: wake waiters and complete the future, if any."""
        self._event.set()
        future = self._future
        if future is not None:
            self._complete_future(future)

    def _complete_future(self, future: torch.futures.Future) -> None:
        with self._future_lock:
            if self._future_done:
                return
            self._future_done = True
        try:
            self._resolve()
        except DataPlaneError:  # closed meanwhile: still a result, never an exception
            self._outcome = False
        future.set_result(self._result)

    # -- the public surface -------------------------------------------------------------------

    def wait(self, timeout: float | timedelta | None = None) -> bool:
        """True if the operation succeeded, False if a peer failed (see the module rules).

        ``timeout`` is in seconds, or a ``timedelta`` as ``dist.Work.wait`` takes it (zero, its
        default, means no bound).
        """
        if isinstance(timeout, timedelta):
            timeout = timeout.total_seconds() or None
        if self._outcome is not None:
            return self._order_stream(self._outcome)
        deadline = (
            self._deadline if timeout is None else min(self._deadline, time.monotonic() + timeout)
        )
        if self._cuda_end is not None:
            self._wait_cuda(deadline)
        if not self._event.wait(max(0.0, deadline - time.monotonic())) and self._view is not None:
            limit = self._timeout_s if timeout is None else min(self._timeout_s, timeout)
            self._view.fail(f"{self.name} did not complete within {limit:g} s")
        return self._order_stream(self._resolve())

    def _order_stream(self, ok: bool) -> bool:
        """torch's contract for a GPU operation: the caller's current stream waits for it.

        Its kernels have ended already (or it failed, and then there is nothing to wait for:
        the content is unspecified); this orders later work without blocking the CPU. A
        captured operation joins the capturing stream the same way.
        """
        if ok and (self._cuda_end is not None or self._captured):
            if self._captured:
                if torch.cuda.is_current_stream_capturing():
                    self._backend_work.wait()  # type: ignore[union-attr]
            else:
                torch.cuda.current_stream(self._cuda_device).wait_event(self._cuda_end)
        return ok

    def _resolve(self) -> bool:
        with self._lock:
            if self._outcome is not None:
                return self._outcome
            if self._finished and not self._ended_by_close:
                if self._error is None:
                    self._outcome = True
                    return True
                assert self._view is not None
                self._view.fail(f"{self.name} failed: {self._error}")
            elif self._closed.is_set():
                raise DataPlaneError(
                    f"{self.name} was still running when the data plane was closed"
                )
            self._outcome = False
            return False

    def is_completed(self) -> bool:
        """True once the outcome is known (succeeded, or failed: a peer failed or the view did)."""
        if self._outcome is not None:
            return True
        if not self._event.is_set():
            return False
        if self._closed.is_set() and (not self._finished or self._ended_by_close):
            return True
        self._resolve()
        return True

    def is_success(self) -> bool:
        """True once the operation has succeeded (False while running, or after a failure)."""
        return self.is_completed() and bool(self._outcome)

    def exception(self) -> None:
        """Always None: a peer's failure is an outcome (``wait()`` False), not an exception."""
        return None

    def result(self) -> list[torch.Tensor]:
        """The operation's tensors (their content is unspecified after a failure)."""
        self.wait()
        return self._result

    def synchronize(self) -> None:
        self.wait()

    def source_rank(self) -> int:
        """The global rank that sent what a receive from any source got (after it succeeded)."""
        if not self._any_source:
            raise ValueError(f"{self.name}: source_rank is only known for a recv from any source")
        if not self.wait() or self._backend_work is None or self._view is None:
            raise ValueError(f"{self.name}: nothing was received, so there is no source rank")
        index = self._backend_work._source_rank()  # type: ignore[attr-defined]
        return self._view.members[index]

    _source_rank = source_rank

    def get_future(self) -> torch.futures.Future:
        """A future that completes with the operation's tensors when it ends, failed or not."""
        with self._future_lock:
            if self._future is None:
                device = self._cuda_device
                self._future = (
                    torch.futures.Future(devices=[device])
                    if device is not None
                    else torch.futures.Future()
                )
            future = self._future
        if self._event.is_set():
            self._complete_future(future)
        return future

    def failed_ranks_hint(self) -> torch.Tensor:
        """This operation's hint (waits for the operation, and for the liveness decision)."""
        ok = self.wait()
        hint = self._hint
        if hint is None:
            raise DataPlaneError(f"the hint of {self.name} was released")
        if not ok:
            if self._blamed is not None:
                fill(hint, self._blamed)
            else:
                assert self._view is not None
                fill(hint, self._view.failed_ranks())
        return hint

    def __del__(self) -> None:
        hint, self._hint = getattr(self, "_hint", None), None
        if hint is not None:
            self._pool.release(hint)

    def __repr__(self) -> str:
        state = "pending" if self._outcome is None else ("ok" if self._outcome else "failed")
        version = self._view.version if self._view is not None else None
        return f"<Work {self.name} view={version} {state}>"


class CoalescedWork(dist.Work):
    """The operations issued on a group between ``start_coalescing`` and ``end_coalescing``, as
    one handle (what ``end_coalescing`` returns to torch's coalescing manager and
    ``batch_isend_irecv``).

    The rules of :class:`Work` hold for the set: ``wait()`` waits for every operation and is
    True only if all succeeded (it never raises for a peer's failure); the hint names every rank
    that failed in any of them; ``get_future()`` completes, always with a result (the
    operations' tensors), once all have ended. An empty set succeeded.
    """

    def __init__(self, name: str, works: Sequence[Work], world_size: int) -> None:
        super().__init__()
        self.name = name
        self.works = tuple(works)
        self._world_size = world_size

    def wait(self, timeout: float | timedelta | None = None) -> bool:
        outcomes = [w.wait(timeout) for w in self.works]  # every one, even after a failure
        return all(outcomes)

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self.works)

    def is_success(self) -> bool:
        return all(w.is_success() for w in self.works)

    def exception(self) -> None:
        """Always None: a peer's failure is an outcome (``wait()`` False), not an exception."""
        return None

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return [t for w in self.works for t in w.result()]

    def synchronize(self) -> None:
        self.wait()

    def source_rank(self) -> int:
        raise ValueError(f"{self.name}: source_rank is only known for a recv from any source")

    _source_rank = source_rank

    def get_future(self) -> torch.futures.Future:
        """Completes with every operation's tensors once all have ended, failed or not."""
        if not self.works:
            done: torch.futures.Future = torch.futures.Future()
            done.set_result([])
            return done
        both = torch.futures.collect_all([w.get_future() for w in self.works])
        return both.then(lambda f: [t for part in f.value() for t in part.value()])

    def failed_ranks_hint(self) -> torch.Tensor:
        """int32, shape ``(world_size,)``: 1 for each rank that failed in any operation (a
        tensor of its own, on the device of the operations' hints)."""
        hints = [w.failed_ranks_hint() for w in self.works]
        out = torch.zeros(self._world_size, dtype=torch.int32)
        if hints:
            out = out.to(hints[0].device)
            for hint in hints:
                torch.maximum(out, hint.to(out.device), out=out)
        return out

    def __repr__(self) -> str:
        return f"<CoalescedWork {self.name}: {len(self.works)} operations>"


def when_ended(backend_work: object, callback: Callable[[str | None], None]) -> None:
    """Call ``callback(error or None)`` once ``backend_work`` has ended, from a backend thread."""
    try:
        future = backend_work.get_future()  # type: ignore[attr-defined]
    except RuntimeError:  # "not implemented": gloo's send/recv and a few others

        def wait_in_thread() -> None:
            try:
                backend_work.wait()  # type: ignore[attr-defined]
            except RuntimeError as e:
                callback(str(e))
            else:
                callback(None)

        threading.Thread(target=wait_in_thread, name="dataplane-p2p-wait", daemon=True).start()
        return

    def on_done(fut: torch.futures.Future) -> None:
        # Not ``work.wait()``: the callback may run before the work itself is marked completed.
        try:
            fut.value()
        except RuntimeError as e:
            callback(str(e))
        else:
            callback(None)

    future.add_done_callback(on_done)
