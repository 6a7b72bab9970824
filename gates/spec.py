"""The gate spec: YAML validated by pydantic, with k6-style one-line thresholds (`p(95) <= 0.9`).

A gate names a metric from the registry (gates/metrics.py), a filter, a pass threshold and
an optional, stricter warning threshold: a value that meets `pass` but not `warn` is
MARGINAL. Errors name the YAML path (`gates[2] (id: ttft).pass`) and the allowed values.

A file is checked in two steps, as k6 checks its thresholds at init: pydantic checks its
shape (the models here, which know no metric), then the loader checks each gate against the
metric it names (`checked_gate_file`). The thresholds and filters are gates/terms.py's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from contract.servers import DATA_KINDS
from gates.metrics import REGISTRY
from gates.terms import KIND_STATISTICS, GateFilter, Threshold

# GateFilter and Threshold are gates/terms.py's; a GateSpec is made of them, so they come with it.
__all__ = [
    "BUILTIN_GATES",
    "GateFile",
    "GateFilter",
    "GateSpec",
    "GateSpecError",
    "Threshold",
    "checked_gate_file",
    "load_gate_file",
]

BUILTIN_GATES = Path(__file__).with_name("builtin.yaml")
Problem = tuple[tuple[int | str, ...], str]  # where in the file (a pydantic loc), and why


class GateSpecError(Exception):
    """A gate file that cannot be used; the message names the file and the YAML path."""


class GateSpec(BaseModel):
    """One release gate."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)
    id: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    title: str
    metric: str
    filter: GateFilter = GateFilter()
    pass_: Threshold = Field(alias="pass")
    warn: Threshold | None = None
    weight: float = Field(default=1.0, gt=0)
    key: bool = False
    # Whether this gate's FAIL fails the run on its own, whatever the score (None: as `key`).
    # `key` says more: a key gate without data or evidence makes the run INVALID, so a gate
    # that a run may rightly have no data for (no preemption happened, no probe was sent)
    # blocks without being key.
    blocks: bool | None = None
    on_missing: Literal["invalid", "fail", "pass"] = "invalid"
    # Evidence: the interval's confidence, and how many observations a PASS needs at least.
    confidence: float = Field(default=0.95, ge=0.5, lt=1)
    min_samples: int = Field(default=1, ge=1)
    params: dict[str, float | int | str | bool] = Field(default_factory=dict)
    description: str = ""
    # Kinds of data the gate needs beyond the client's records (contract.servers.DATA_KINDS;
    # "a|b": either). Against a target that gives none of one of them it is N/A.
    needs: tuple[str, ...] = ()
    # Set by a gate file that extends the built-in gates and leaves this one out: why. The
    # gate is then N/A with that reason, so the report still shows it was not judged.
    skip: str | None = None
    # k6's abortOnFail / delayAbortEval: while the run goes on, a FAIL of this gate (its point
    # value over the line on the evidence so far) stops the load; not before abort_grace_s
    # into the load. The run is then judged and reported as usual, and FAILs.
    abort_on_fail: bool = False
    abort_grace_s: float = Field(default=0.0, ge=0)

    @property
    def blocking(self) -> bool:
        """Whether a FAIL of this gate fails the run by itself."""
        return self.key if self.blocks is None else self.blocks

    def resolved(self, defaults: Mapping[str, Any]) -> dict[str, Any]:
        """This gate as it judges, in the gate file's own terms: every key after `extends`
        and the defaults, `params` over its metric's `defaults`, `blocks` decided.
        verdict.json keeps it, so whatever reads the verdict later (a report's chart, a
        re-judgement) uses what the gate used, not what the metric's defaults are today;
        GateSpec reads it back as it is."""
        data = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        data["pass"] = self.pass_.text
        if self.warn is not None:
            data["warn"] = self.warn.text
        data["params"] = {**defaults, **self.params}
        data["blocks"] = self.blocking
        return data

    @model_validator(mode="after")
    def _consistent(self) -> GateSpec:
        for need in self.needs:
            unknown = [kind for kind in need.split("|") if kind not in DATA_KINDS]
            if unknown:
                raise ValueError(
                    f"needs: unknown kind of data {', '.join(unknown)}; known: "
                    f"{', '.join(DATA_KINDS)}"
                )
        if self.warn is not None and self.warn.label != self.pass_.label:
            raise ValueError(
                f"warn uses {self.warn.label} but pass uses {self.pass_.label}; "
                "use the same statistic"
            )
        return self


