"""Run orchestration: CLI, plans, target lifecycle, samplers, fault injectors, run directory."""
