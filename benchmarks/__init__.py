"""Benchmarks: ``python -m benchmarks NAME... [--quick] [--json FILE]``."""
