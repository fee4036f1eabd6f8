"""The pure fold: the Coordinator state machine and its parts (no I/O, clock, threads)."""
