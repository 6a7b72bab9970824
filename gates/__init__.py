"""Release gates: the gate spec, metrics computed from a run directory, and the evaluator.

`evaluate_run` and the verdict types load lazily, so importing `gates.schema` (as the
harness's writers do) does not pull in pandas.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "evaluate": "gates.evaluator",
    "evaluate_run": "gates.evaluator",
    "GateResult": "gates.verdict",
    "Status": "gates.verdict",
    "Verdict": "gates.verdict",
}
__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'gates' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)
