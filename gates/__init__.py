"""Release gates: the gate spec, metrics computed from a run directory, and the evaluator."""