class GateFile(BaseModel):
    """A file of gates; a run whose weighted score falls below `fail_score_below` fails."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    version: Literal[1] = 1
    fail_score_below: float = Field(default=0.75, ge=0, le=1)
    gates: list[GateSpec] = Field(min_length=1)

    @field_validator("gates")
    @classmethod
    def _unique(cls, gates: list[GateSpec]) -> list[GateSpec]:
        seen: set[str] = set()
        for gate in gates:
            if gate.id in seen:
                raise ValueError(f"gate id {gate.id!r} appears twice; ids must be unique")
            seen.add(gate.id)
        return gates


def load_gate_file(path: Path | None = None) -> GateFile:
    """Parse and validate a gate file (the built-in gates when `path` is None)."""
    source = path or BUILTIN_GATES
    data = _read(source)
    if "extends" in data:
        data = _extend(data, source, frozenset({source.resolve()}))
    return checked_gate_file(data, f"gate file {source} is invalid")


def checked_gate_file(data: dict[str, Any], heading: str) -> GateFile:
    """`data` as a gate file that can judge a run: its shape first, then each gate against
    the metric it names. GateSpecError says `heading` and lists every problem of the first
    step that finds any, each by its YAML path."""
    try:
        gate_file = GateFile.model_validate(data)
    except ValidationError as exc:
        shape: list[Problem] = [(err["loc"], _message(err)) for err in exc.errors()]
        raise GateSpecError(_listed(heading, shape, data)) from exc
    unjudgeable: list[Problem] = []
    for i, gate in enumerate(gate_file.gates):
        found = _metric_problem(gate)
        if found is not None:
            where, text = found
            unjudgeable.append((("gates", i, *where), text))
    if unjudgeable:
        raise GateSpecError(_listed(heading, unjudgeable, data))
    return gate_file


def _metric_problem(gate: GateSpec) -> tuple[tuple[str, ...], str] | None:
    """Where in `gate` and why it cannot be judged by the metric it names (None: it can).
    The metric must be registered, and the gate's filters, params and statistic be ones it
    declares."""
    definition = REGISTRY.get(gate.metric)
    if definition is None:
        return (
            (),
            f"metric {gate.metric!r} is unknown; known metrics: {', '.join(sorted(REGISTRY))}",
        )
    unsupported = gate.filter.used_fields() - definition.filters
    if unsupported:
        return ("filter",), (
            f"metric {gate.metric!r} cannot filter by {', '.join(sorted(unsupported))}; "
            f"it supports: {', '.join(sorted(definition.filters)) or 'no filters'}"
        )
    undeclared = set(gate.params) - set(definition.params)
    if undeclared:
        return ("params",), (
            f"metric {gate.metric!r} has no parameter {', '.join(sorted(undeclared))}; "
            f"its parameters: {', '.join(sorted(definition.params)) or 'none'}"
        )
    for name, value in gate.params.items():
        problem = _param_problem(value, definition.params[name])
        choices = definition.choices.get(name)
        if problem is None and choices and value not in choices:
            problem = f"must be one of {', '.join(choices)}, got {value!r}"
        if problem:
            return ("params", name), problem
    allowed = KIND_STATISTICS[definition.kind]
    if gate.pass_.statistic not in allowed:
        shown = ", ".join("p(N)" if a == "p" else a for a in allowed)
        return ("pass",), (
            f"metric {gate.metric!r} is a {definition.kind} metric and cannot be judged "
            f"by {gate.pass_.label}; use one of: {shown}"
        )
    return None


def _param_problem(value: object, default: object) -> str | None:
    """Why `value` cannot stand in for a parameter whose default is `default` (None: fine)."""
    if isinstance(default, bool):
        return None if isinstance(value, bool) else f"must be true or false, got {value!r}"
    if isinstance(default, int | float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"must be a number, got {value!r}"
        if not math.isfinite(value) or value < 0:
            return f"must be a finite number >= 0, got {value!r}"
        return None
    return None if isinstance(value, str) and value else f"must be a text, got {value!r}"


def _listed(heading: str, problems: list[Problem], data: dict[str, Any]) -> str:
    return f"{heading}:\n" + "\n".join(
        f"  {_yaml_path(loc, data)}: {text}" for loc, text in problems
    )


def _read(source: Path) -> dict[str, Any]:
    try:
        text = source.read_text(encoding="utf-8")
    except OSError as exc:
        raise GateSpecError(f"gate file {source} cannot be read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise GateSpecError(
            f"gate file {source} is not UTF-8 text (byte {exc.start}); save it as UTF-8"
        ) from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise GateSpecError(f"gate file {source} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise GateSpecError(f"gate file {source} must be a mapping with a 'gates:' list")
    return data


def _extend(data: dict[str, Any], source: Path, chain: frozenset[Path]) -> dict[str, Any]:
    """`extends: builtin`, or `extends: OTHER.gates.yaml` (a path from this file's folder):
    that file's gates, with `skip: {id: why}` left out (N/A, with the reason) and `gates:`
    added, or overriding the keys they name of its gate of the same id. A soak variant
    changes one window, and every threshold stays in the one file that sets it."""
    name = data.get("extends")
    if not isinstance(name, str) or not name:
        raise GateSpecError(
            f"gate file {source}: extends is 'builtin' or the path of another gate file"
        )
    base_path = BUILTIN_GATES if name == "builtin" else source.parent / name
    if base_path.resolve() in chain:
        raise GateSpecError(f"gate file {source}: extends {name}, which extends it back")
    base = _read(base_path)
    if "extends" in base:
        base = _extend(base, base_path, chain | {base_path.resolve()})
    what = "built-in gate" if name == "builtin" else f"gate of {name}"
    skip = data.get("skip") or {}
    if not isinstance(skip, dict) or not all(isinstance(v, str) and v for v in skip.values()):
        raise GateSpecError(f"gate file {source}: skip maps gate ids to the reason, a string")
    base_gates = [g for g in base.get("gates") or [] if isinstance(g, dict)]
    known = {g.get("id") for g in base_gates}
    unknown = sorted(set(skip) - known)
    if unknown:
        raise GateSpecError(
            f"gate file {source}: skip names no {what}: {', '.join(unknown)}; "
            f"the {what}s are {', '.join(sorted(str(k) for k in known))}"
        )
    own = {g.get("id"): g for g in data.get("gates") or [] if isinstance(g, dict)}
    gates = [  # a gate of the same id overrides the keys it names of the base one
        {
            **g,
            **own.pop(g.get("id"), {}),
            **({"skip": skip[g["id"]]} if g.get("id") in skip else {}),
        }
        for g in base_gates
    ]
    merged = {k: v for k, v in data.items() if k not in ("extends", "skip", "gates")}
    inherited = {k: v for k, v in base.items() if k != "gates"}
    return {**inherited, **merged, "gates": [*gates, *own.values()]}


def _yaml_path(loc: tuple[int | str, ...], data: dict[str, Any]) -> str:
    """`('gates', 2, 'pass')` -> `gates[2] (id: ttft).pass`."""
    parts: list[str] = []
    node: Any = data
    for item in loc:
        if isinstance(item, int):
            parts[-1] += f"[{item}]"
            node = node[item] if isinstance(node, list) and item < len(node) else None
            if isinstance(node, dict) and "id" in node:
                parts[-1] += f" (id: {node['id']})"
        elif item in ("function-after", "function-before") or str(item).startswith("literal["):
            continue
        else:
            parts.append(str(item))
            node = node.get(item) if isinstance(node, dict) else None
    return ".".join(parts) or "(top level)"


def _message(err: Any) -> str:
    message = str(err["msg"])
    return message.removeprefix("Value error, ")
