"""The deterministic simulator's seeds, run and shrunk (the simulator is ``sim``)."""
