"""Named points where a process stops itself (SIGSTOP), for the failover tests.

A leader frozen at an exact step (an append about to be sent, its projection rows, its snapshot,
its lease renewal, its claim of the term) must write nothing once it wakes after its lease. A
signal sent from outside lands wherever the process happens to be, so the tests name the step:
with ``FOLDPLANE_STOP_AT=<point>`` and ``FOLDPLANE_STOP_ARM=<file>`` in its environment, the
first time the process reaches ``<point>`` while ``<file>`` exists, it removes the file and
stops itself; SIGCONT resumes it right there. Unset (always, outside those tests), a point costs
one comparison.
"""

from __future__ import annotations

import os
import signal

POINT = os.environ.get("FOLDPLANE_STOP_AT") or None
ARM = os.environ.get("FOLDPLANE_STOP_ARM") or None


def stop_point(name: str) -> None:
    """Stop this process here if the tests armed the point ``name`` (see the module docstring)."""
    if name != POINT or ARM is None:
        return
    try:
        os.unlink(ARM)
    except FileNotFoundError:
        return
    os.kill(os.getpid(), signal.SIGSTOP)
