"""Checking a run's meta.json against its model (contract.runmeta.RunMeta), for the reader.

The model names every field the harness writes and its type; this module turns what
pydantic says about a field of the wrong type into a line naming the field's JSON path.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from contract.runmeta import RunMeta


def meta_problems(meta: dict[str, Any]) -> list[str]:
    """Each field of `meta` whose type is wrong, named by its JSON path; empty when sound."""
    try:
        RunMeta.read(meta)
    except ValidationError as exc:
        return [_problem(error) for error in exc.errors()]
    return []


def _problem(error: ErrorDetails) -> str:
    where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error["loc"])
    # pydantic appends the member type to the path of a union ("windows.stress.tuple[...]").
    where = where.split(".tuple[")[0].split(".function-")[0]
    # "a valid dictionary or instance of TargetMeta" means nothing to whoever reads meta.json.
    message = "should be a JSON object" if error["type"] in _OBJECT_TYPES else error["msg"]
    return f"{where.lstrip('.')}: {message} (found {error['input']!r})"


_OBJECT_TYPES = ("model_type", "dict_type")
