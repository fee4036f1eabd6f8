"""How a CUDA operation's end and failure are decided (``agent/dataplane/cuda.py``), on a CPU.

The decisions a NCCL operation goes through are plain logic over three signals: its end event
(``query()``), NCCL's word on the work (``is_completed()``, ``exception()``) and the clock. Here
those signals come from small stand-ins whose answers the test sets, while the view, its
failure, the poison, the liveness counters and the watch thread are the real ones. The GPU suite
(``tests/gpu``) runs the same code against real NCCL kernels.
"""

from __future__ import annotations

import threading
import time

import pytest

from foldplane.agent.dataplane import keys
from foldplane.agent.dataplane.cuda import CudaWatch
from foldplane.agent.dataplane.view import ViewGroup
from foldplane.agent.dataplane.work import CUDA_END_GRACE_S, Work


class EndEvent:
    """Stands in for ``torch.cuda.Event``: ``query()`` is True once the kernels ended."""

    def __init__(self) -> None:
        self.ended = False

    def query(self) -> bool:
        return self.ended


class NcclWork:
    """Stands in for a NCCL work: what ``is_completed()`` and ``exception()`` say."""

    def __init__(self) -> None:
        self.completed = False
        self.error: str | None = None

    def is_completed(self) -> bool:
        return self.completed

    def exception(self) -> object:
        return None if self.error is None else RuntimeError(self.error)


def follow(plane, view: ViewGroup, timeout_s: float = 5.0) -> tuple[Work, EndEvent, NcclWork]:
    """A CUDA operation issued on ``view`` as ``ElasticProcessGroup._run`` issues one."""
    work = Work("all_reduce (test)", view, plane.hint_pool_for("cpu"), plane.closed, timeout_s)
    end, nccl = EndEvent(), NcclWork()
    assert view.register(work)
    view.op_started()
    work._backend_work = nccl
    work._cuda_end = end  # type: ignore[assignment]
    return work, end, nccl


@pytest.fixture
def one(make_plane):
    """A data plane alone in view 1 (its gloo backend built), and that view."""
    plane = make_plane(0, 1)
    plane.install_view(1, [0])
    view = plane.current_view()
    assert view is not None and view.backend(time.monotonic() + 10) is not None
    return plane, view


def test_an_operation_whose_kernels_ended_succeeded(one) -> None:
    plane, view = one
    work, end, _nccl = follow(plane, view)
    assert not work._poll_cuda(time.monotonic())
    assert not work.is_completed()
    end.ended = True
    assert work._poll_cuda(time.monotonic())
    assert work.is_completed() and work.is_success()
    assert view.failure is None and view.wait_idle(1.0)


def test_an_error_nccl_reports_fails_the_view_and_wakes_the_waiter_before_the_kernels_end(
    one,
) -> None:
    plane, view = one
    work, end, nccl = follow(plane, view)
    nccl.completed, nccl.error = True, "NCCL error: remote process exited"
    assert not work._poll_cuda(time.monotonic())  # failed, but its kernels still run
    assert view.failure is not None and "remote process exited" in view.failure.reason
    assert work._event.is_set() and work.is_completed() and not work.is_success()
    end.ended = True  # the abort (or shrink) ends them
    assert work._poll_cuda(time.monotonic())
    assert work._resolve() is False and view.wait_idle(1.0)


def test_a_work_that_says_completed_while_its_kernels_run_is_an_error_after_a_grace(one) -> None:
    plane, view = one
    work, _end, nccl = follow(plane, view)
    nccl.completed = True  # no readable exception
    now = time.monotonic()
    assert not work._poll_cuda(now) and view.failure is None  # within the grace: maybe ending
    assert not work._poll_cuda(now + CUDA_END_GRACE_S / 2) and view.failure is None
    assert not work._poll_cuda(now + 2 * CUDA_END_GRACE_S)
    assert view.failure is not None and "reported an error" in view.failure.reason


def test_twin_a_work_that_says_completed_and_then_ends_succeeded(one) -> None:
    plane, view = one
    work, end, nccl = follow(plane, view)
    nccl.completed = True
    now = time.monotonic()
    assert not work._poll_cuda(now)
    end.ended = True  # the end event catches up within the grace
    assert work._poll_cuda(now + CUDA_END_GRACE_S / 2)
    assert work.is_success() and view.failure is None


def test_the_deadline_fails_the_view_naming_the_timeout(one) -> None:
    plane, view = one
    work, _end, _nccl = follow(plane, view, timeout_s=2.0)
    assert not work._poll_cuda(time.monotonic() + 1.0) and view.failure is None
    assert not work._poll_cuda(time.monotonic() + 3.0)
    assert view.failure is not None and "did not complete within 2 s" in view.failure.reason


def test_kernels_that_ended_because_the_communicator_was_aborted_are_a_failure(one) -> None:
    plane, view = one
    work, end, _nccl = follow(plane, view)
    view.mark_aborted()  # a shrink with SHRINK_ABORT, or the abort of the view
    end.ended = True
    assert work._poll_cuda(time.monotonic())
    assert work.is_completed() and not work.is_success()


def test_a_waiter_polling_its_operation_returns_when_the_view_fails(one) -> None:
    plane, view = one
    work, _end, _nccl = follow(plane, view, timeout_s=30.0)
    done = threading.Event()

    def wait() -> None:
        work._wait_cuda(time.monotonic() + 30.0)
        done.set()

    threading.Thread(target=wait, daemon=True).start()
    assert not done.wait(0.05)  # still running: it polls
    view.fail("a member's poison notice")
    assert done.wait(5.0)
    assert work._resolve() is False


def test_the_watch_thread_ends_an_operation_nobody_waits_for(one) -> None:
    plane, view = one
    watch = CudaWatch(plane.closed, liveness_window_s=60.0)
    work, end, _nccl = follow(plane, view)
    watch.track(work)
    assert watch.in_flight() == 1
    end.ended = True
    assert work._event.wait(5.0) and work.is_success()
    deadline = time.monotonic() + 5.0
    while watch.in_flight() and time.monotonic() < deadline:
        work._event.wait(0.01)
    assert watch.in_flight() == 0


def test_an_operation_that_runs_long_makes_the_watch_check_liveness_and_name_the_dead(
    make_plane, store
) -> None:
    """Rank 1 registered and then stopped heartbeating (SIGKILL, or a graph replay that hangs
    on it): rank 0's operation is failed after a liveness window, blaming rank 1."""
    plane = make_plane(0, 2, liveness_period_s=0.05, liveness_window_periods=2)
    store.set(keys.incarnation(1), "dead-incarnation")
    store.add(keys.heartbeat(1, "dead-incarnation"), 1)  # a counter that never moves again
    view = ViewGroup(1, (0, 1), plane)  # not built: only its failure and liveness matter here
    watch = CudaWatch(plane.closed, liveness_window_s=0.1)
    work, _end, _nccl = follow(plane, view, timeout_s=60.0)
    watch.track(work)
    assert work._event.wait(10.0), "the watch did not fail the view"
    assert view.failure is not None and "rank(s) [1] stopped" in view.failure.reason
    assert view.failed_ranks(timeout=10.0) == (1,)
