"""torch's own backend conformance suite, run on ``"foldplane"`` and on gloo as the reference.

``python -m tests.torch_suite --backend foldplane --world 2 --out run.json`` records a run by
hand; ``tests/torch_suite/test_torch_suite.py`` (slow) runs the part that matters in CI;
``python -m tests.torch_suite.report`` renders ``docs/torch-compat.md`` from recorded runs.
"""
