"""Server profiles: what each kind of serving stack gives kvgate, as data.

One YAML file per kind in contract/profiles/ (reference, vllm, sglang, tgi, openai) says
where its info endpoints are, the names of its metrics (KV usage, running and waiting
requests, preemptions, prefix-cache queries and hits, request counters), which request
extensions it accepts (and, for the priority field, each priority's value), which kinds of
data (`DATA_KINDS`) it provides beyond the client's own records, and which of the seed's
pool watermarks its scheduler keeps. Each file cites the documentation its names come from.
Adding a server kind means adding one file here; the harness (what to send, what to
scrape), the gates (which apply) and the reports (which lines a chart draws) read the same
profile.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from contract import PRIORITIES
from contract.seed import SEED

PROFILE_DIR: Final = Path(__file__).with_name("profiles")

# What a gate may need beyond the client's records (which every target gives), and what each
# kind of data is. A gate that needs data its target cannot give is N/A, with the reason.
DATA_KINDS: Final = MappingProxyType(
    {
        "server_events": "per-request scheduler events (admitted, preempted, released, ...)",
        "granted_priority": "the priority each request actually ran at",
        "tenant_share": "each tenant's share of the KV pool over time",
        "gateway_ledger": "a gateway's reservation ledger across replicas",
        "kv_usage": "KV-cache usage of the pool over time",
        "gpu_memory": "GPU memory over time (NVML, or the simulated GPU's)",
        "release_timing": "when a cancelled request's KV blocks were released",
        "cached_tokens": "prefix-cache hits per request (usage.prompt_tokens_details)",
        "preemption_count": "how many requests the scheduler preempted",
    }
)
# Facts about the served model that kvgate reads from a server's info endpoints, and what
# each is. A profile says where each one lives (`info_fields`), so a server that puts one
# elsewhere needs a line in its profile, not code.
INFO_FIELDS: Final = MappingProxyType(
    {
        "max_model_len": "the longest prompt plus output the server takes, in its tokens",
    }
)
DEFAULT_INFO_FIELDS: Final = MappingProxyType(
    {"max_model_len": "/v1/models#/data/*/max_model_len"}  # vLLM's, and SGLang's
)
# Request fields beyond the OpenAI API that a workload may send, when the profile says so.
# Each is `true` or `false` in a profile, except `priority_field`: `false`, or the value each
# of contract.PRIORITIES goes out as (the server's integers).
EXTENSIONS: Final = (
    "ignore_eos",
    "min_tokens",
    "priority_header",
    "priority_field",
    "cache_salt",
    "continuous_usage_stats",
)


class MetricNames(BaseModel):
    """Prometheus names per quantity; the first one a scrape shows is used (names change
    between releases, so older ones may follow)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kv_usage: tuple[str, ...] = ()  # gauge, used share of the KV pool, 0..1
    # What one unit of the kv_usage gauge is as a share of the pool: 1 for a gauge in 0..1 (every
    # engine kvgate knows), 0.01 for one in percent. The gates read shares: gates/evidence
    # converts the readings by this before judging, and refuses a share outside 0..1.
    kv_usage_scale: float = Field(default=1.0, gt=0.0, le=1.0)
    running: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()
    preemptions: tuple[str, ...] = ()  # counter
    prefix_queries: tuple[str, ...] = ()  # counter
    prefix_hits: tuple[str, ...] = ()  # counter
    request_success: tuple[str, ...] = ()  # counter
    request_failure: tuple[str, ...] = ()  # counter
    request_aborts: tuple[str, ...] = ()  # counter


