"""A run as an llm-d Benchmark Report (v0.2.1, the `llmd-benchmark-report` package): what
kvgate knows of the run mapped onto the report's fields, and validated by the package's own
models before anything is written.

Filled: `run` (a uid derived from the run, its start, end and duration, a description as
llm-d's tools write it: model and plan); `scenario.stack` (the target: the reference
deployment as an inference engine on its simulated GPU behind its gateway, a vLLM kvgate
started as an inference engine on its device, any other server as a generic component;
its configuration under `native.config`); `scenario.load` (kvgate and its version, the load
generator processes, random prompts, the prompt lengths aimed for and the output lengths
asked, multi-turn sessions when the run had some, the resolved plan under `native.config`);
`results.request_performance.aggregate`: requests sent, refused or failed (`failures`) and
cancelled by the client (`incomplete`); over requests answered in full, input and output
tokens as the server counted them, time to first token, end to end, time per output token
after the first (TPOT) and including it (NTPOT), the mean and maximum inter-token gap, and
request, input, output and total token rates over the span from the first send to the last
answer. Which fields stay empty, and why, is in reports/README.md ("kvgate export").
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from datetime import UTC, datetime
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from llmd_benchmark_report import BenchmarkReport, load_benchmark_report
from llmd_benchmark_report.schema_v0_2 import VERSION

from contract import Outcome
from contract.runmeta import RunMeta

COLUMNS: Final = (
    "traffic_class",
    "outcome",
    "t_send",
    "ttft_s",
    "e2e_s",
    "itl_mean_s",
    "itl_max_s",
    "chunks",
    "prompt_tokens",
    "completion_tokens",
    "target_prompt_tokens",
    "max_tokens",
)
TOOL: Final = "kvgate"
# The report's percentile names and the percentiles they stand for.
PERCENTILES: Final = {
    "p0p1": 0.1,
    "p1": 1.0,
    "p5": 5.0,
    "p10": 10.0,
    "p25": 25.0,
    "p50": 50.0,
    "p75": 75.0,
    "p90": 90.0,
    "p95": 95.0,
    "p99": 99.0,
    "p99p9": 99.9,
}


# A report is made to be shared: no key a plan or a target holds may leave in it. Values of
# fields so named are redacted, and so is the same text wherever else it appears; the first
# place of a tenant identity (key, key name, tenant) that a class attribute gives is a key.
SECRET_FIELD: Final = re.compile(r"(^|_)(key|token|secret|password)$", re.IGNORECASE)
IDENTITY_LISTS: Final = frozenset({"owner", "prober", "tenant_pool", "escalations"})
REDACTED: Final = "<redacted>"


class ReportInvalid(Exception):
    """The report kvgate built does not validate: a bug of the mapping, not of the run."""


def build_report(meta: RunMeta, requests: pa.Table) -> BenchmarkReport:
    """The run's Benchmark Report, validated by the package (ReportInvalid otherwise)."""
    data = {
        "version": VERSION,
        "run": _run(meta),
        "scenario": {"stack": _stack(meta), "load": _load(meta, requests)},
        "results": {"request_performance": {"aggregate": _aggregate(requests)}},
    }
    try:
        return load_benchmark_report(data)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise ReportInvalid(str(exc)) from exc


def _plan(meta: RunMeta) -> dict[str, Any]:
    plan: dict[str, Any] = redacted(meta.plan or {})
    return plan


def _model(meta: RunMeta) -> str:
    return (meta.target.model if meta.target else None) or "unknown model"


def _run(meta: RunMeta) -> dict[str, Any]:
    name = _plan(meta).get("name") or "plan"
    # The same run exports the same uid: its plan and the instant it started.
    uid = uuid.uuid5(uuid.NAMESPACE_URL, f"kvgate-run:{name}:{meta.t_start!r}").hex
    time: dict[str, Any] = {}
    if meta.t_start is not None:
        time["start"] = datetime.fromtimestamp(meta.t_start, tz=UTC)
    if meta.t_end is not None:
        time["end"] = datetime.fromtimestamp(meta.t_end, tz=UTC)
    if meta.t_start is not None and meta.t_end is not None:
        time["duration"] = f"PT{max(meta.t_end - meta.t_start, 0.0):.3f}S"
    return {"uid": uid, "time": time or None, "description": f"{_model(meta)} [{name}]"}


def redacted(value: Any) -> Any:
    """`value` (JSON) without its secrets: see SECRET_FIELD and IDENTITY_LISTS."""
    secrets: set[str] = set()
    _collect_secrets(value, secrets)
    return _redact(value, secrets)


