"""What the benchmarks share, each written once; a benchmark module keeps its scenario and rows.

- :mod:`~benchmarks.kit.service`: a real coordinator process (``python -m coordinator serve``)
  on a free loopback port, its log files, its client, and launchers for workers on it.
- :mod:`~benchmarks.kit.workers`: what workers print (one JSON line per event, wall-clock
  times) and how the benchmark reads it back (:class:`~benchmarks.kit.workers.Lines`).
- :mod:`~benchmarks.kit.kills`: kill-to-recovery timing, from the kill to the last survivor's
  line that says it recovered.
- :mod:`~benchmarks.kit.baselines`: the peers measured in the same run: torchrun restarting
  every worker, torchft replica groups under a lighthouse (driver and worker side), and the
  rule that a peer that cannot be measured is said so, never faked.
- :mod:`~benchmarks.kit.torchrun`: one torchrun job of several nodes on this machine, on any
  rendezvous backend (foldplane's or torch's c10d), a worker killed, and the time until every
  worker of the new round trained again (the rendezvous benchmark and its tests).
- :mod:`~benchmarks.kit.simulated`: the service benchmarks' simulated agent hosts
  (``agent.simhost``'s, with per-kind wait timing), cores split between them and the
  coordinator, and the server's event loop and GC thresholds for the simulator.
- :mod:`~benchmarks.kit.floors`: the costs every decision stands on (one durable append).
- :mod:`~benchmarks.kit.catalog`: every benchmark by name and its module: those of
  ``benchmarks/`` and those the facets declare in their folders (their plugins' ``benchmarks``),
  found through the facet list.
"""
