"""Engines that execute a scheduler step: `sim` (a virtual GPU) is the default."""
