"""The torch versions foldplane is tested with, and the one warning for any other.

pyproject.toml puts no upper bound on torch, so installing foldplane never replaces the torch a
user already has. A torch outside the tested range is still used: importing foldplane's torch
data plane (``foldplane.agent.dataplane``, which an ``Agent``'s process group and
``init_process_group("foldplane")`` load; the first foldplane module that imports torch) warns
once per process, naming the version found and the range (docs/torch-compat.md#torch-versions
says which version ran what).

This module imports nothing but the standard library, so the pure machine can name it.
"""

from __future__ import annotations

import re
import warnings

#: The oldest and newest (major, minor) torch releases the suites have run on: 2.13 and 2.14 in
#: CI; 2.11, 2.12 and 2.15 in recorded runs (docs/torch-runs/). pyproject.toml's floor is 2.11.
TESTED = ((2, 11), (2, 15))

_RELEASE = re.compile(r"(\d+)\.(\d+)")
_warned = False


class TorchVersionWarning(UserWarning):
    """The installed torch is outside the range foldplane is tested with (``TESTED``)."""


def range_text() -> str:
    (lo_major, lo_minor), (hi_major, hi_minor) = TESTED
    return f"{lo_major}.{lo_minor} through {hi_major}.{hi_minor}"


def untested(version: str) -> str | None:
    """The warning for torch ``version`` (``torch.__version__``'s form, local part and
    pre-release included), or None when its major.minor lies in ``TESTED``.

    A pre-release counts as its release (``2.16.0a0`` is 2.16); a version that does not start
    with ``major.minor`` is outside the range, since nothing can be said about it.
    """
    found = _RELEASE.match(version)
    if found is not None and TESTED[0] <= (int(found[1]), int(found[2])) <= TESTED[1]:
        return None
    return (
        f"foldplane is tested with torch {range_text()}, and torch {version} is installed: "
        "it may work, but no suite has run on it (docs/torch-compat.md#torch-versions)"
    )


def warn_if_untested(version: str) -> None:
    """Warn (``TorchVersionWarning``) once per process if torch ``version`` is untested."""
    global _warned
    if _warned:
        return
    _warned = True
    message = untested(version)
    if message is not None:
        warnings.warn(message, TorchVersionWarning, stacklevel=2)