class ServerProfile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    title: str
    sources: tuple[str, ...] = Field(min_length=1)  # where the names below come from
    health_path: str = "/health"
    info_paths: tuple[str, ...] = ("/v1/models",)
    # Where each of INFO_FIELDS lives: `PATH#/json/pointer`, PATH one of info_paths, and `*`
    # for every element of a list (the first that holds a value is used).
    info_fields: Mapping[str, str] = Field(default_factory=lambda: dict(DEFAULT_INFO_FIELDS))
    metric_prefixes: tuple[str, ...] = ()  # metric families the sampler keeps
    metrics: MetricNames = MetricNames()
    extensions: Mapping[str, StrictBool | Mapping[str, StrictInt]] = Field(default_factory=dict)
    provides: frozenset[str] = frozenset()
    # Kinds of data this kind of server cannot give, whatever a run shows, and why: a gate
    # that needs one is N/A with that reason (a vLLM's recorded events carry the priority
    # each request ran at, but vLLM has no API keys, so no priority is ever "not allowed").
    lacks: Mapping[str, str] = Field(default_factory=dict)
    # The pool-usage watermarks this kind of server's scheduler keeps, by the seed's names
    # (contract/seed.py, SEED.watermarks()): the report draws each on the pool chart, at the
    # run's configured value (meta.json's target.config) or the seed's, and a rollback
    # recommends an admission watermark only to a scheduler that has one. None by default:
    # vLLM fills its cache and preempts, and promised no line it would stay under.
    watermarks: tuple[str, ...] = ()

    @field_validator("watermarks")
    @classmethod
    def _known_watermarks(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        known = SEED.watermarks()
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise ValueError(f"watermarks: unknown watermarks {unknown}; known: {', '.join(known)}")
        return tuple(name for name in known if name in value)  # the ladder's order, each once

    @field_validator("lacks")
    @classmethod
    def _known_lacks(cls, value: Mapping[str, str]) -> Mapping[str, str]:
        unknown = sorted(set(value) - set(DATA_KINDS))
        if unknown:
            raise ValueError(f"lacks: unknown data kinds {unknown}; known: {', '.join(DATA_KINDS)}")
        return MappingProxyType(dict(value))

    @field_validator("info_fields")
    @classmethod
    def _known_info_fields(cls, value: Mapping[str, str]) -> Mapping[str, str]:
        unknown = sorted(set(value) - set(INFO_FIELDS))
        if unknown:
            raise ValueError(
                f"info_fields: unknown facts {unknown}; known: {', '.join(INFO_FIELDS)}"
            )
        for name, where in value.items():
            path, hash_, pointer = where.partition("#")
            if not path.startswith("/") or not hash_ or not pointer.startswith("/"):
                raise ValueError(
                    f"info_fields.{name}: {where!r} is not PATH#/json/pointer "
                    "(e.g. /v1/models#/data/*/max_model_len)"
                )
        return MappingProxyType(dict(value))

    @model_validator(mode="after")
    def _info_fields_on_info_paths(self) -> ServerProfile:
        for name, where in self.info_fields.items():
            path = where.partition("#")[0]
            if path not in self.info_paths:
                raise ValueError(
                    f"info_fields.{name} reads {path}, which is not one of info_paths "
                    f"({', '.join(self.info_paths)}): add it there"
                )
        return self

    def info_value(self, name: str, server_info: Mapping[str, Any]) -> Any:
        """The fact `name` (INFO_FIELDS) from what the info endpoints answered (path ->
        JSON), where this kind of server keeps it; None when it is not there."""
        where = self.info_fields.get(name)
        if where is None:
            return None
        path, _, pointer = where.partition("#")
        found = _pointed(server_info.get(path), pointer.split("/")[1:])
        return next((v for v in found if v is not None), None)

    @field_validator("extensions")
    @classmethod
    def _known_extensions(
        cls, value: Mapping[str, bool | Mapping[str, int]]
    ) -> Mapping[str, bool | Mapping[str, int]]:
        unknown = sorted(set(value) - set(EXTENSIONS))
        if unknown:
            raise ValueError(f"unknown extensions {unknown}; known: {', '.join(EXTENSIONS)}")
        checked: dict[str, bool | Mapping[str, int]] = {}
        for name, setting in value.items():
            if name == "priority_field":
                checked[name] = _priority_mapping(name, setting)
            elif isinstance(setting, Mapping):
                raise ValueError(f"extension {name}: give true or false, not a mapping")
            else:
                checked[name] = setting
        return MappingProxyType(checked)

    @field_validator("provides")
    @classmethod
    def _known_data(cls, value: frozenset[str]) -> frozenset[str]:
        unknown = sorted(value - set(DATA_KINDS))
        if unknown:
            raise ValueError(f"unknown data kinds {unknown}; known: {', '.join(DATA_KINDS)}")
        return value

    def accepts(self, extension: str) -> bool:
        """Whether requests to this kind of server may carry `extension` (EXTENSIONS)."""
        return self.extensions.get(extension, False) is not False

    @property
    def priority_values(self) -> Mapping[str, int] | None:
        """What each priority goes out as in the body's `priority` field; None: no field."""
        values = self.extensions.get("priority_field", False)
        return values if isinstance(values, Mapping) else None

    def priority_value(self, priority: str) -> int | None:
        """The `priority` field's value for one of contract.PRIORITIES; None where this kind
        of server takes no priority field."""
        if priority not in PRIORITIES:
            raise ValueError(f"unknown priority {priority!r}; one of {', '.join(PRIORITIES)}")
        values = self.priority_values
        return None if values is None else values[priority]

    @property
    def source_file(self) -> str:
        return f"contract/profiles/{self.kind}.yaml"


def _pointed(node: Any, steps: list[str]) -> list[Any]:
    """The values at a JSON pointer's `steps` below `node`, `*` standing for every element of
    a list (or value of an object)."""
    if not steps:
        return [node]
    step, rest = steps[0], steps[1:]
    if step == "*":
        children = (
            node
            if isinstance(node, list)
            else list(node.values())
            if isinstance(node, dict)
            else []
        )
        return [v for child in children for v in _pointed(child, rest)]
    if isinstance(node, dict) and step in node:
        return _pointed(node[step], rest)
    if isinstance(node, list) and step.isdigit() and int(step) < len(node):
        return _pointed(node[int(step)], rest)
    return []


def _priority_mapping(name: str, setting: bool | Mapping[str, int]) -> bool | Mapping[str, int]:
    """`false`, or a value for exactly each of contract.PRIORITIES: a server that is sent the
    field for some priorities and not others would run those at its own default."""
    if setting is False:
        return False
    if not isinstance(setting, Mapping):
        raise ValueError(
            f"extension {name}: give each priority's value ({', '.join(PRIORITIES)}), or false"
        )
    missing = [p for p in PRIORITIES if p not in setting]
    unknown = sorted(set(setting) - set(PRIORITIES))
    if missing or unknown:
        raise ValueError(
            f"extension {name}: give a value for each of {', '.join(PRIORITIES)}"
            + (f"; missing {missing}" if missing else "")
            + (f"; unknown priorities {unknown}" if unknown else "")
        )
    return MappingProxyType({p: setting[p] for p in PRIORITIES})


@cache
def profiles() -> Mapping[str, ServerProfile]:
    """Every profile in contract/profiles/, by kind; a broken file is a ValueError naming it."""
    found: dict[str, ServerProfile] = {}
    for path in sorted(PROFILE_DIR.glob("*.yaml")):
        try:
            profile = ServerProfile.model_validate(yaml.safe_load(path.read_text()))
        except (ValidationError, yaml.YAMLError) as exc:
            raise ValueError(f"server profile {path}: {exc}") from exc
        if profile.kind != path.stem:
            raise ValueError(f"server profile {path} says kind {profile.kind!r}; name it so")
        found[profile.kind] = profile
    return MappingProxyType(found)


def profile(kind: str | None) -> ServerProfile:
    """The profile of `kind`; an unknown or missing kind gets the generic `openai` one."""
    known = profiles()
    return known.get(kind or "openai", known["openai"])


def kinds() -> tuple[str, ...]:
    return tuple(profiles())


def metric_names(quantity: str) -> tuple[str, ...]:
    """Every profile's names for one quantity of MetricNames (e.g. "kv_usage"), each once."""
    names: dict[str, None] = {}
    for p in profiles().values():
        names.update(dict.fromkeys(getattr(p.metrics, quantity)))
    return tuple(names)
