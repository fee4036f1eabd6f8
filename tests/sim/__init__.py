"""The deterministic simulator of the whole system (``tests/sim/world.py``)."""