def _collect_secrets(value: Any, secrets: set[str]) -> None:
    if isinstance(value, dict):
        for name, item in value.items():
            if SECRET_FIELD.search(str(name)) and isinstance(item, str):
                secrets.add(item)
            elif str(name) in IDENTITY_LISTS and isinstance(item, list):
                identities = item if item and isinstance(item[0], list) else [item]
                secrets.update(i[0] for i in identities if i and isinstance(i[0], str))
            else:
                _collect_secrets(item, secrets)
    elif isinstance(value, list):
        for item in value:
            _collect_secrets(item, secrets)


def _redact(value: Any, secrets: set[str]) -> Any:
    if isinstance(value, dict):
        return {name: _redact(item, secrets) for name, item in value.items()}
    if isinstance(value, list):
        return [_redact(item, secrets) for item in value]
    return REDACTED if isinstance(value, str) and value in secrets else value


def _digest(value: Any) -> str:
    canonical = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _stack(meta: RunMeta) -> list[dict[str, Any]]:
    """The target as components: what serves (an inference engine where its accelerator is
    known, else a generic component) and, for the reference deployment, its gateway."""
    target = meta.target
    if target is None:
        return []
    kind = target.kind or "openai"
    config = redacted(target.config or {})
    version = target.runtime_version or "unknown"
    cfg_id = target.scheduler_config_digest or _digest(config)
    engine = _accelerator(meta)
    metadata = {"label": kind, "cfg_id": cfg_id}
    if engine is None:
        standardized: dict[str, Any] = {
            "kind": "generic",
            "tool": kind,
            "tool_version": version,
            "model": {"name": _model(meta)},
        }
        return [{"metadata": metadata, "standardized": standardized, "native": {"config": config}}]
    replicas, accelerator = engine
    server = {
        "metadata": metadata | {"label": f"{kind}-replicas"},
        "standardized": {
            "kind": "inference_engine",
            "tool": f"kvgate-{kind}" if kind == "reference" else kind,
            "tool_version": version,
            "role": "replica",
            "replicas": replicas,
            "model": {"name": _model(meta)},
            "accelerator": accelerator,
        },
        "native": {"config": config},
    }
    if kind != "reference":
        return [server]
    gateway = {
        "metadata": {
            "label": "reference-gateway",
            "cfg_id": cfg_id,
            "description": "routes to the replicas; tenant quotas, priorities, failover",
        },
        "standardized": {"kind": "generic", "tool": "kvgate-gateway", "tool_version": version},
        "native": {},
    }
    return [gateway, server]


def _accelerator(meta: RunMeta) -> tuple[int, dict[str, Any]] | None:
    """(replicas, accelerator) where kvgate knows what the server ran on: the reference
    deployment's simulated GPU, one per replica, or the device of a vLLM kvgate started
    (the GPUs NVML listed on a CUDA host). None for a server kvgate does not run."""
    target = meta.target
    plan_target = _plan(meta).get("target") or {}
    if target is None:
        return None
    parallelism: dict[str, Any] = {}
    if target.kind == "reference":
        replicas = max(len(target.replicas or []), 1)
        sku = target.gpu_sku or "unknown"
        model = f"{sku} (simulated)"
        return replicas, {"model": model, "count": replicas, "parallelism": parallelism}
    if plan_target.get("type") != "vllm":
        return None
    if plan_target.get("device") == "cpu":
        return 1, {"model": "cpu", "count": 0, "parallelism": parallelism}
    names = sorted({g.name for g in meta.gpus or [] if g.name})
    if not names:
        return None
    count = len(meta.gpus or [])
    return 1, {"model": ", ".join(names), "count": count, "parallelism": parallelism}


def _numbers(requests: pa.Table, column: str) -> np.ndarray:
    values: np.ndarray = requests.column(column).to_numpy()
    return values


def _is(requests: pa.Table, column: str, value: str) -> np.ndarray:
    """Rows whose `column` is `value` (a missing value is not)."""
    equal = pc.equal(requests.column(column), pa.scalar(value)).to_numpy(zero_copy_only=False)
    flags: np.ndarray = np.equal(equal, True)  # nulls read as None: not equal
    return flags


def _load(meta: RunMeta, requests: pa.Table) -> dict[str, Any]:
    plan = _plan(meta)
    workers = len((meta.records.by_worker if meta.records else None) or {}) or 1
    standardized: dict[str, Any] = {
        "tool": TOOL,
        "tool_version": meta.harness_version or "unknown",
        "parallelism": workers,
        # kvgate's prompts are words drawn at random from a vocabulary (workloads/prompts.py)
        "source": "random",
        "input_seq_len": _length(_numbers(requests, "target_prompt_tokens")),
        "output_seq_len": _length(_numbers(requests, "max_tokens")),
    }
    if _is(requests, "traffic_class", "multi_turn").any():
        standardized["multi_turn"] = {"enabled": True}
    return {
        "metadata": {"cfg_id": _digest(plan), "description": plan.get("name")},
        "standardized": standardized,
        "native": {"config": plan},
    }


