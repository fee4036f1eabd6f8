"""The deterministic simulator of the whole system (:mod:`sim.world`) and the
invariants it checks after every step (:mod:`sim.invariants`).

A composition root like the demo: it runs the real fold, the host's decisions and the agents'
real ``AgentMachine``s in one process, so it imports both sides. ``tests/sim`` runs its seeds
(``python -m tests.sim``), and ``benchmarks/sim.py`` times them.
"""
