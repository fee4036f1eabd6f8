"""What the ``"foldplane"`` backend tells torch's own backend suite about itself.

torch's ``DistributedTest._DistTestBase`` decides which tests apply to a backend by looking its
name up in two tables of ``torch.testing._internal.common_distributed.DistTestCases``:

- ``backend_feature[feature]``: the backends that *have* ``feature`` (a test that needs it is
  skipped for the others);
- ``skip_collective[collective]``: the backends that *lack* ``collective``.

The harness puts ``"foldplane"`` into those sets before the suite is imported (the decorators
read them at import), from the two tables below. Every feature foldplane lacks is named here
with the reason a user would be given; nothing else may fail on foldplane where gloo passes
(``tests/torch_suite/test_torch_suite.py`` checks it).
"""

from __future__ import annotations

#: ``backend_feature`` entries foldplane has, and why it has them.
HAS: dict[str, str] = {
    "ddp": "torch's DistributedDataParallel runs on the foldplane group (docs/ddp.md)",
    "plugin": "foldplane is a registered third-party backend (dist.Backend.register_backend)",
    "gpu": "the agent runs an NCCL data plane where CUDA is available, gloo elsewhere",
    "cuda": "CUDA tensors go through the NCCL data plane (the agent's default with a GPU)",
    "subgroup": "dist.new_group on a foldplane group builds a static backend over its ranks",
}

#: ``backend_feature`` entries foldplane lacks: feature -> the reason.
LACKS: dict[str, str] = {}

#: ``skip_collective`` entries foldplane lacks: collective -> the reason.
SKIPS: dict[str, str] = {}

_MONITORED = (
    "dist.monitored_barrier raises for any group whose backend is not named gloo: torch's own "
    "check, made before the group is reached (dist.barrier works)"
)

#: Tests that fail on foldplane because torch itself refuses a backend not named gloo:
#: test -> the reason. They still run; their failure is recorded.
REFUSED: dict[str, str] = {
    "test_monitored_barrier_gloo": _MONITORED,
    "test_monitored_barrier_gloo_subgroup": _MONITORED,
}


def declare(backend: str = "foldplane", *, lift: str | None = None) -> None:
    """Put ``backend`` into torch's ``DistTestCases`` sets (before importing the suite).

    ``lift`` (a name from :func:`reasons`) leaves that one declaration out, as if the backend
    had the feature (``"*"``: every one): the harness uses it to tell which tests each
    declaration skips.
    """
    from torch.testing._internal.common_distributed import DistTestCases

    features, collectives = DistTestCases.backend_feature, DistTestCases.skip_collective
    for feature in HAS:
        features.setdefault(feature, set()).add(backend)
    for feature in LACKS:
        if lift in (_name("backend_feature", feature), "*"):
            features.setdefault(feature, set()).add(backend)
        else:
            features.setdefault(feature, set()).discard(backend)
    for collective in SKIPS:
        if lift in (_name("skip_collective", collective), "*"):
            collectives.setdefault(collective, set()).discard(backend)
        else:
            collectives.setdefault(collective, set()).add(backend)


def _name(table: str, key: str) -> str:
    return f'{table}["{key}"]'


def reasons() -> dict[str, str]:
    """Every declaration: name -> reason (those of ``REFUSED`` are ``refused["<test>"]``)."""
    return {
        **{_name("backend_feature", f): r for f, r in LACKS.items()},
        **{_name("skip_collective", c): r for c, r in SKIPS.items()},
        **{_name("refused", t): r for t, r in REFUSED.items()},
    }