def _length(values: np.ndarray) -> dict[str, Any] | None:
    """A sequence length over the values given (None when there are none): fixed when all
    requests had the same, else `other` (kvgate mixes traffic classes) with its spread."""
    values = values[np.isfinite(values)]
    if not len(values):
        return None
    low, high = int(values.min()), int(values.max())
    if low == high:
        return {"distribution": "fixed", "value": low}
    return {
        "distribution": "other",
        "value": float(values.mean()),
        "std_dev": float(values.std()),
        "min": low,
        "max": high,
    }


def statistics(values: np.ndarray, units: str) -> dict[str, Any] | None:
    """The report's Statistics over the finite values (None when there are none): mean,
    population standard deviation, extremes and percentiles (linear interpolation)."""
    values = values[np.isfinite(values)]
    if not len(values):
        return None
    quantiles = np.percentile(values, list(PERCENTILES.values()))
    return {
        "units": units,
        "mean": float(values.mean()),
        "stddev": float(values.std()),
        "min": float(values.min()),
        "max": float(values.max()),
        **{name: float(q) for name, q in zip(PERCENTILES, quantiles, strict=True)},
    }


def _aggregate(requests: pa.Table) -> dict[str, Any]:
    ok = _is(requests, "outcome", Outcome.OK)
    cancelled = _is(requests, "outcome", Outcome.CANCELLED)
    prompt = _numbers(requests, "prompt_tokens")[ok]
    completion = _numbers(requests, "completion_tokens")[ok]
    return {
        "requests": {
            "total": requests.num_rows,
            "failures": int((~ok & ~cancelled).sum()),
            "incomplete": int(cancelled.sum()),
            "input_length": statistics(prompt, "count"),
            "output_length": statistics(completion, "count"),
        },
        "latency": _latency(requests, ok),
        "throughput": _throughput(requests, ok),
    }


def _latency(requests: pa.Table, ok: np.ndarray) -> dict[str, Any]:
    ttft = _numbers(requests, "ttft_s")[ok]
    e2e = _numbers(requests, "e2e_s")[ok]
    tokens = _numbers(requests, "completion_tokens")[ok]
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(tokens >= 2, (e2e - ttft) / (tokens - 1), np.nan)
        ntpot = np.where(tokens >= 1, e2e / tokens, np.nan)
    return {
        "time_to_first_token": statistics(ttft, "s"),
        "time_per_output_token": statistics(tpot, "s/token"),
        "normalized_time_per_output_token": statistics(ntpot, "s/token"),
        "inter_token_latency": _inter_token(requests, ok),
        "request_latency": statistics(e2e, "s"),
    }


def _inter_token(requests: pa.Table, ok: np.ndarray) -> dict[str, Any] | None:
    """The mean gap over every gap of every answered request (each request's mean weighted by
    its gaps) and the longest; the records keep each request's summary, not its gaps, so no
    percentile over all gaps can be had. A gap is between content chunks: one token each on
    servers that stream a token per chunk (the reference server, vLLM)."""
    mean = _numbers(requests, "itl_mean_s")[ok]
    gaps = _numbers(requests, "chunks")[ok] - 1
    longest = _numbers(requests, "itl_max_s")[ok]
    has = np.isfinite(mean) & (gaps >= 1)
    if not has.any():
        return None
    pooled = float((mean[has] * gaps[has]).sum() / gaps[has].sum())
    return {"units": "s/token", "mean": pooled, "max": float(np.nanmax(longest[has]))}


def _throughput(requests: pa.Table, ok: np.ndarray) -> dict[str, Any] | None:
    """Mean rates over the load as sent: from the first send to the last answer's end."""
    sent = _numbers(requests, "t_send")
    ended = sent + _numbers(requests, "e2e_s")
    if not np.isfinite(sent).any() or not ok.any():
        return None
    span = float(np.nanmax(np.fmax(ended, sent)) - np.nanmin(sent))
    if span <= 0:
        return None
    prompt = float(np.nansum(_numbers(requests, "prompt_tokens")[ok]))
    completion = float(np.nansum(_numbers(requests, "completion_tokens")[ok]))

    def rate(amount: float, units: str) -> dict[str, Any]:
        return {"units": units, "mean": amount / span}

    return {
        "request_rate": rate(float(ok.sum()), "queries/s"),
        "input_token_rate": rate(prompt, "tokens/s"),
        "output_token_rate": rate(completion, "tokens/s"),
        "total_token_rate": rate(prompt + completion, "tokens/s"),
    }
