"""The gate spec: YAML validated by pydantic, with k6-style one-line thresholds (`p(95) <= 0.9`).

A gate names a metric from the registry (gates/metrics.py), a filter, a pass threshold and
an optional, stricter warning threshold: a value that meets `pass` but not `warn` is
MARGINAL. Errors name the YAML path (`gates[2] (id: ttft).pass`) and the allowed values.

A file is checked in two steps, as k6 checks its thresholds at init: pydantic checks its
shape (the models here, which know no metric), then the loader checks each gate against the
metric it names (`checked_gate_file`). The thresholds and filters are gates/terms.py's.

A gate that blocks a release says why in its own declaration (`blocks: "a cross-tenant
prefix hit leaks one tenant's prompt to another"`), and the reason is shown wherever its
failure is. The rules a person writing a file is held to (the reason, a warn no looser than
pass, thresholds written in their metric's unit) are not applied to the gates a verdict
keeps: those are read back as they judged, so an old run judged again gets the same answer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from contract.servers import DATA_KINDS
from gates.metrics import REGISTRY
from gates.terms import KIND_STATISTICS, GateFilter, Threshold, misfit

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
# The validation context under which GateFile reads the gates a verdict keeps (`kept`).
KEPT = {"kept": True}
UPPER, LOWER = ("<", "<="), (">", ">=")


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
    # Why this gate's FAIL fails the run on its own, whatever the score: a text that blocks
    # the release and is its reason, or false (its FAIL only lowers the score). `key` says
    # more: a key gate without data or evidence makes the run INVALID, so a gate that a run
    # may rightly have no data for (no preemption happened, no probe was sent) blocks
    # without being key. A gate file must give a key gate's reason too; `true` (and None
    # on a key gate: it blocked) is only read back from a verdict that kept no reason.
    blocks: str | bool | None = Field(default=None, validate_default=True)
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
    # k6's abortOnFail / delayAbortEval: while the run goes on, a FAIL of this gate (decided
    # by its anytime-valid bound on the evidence so far, gates/sequential.py) stops the load;
    # not before abort_grace_s into the load. The run is then judged and reported as usual,
    # and FAILs.
    abort_on_fail: bool = False
    abort_grace_s: float = Field(default=0.0, ge=0)

    @property
    def blocking(self) -> bool:
        """Whether a FAIL of this gate fails the run by itself."""
        return self.key if self.blocks is None else bool(self.blocks)

    @property
    def blocks_because(self) -> str | None:
        """Why a FAIL of this gate blocks the release (None: it does not, or, for a verdict
        written before reasons were kept, nobody wrote it down)."""
        return self.blocks if isinstance(self.blocks, str) else None

    def resolved(self, defaults: Mapping[str, Any]) -> dict[str, Any]:
        """This gate as it judges, in the gate file's own terms: every key after `extends`
        and the defaults, `params` over its metric's `defaults`, `blocks` decided (its reason,
        else whether it blocks).
        verdict.json keeps it, so whatever reads the verdict later (a report's chart, a
        re-judgement) uses what the gate used, not what the metric's defaults are today;
        GateSpec reads it back as it is."""
        data = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        data["pass"] = self.pass_.text
        if self.warn is not None:
            data["warn"] = self.warn.text
        data["params"] = {**defaults, **self.params}
        data["blocks"] = self.blocks_because or self.blocking
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
        return self

    @field_validator("warn")
    @classmethod
    def _stricter(cls, warn: Threshold | None, info: ValidationInfo) -> Threshold | None:
        """A warning line is on the same side as `pass` and at least as strict, so that a
        value can meet `pass` and still break `warn` (MARGINAL); a looser one never fires."""
        line = info.data.get("pass_")
        if warn is None or not isinstance(line, Threshold):
            return warn
        if warn.label != line.label:
            raise ValueError(
                f"warn uses {warn.label} but pass uses {line.label}; use the same statistic"
            )
        if _kept(info):
            return warn
        if line.op not in (*UPPER, *LOWER):
            raise ValueError(
                f"pass `{line.text}` has no stricter side (its operator is {line.op}): "
                "leave warn out"
            )
        side = UPPER if line.op in UPPER else LOWER
        if warn.op not in side:
            raise ValueError(
                f"warn `{warn.text}` bounds the other side from pass `{line.text}`: a warning "
                "line bounds the same side, and is stricter"
            )
        looser = warn.value > line.value if side == UPPER else warn.value < line.value
        if looser:
            most = "at most" if side == UPPER else "at least"
            raise ValueError(
                f"warn `{warn.text}` is looser than pass `{line.text}`: a warning line is "
                f"stricter, so that a value can meet pass and still break it; write a number "
                f"{most} {line.number}{line.unit}"
            )
        return warn

    @field_validator("blocks")
    @classmethod
    def _reason(cls, blocks: str | bool | None, info: ValidationInfo) -> str | bool | None:
        if isinstance(blocks, str):
            blocks = blocks.strip()
        if _kept(info):
            return blocks
        if blocks is True:
            raise ValueError(
                "blocks takes the reason this gate blocks a release, as text, written from "
                "what the release requires and what a breach costs: "
                '`blocks: "a cross-tenant prefix hit leaks one tenant\'s prompt to another"`; '
                "`blocks: false` to have its FAIL only lower the score"
            )
        if blocks == "":
            raise ValueError(
                "blocks is empty: give the reason this gate blocks a release, or `blocks: false`"
            )
        if isinstance(blocks, str) and blocks.lower() in ("true", "false", "yes", "no"):
            raise ValueError(
                f"blocks is the text {blocks!r}, which would read as its reason: write the "
                "reason this gate blocks a release, or false unquoted"
            )
        if blocks is None and info.data.get("key"):
            raise ValueError(
                "a key gate blocks a release when it fails: say why, "
                '`blocks: "..."` (what the release requires, and what a breach costs), or '
                "`blocks: false` to have its FAIL only lower the score"
            )
        return blocks


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


def checked_gate_file(data: dict[str, Any], heading: str, *, kept: bool = False) -> GateFile:
    """`data` as a gate file that can judge a run: its shape first, then each gate against
    the metric it names. GateSpecError says `heading` and lists every problem of the first
    step that finds any, each by its YAML path. `kept`: the gates a verdict keeps, read back
    as they judged, without the rules for writing a file (module docstring)."""
    try:
        gate_file = GateFile.model_validate(data, context=KEPT if kept else None)
    except ValidationError as exc:
        shape: list[Problem] = [(err["loc"], _message(err)) for err in exc.errors()]
        raise GateSpecError(_listed(heading, shape, data)) from exc
    unjudgeable: list[Problem] = []
    for i, gate in enumerate(gate_file.gates):
        found = _metric_problem(gate)
        if found is not None:
            where, text = found
            unjudgeable.append((("gates", i, *where), text))
        elif not kept:
            unjudgeable.extend((("gates", i, *where), text) for where, text in _misfits(gate))
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


def _misfits(gate: GateSpec) -> list[tuple[tuple[str, ...], str]]:
    """The gate's thresholds that are not written in its metric's unit (gates/terms.py's
    `misfit`), each with where it is and what would fit."""
    unit = REGISTRY[gate.metric].unit
    lines = [("pass", gate.pass_), ("warn", gate.warn)]
    return [
        ((name,), problem)
        for name, line in lines
        if line is not None and (problem := misfit(line, gate.metric, unit)) is not None
    ]


def _kept(info: ValidationInfo) -> bool:
    return bool(info.context and info.context.get("kept"))


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
