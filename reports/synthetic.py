"""Synthetic run directories, vectorised with numpy: benchmark data for the analysis benchmark
and the gate and report tests (not part of judging, so it lives outside `gates`).

`clean` looks like the seed policy behaving (no OOM, fast release, shares under the cap);
`oom` looks like the naive policy (under-reserved requests, OOM and a dead replica, slow
release, a tenant over its cap). Shapes are plausible, not simulated.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

import contract
from contract import EventKind, Outcome, servers
from contract.runmeta import RunMeta
from contract.seed import SEED
from gates import run_profile, schema

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
# Security probes come in linked groups, so they are written as rows of their own (`_probes`).
CLASSES = np.array([c for c in contract.TRAFFIC_CLASSES if c != "security_probe"])
# short_qa, long_context, long_output, shared_prefix, multi_turn, cancel_storm, tenant_burst,
# batch: enough cancellations, batch refusals and preemptions in a few thousand requests for
# every built-in gate to have the evidence its confidence rules need.
CLASS_WEIGHTS = np.array([0.27, 0.06, 0.06, 0.1, 0.08, 0.14, 0.07, 0.22])
# Security probes: more than the security gates' min_samples (30 probes, 20 groups).
ESCALATION_PROBES = 40
PREFIX_GROUPS = 30
PREFIX_TOKENS = 1536
TENANTS = np.array(["acme", "globex", "initech"])
REPLICAS = np.array(["r0", "r1"])
POOL_BLOCKS = 212_992
Flavour = Literal["clean", "oom"]


@dataclass(frozen=True, slots=True)
class Timeline:
    """Idle 10%, stress 70% (alternating peak/trough phases), after-load 20% of `duration`."""

    duration: float

    @property
    def stress(self) -> tuple[float, float]:
        return T0 + 0.1 * self.duration, T0 + 0.8 * self.duration

    @property
    def fault_t(self) -> float:
        return T0 + 0.45 * self.duration

    def phases(self) -> list[dict[str, Any]]:
        a, b = self.stress
        edges = np.linspace(a, b, 5)
        names = ["peak", "trough", "peak", "trough"]
        return [
            {"name": n, "t0": float(edges[i]), "t1": float(edges[i + 1])}
            for i, n in enumerate(names)
        ]

    def in_phase(self, t: np.ndarray, name: str) -> np.ndarray:
        inside = np.zeros(len(t), dtype=bool)
        for p in self.phases():
            if p["name"] == name:
                inside |= (t >= p["t0"]) & (t < p["t1"])
        return inside

    def meta_windows(self) -> dict[str, list[float]]:
        a, b = self.stress
        return {"stress": [a, b], "idle_before": [T0, a], "after_load": [b, T0 + self.duration]}


def make_run(
    out: Path,
    n_requests: int,
    n_samples: int,
    *,
    flavour: Flavour = "clean",
    seed: int = 7,
    fmt: Literal["parquet", "jsonl"] = "parquet",
) -> Path:
    """Write a complete synthetic run directory into `out` (created) and return it."""
    rng = np.random.default_rng(seed)
    line = Timeline(duration=max(120.0, n_requests / 1500.0))
    probes = _probes(rng, line)
    requests = pd.concat(
        [_requests(rng, max(n_requests - len(probes), 0), line, flavour), probes],
        ignore_index=True,
    )
    tables = {
        schema.REQUESTS: requests,
        schema.SERVER_EVENTS: _events(rng, requests, line, flavour),
        schema.SAMPLES: _samples(rng, n_samples, line, flavour),
        schema.FAULTS: _faults(line),
    }
    out.mkdir(parents=True, exist_ok=True)
    for name, frame in tables.items():
        if fmt == "parquet":
            pq.write_table(
                pa.Table.from_pandas(frame, preserve_index=False), out / f"{name}.parquet"
            )
        else:
            frame.to_json(out / f"{name}.jsonl", orient="records", lines=True)
    # The harness takes t_end once every writer has closed: after the last release too.
    t_end = max(T0 + line.duration, float(tables[schema.SERVER_EVENTS]["t"].max()))
    meta = _meta(line, flavour, seed, t_end)
    (out / schema.META_FILE).write_text(json.dumps(meta.dumped(), indent=2))
    return out


def _meta(line: Timeline, flavour: Flavour, seed: int, t_end: float) -> RunMeta:
    policy = "naive" if flavour == "oom" else "seed"
    return RunMeta(
        status="completed",
        plan={"name": "synthetic", "shape": "peak_trough"},
        target={
            "url": "http://127.0.0.1:8000",
            "kind": "reference",
            "model": "llama-3-8b",
            "model_digest": "sha256:model",
            "runtime_version": "kvgate-sim 0.1",
            "gpu_sku": "h100-80gb",
            "scheduler_config_digest": f"sha256:{policy}-config",
            "policy": policy,
            "replicas": [{"id": str(r), "url": None} for r in REPLICAS],
            "config": {**SEED.watermarks(), "tenant_max_share": SEED.tenant_max_share},
        },
        # what the harness keeps of the profile the run used (gates/run_profile.py)
        target_profile=run_profile.snapshot(servers.profile("reference")),
        harness_version="synthetic",
        hosts=[{"hostname": "localhost"}],
        t_start=T0,
        t_end=t_end,
        seed=seed,
        cpu_warning=False,
        cpu_warnings=[],
        sim_lag_ms_p99=4.0,
        sim_lag_bound_ms=50.0,
        windows=line.meta_windows(),
        phases=line.phases(),
        capacity={"rejection_started_users": 96, "timeouts_started_users": 160},
    )


def _send_times(
    rng: np.random.Generator, n: int, line: Timeline, is_batch: np.ndarray
) -> np.ndarray:
    """Uniform over the stress window; batch traffic arrives mostly in troughs (the offline
    queue is fed when interactive load is low), a fifth of it at peaks."""
    spans = line.phases()
    troughs = [p for p in spans if p["name"] == "trough"]
    peaks = [p for p in spans if p["name"] == "peak"]
    pick = rng.integers(0, len(troughs), n)
    at_peak = rng.random(n) < 0.2
    pick_peak = rng.integers(0, len(peaks), n)
    lo = np.where(
        at_peak,
        np.array([p["t0"] for p in peaks])[pick_peak],
        np.array([p["t0"] for p in troughs])[pick],
    )
    hi = np.where(
        at_peak,
        np.array([p["t1"] for p in peaks])[pick_peak],
        np.array([p["t1"] for p in troughs])[pick],
    )
    return np.where(is_batch, rng.uniform(lo, hi), np.sort(rng.uniform(*line.stress, n)))


def _requests(rng: np.random.Generator, n: int, line: Timeline, flavour: Flavour) -> pd.DataFrame:
    cls = rng.choice(CLASSES, size=n, p=CLASS_WEIGHTS / CLASS_WEIGHTS.sum())
    is_batch = cls == "batch"
    t_send = _send_times(rng, n, line, is_batch)
    critical = (cls == "short_qa") & (rng.random(n) < 0.3)
    priority = np.where(is_batch, "batch", np.where(critical, "critical", "interactive"))
    tenant = np.where(critical, "system", np.where(is_batch, "batchco", rng.choice(TENANTS, n)))
    prompt = np.where(cls == "long_context", 32_000, rng.integers(50, 2_000, n))
    max_tokens = np.where(cls == "long_output", 4_096, 256)
    completion = (max_tokens * rng.uniform(0.2, 1.0, n)).astype(int)
    ttft = rng.lognormal(np.log(0.18 if flavour == "clean" else 0.5), 0.5, n) + prompt / 12_000
    e2e = ttft + completion * 0.015
    # The seed policy answers everything or refuses it explicitly; the naive one also times
    # out and fails requests.
    failing = [0.01, 0.01] if flavour == "oom" else [0.0, 0.0]
    outcome = rng.choice(
        np.array([Outcome.OK, Outcome.REJECTED, Outcome.TIMEOUT, Outcome.ERROR]),
        n,
        p=[0.92 - sum(failing), 0.08, *failing],
    ).astype(object)
    outcome[is_batch & (rng.random(n) < 0.55)] = Outcome.REJECTED  # offline work refused at times
    # low priority: refused, not timed out
    outcome[is_batch & (outcome == Outcome.TIMEOUT)] = Outcome.REJECTED
    at_peak = is_batch & line.in_phase(t_send, "peak")
    outcome[at_peak] = Outcome.REJECTED  # the offline queue waits out the peak: refused, 503
    cancelled = (cls == "cancel_storm") & (rng.random(n) < 0.95)
    outcome[cancelled] = Outcome.CANCELLED
    rejected = outcome == Outcome.REJECTED
    # capacity refusals (503) go to batch; online work is refused by its tenant quota (429)
    capacity = is_batch & ((rng.random(n) < 0.5) | at_peak)
    status = np.where(
        rejected, np.where(capacity, 503, 429), np.where(outcome == Outcome.OK, 200, np.nan)
    )
    status = np.where(outcome == Outcome.ERROR, 500, status)
    done = outcome == Outcome.OK
    return pd.DataFrame(
        {
            "request_id": [f"req-{i:08d}" for i in range(n)],
            "traffic_class": cls.astype(object),
            "tenant": tenant.astype(object),
            "priority": priority.astype(object),
            "api_key_name": tenant.astype(object),
            "replica": rng.choice(REPLICAS, n).astype(object),
            "worker": "w0",
            "t_send": t_send,
            "ttft_s": np.where(rejected, np.nan, ttft),
            "e2e_s": np.where(done, e2e, np.nan),
            "itl_mean_s": np.where(done, 0.015, np.nan),
            "itl_p50_s": np.where(done, 0.014, np.nan),
            "itl_p99_s": np.where(done, 0.04, np.nan),
            "itl_max_s": np.where(done, 0.09, np.nan),
            "chunks": np.where(done, completion, 0),
            "prompt_tokens": np.where(rejected, np.nan, prompt),
            "completion_tokens": np.where(done, completion, np.nan),
            "cached_tokens": np.where(cls == "shared_prefix", 512, 0),
            "target_prompt_tokens": prompt,
            "max_tokens": max_tokens,
            "outcome": outcome,
            "http_status": status,
            "error_code": pd.Series(np.where(status == 429, "tenant_quota", "capacity")).where(
                rejected
            ),
            "error_message": None,
            "retry_after_s": np.where(rejected, 1.0, np.nan),
            "cancel_at": np.where(cancelled, t_send + rng.uniform(0.2, 2.0, n), np.nan),
            "finish_reason": pd.Series(np.where(completion < max_tokens, "stop", "length")).where(
                done
            ),
        }
    )


def _probes(rng: np.random.Generator, line: Timeline) -> pd.DataFrame:
    """The security_probe class on a server that keeps both rules (either flavour: neither
    policy changes how keys are checked or prefixes keyed): escalations refused with 403,
    and private-prefix groups whose probe hits nothing and is as fast as its control."""
    t_escalate = np.sort(rng.uniform(*line.stress, ESCALATION_PROBES))
    rows: list[dict[str, Any]] = [
        {
            "request_id": f"probe-esc-{i:04d}",
            "tenant": "nightly",
            "priority": "critical",
            "asked_priority": "critical",
            "probe": "escalation",
            "t_send": t,
            "e2e_s": 0.002,
            "outcome": Outcome.REJECTED,
            "http_status": 403,
            "error_code": "priority_not_allowed",
            "target_prompt_tokens": 32,
        }
        for i, t in enumerate(t_escalate)
    ]
    starts = np.sort(rng.uniform(*line.stress, PREFIX_GROUPS))
    for g, t in enumerate(starts):
        replica = str(REPLICAS[g % len(REPLICAS)])
        for k, (role, tenant) in enumerate(
            (("prefix_warm", "acme"), ("prefix_probe", "globex"), ("prefix_control", "globex"))
        ):
            ttft = float(rng.lognormal(np.log(0.25), 0.2))
            rows.append(
                {
                    "request_id": f"probe-{role}-{g:04d}",
                    "tenant": tenant,
                    "priority": "interactive",
                    "asked_priority": "interactive",
                    "probe": role,
                    "probe_group": f"pg-{g:04d}",
                    "replica": replica,
                    "t_send": t + k,
                    "ttft_s": ttft,
                    "e2e_s": ttft + 0.1,
                    "chunks": 8,
                    "prompt_tokens": PREFIX_TOKENS + 42,
                    "completion_tokens": 8,
                    "cached_tokens": 0,
                    "target_prompt_tokens": PREFIX_TOKENS + 32,
                    "max_tokens": 8,
                    "outcome": Outcome.OK,
                    "http_status": 200,
                    "finish_reason": "length",
                }
            )
    frame = pd.DataFrame(rows).reindex(columns=list(schema.REQUEST_COLUMNS))
    frame["traffic_class"] = "security_probe"
    frame["api_key_name"] = frame["tenant"]
    frame["worker"] = "w0"
    frame["chunks"] = frame["chunks"].fillna(0)
    frame["max_tokens"] = frame["max_tokens"].fillna(8)
    return frame


def _events(
    rng: np.random.Generator, req: pd.DataFrame, line: Timeline, flavour: Flavour
) -> pd.DataFrame:
    held = req[req["outcome"].ne(Outcome.REJECTED)]
    n = len(held)
    prompt = held["target_prompt_tokens"].to_numpy()
    reserve = prompt + held["max_tokens"].to_numpy()
    bias = 0.8 if flavour == "oom" else 1.0  # the naive policy under-reserves
    reserved = (reserve * bias).astype(int)
    used = (prompt + held["completion_tokens"].fillna(held["max_tokens"] * 0.5).to_numpy()).astype(
        int
    )
    t_admit = held["t_send"].to_numpy() + 0.01
    slow = 2.5 if flavour == "oom" else 0.08
    cancel = held["cancel_at"].to_numpy()
    t_release = np.where(
        np.isnan(cancel),
        t_admit + held["e2e_s"].fillna(1.0).to_numpy(),
        cancel + rng.exponential(slow, n),
    )
    blocks = -(-reserved // 16)
    usage = np.clip(rng.normal(0.6 if flavour == "clean" else 0.9, 0.1, n), 0, 1)
    common = {
        "replica": held["replica"].to_numpy(),
        "request_id": held["request_id"].to_numpy(),
        "tenant": held["tenant"].to_numpy(),
        "priority": held["priority"].to_numpy(),
        "reason": None,
        "pool_used_blocks": (usage * POOL_BLOCKS).astype(int),
        "pool_total_blocks": POOL_BLOCKS,
    }
    admitted = pd.DataFrame({**common, "t": t_admit, "event": EventKind.ADMITTED})
    admitted = admitted.assign(blocks=blocks, reserved_tokens=reserved, used_tokens=prompt)
    released = pd.DataFrame({**common, "t": t_release, "event": EventKind.RELEASED})
    released = released.assign(blocks=blocks, reserved_tokens=0, used_tokens=used)
    lost = flavour == "oom"  # the naive policy loses preempted work; the seed policy finishes it
    pre = (rng.random(n) < 0.17) & (
        held["outcome"].eq(Outcome.OK).to_numpy() | (lost & (rng.random(n) < 0.3))
    )
    # the seed policy takes its victims below the critical tier; the naive one takes anyone
    pre &= held["priority"].ne("critical").to_numpy() | lost
    preempted = admitted[pre].assign(
        event=EventKind.PREEMPTED, t=t_admit[pre] + 0.5, reason="pressure"
    )
    # what was preempted and still answered was resumed first
    back = pre & held["outcome"].eq(Outcome.OK).to_numpy()
    resumed = admitted[back].assign(event=EventKind.RESUMED, t=t_admit[back] + 0.6)
    parts = [admitted, released, preempted, resumed]
    if flavour == "oom":
        parts.append(_oom_rows(line.fault_t - 5.0))
    events = pd.concat(parts, ignore_index=True).sort_values("t", kind="stable", ignore_index=True)
    events["seq"] = np.arange(len(events))
    return events[list(schema.SERVER_EVENT_COLUMNS)]


def _oom_rows(t_oom: float) -> pd.DataFrame:
    """Replica r1 runs out of memory and dies."""
    return pd.DataFrame(
        {
            "t": [t_oom, t_oom + 0.1],
            "replica": ["r1", "r1"],
            "request_id": None,
            "tenant": None,
            "priority": None,
            "event": [EventKind.OOM, EventKind.REPLICA_DIED],
            "blocks": 0,
            "reserved_tokens": 0,
            "used_tokens": 0,
            "reason": ["CUDA out of memory", "exit 1: CUDA out of memory"],
            "pool_used_blocks": POOL_BLOCKS,
            "pool_total_blocks": POOL_BLOCKS,
        }
    )


def _samples(rng: np.random.Generator, m: int, line: Timeline, flavour: Flavour) -> pd.DataFrame:
    """Long-form samples: per scrape, one row per series of every metric the charts use."""
    series = _sample_series(flavour)
    scrapes = max(m // len(series), 10)
    t = np.linspace(T0, T0 + line.duration, scrapes)
    a, b = line.stress
    load = np.where((t >= a) & (t <= b), 1.0, 0.0) * (0.7 + 0.15 * np.sin((t - a) / 20.0))
    frames = []
    for target, metric, labels, fn in series:
        frames.append(
            pd.DataFrame(
                {
                    "t": t,
                    "source": "prometheus",
                    "target": target,
                    "metric": metric,
                    "labels": labels,
                    "value": fn(t, load, rng),
                }
            )
        )
    frame = pd.concat(frames, ignore_index=True)
    return frame[list(schema.SAMPLE_COLUMNS)]


def _sample_series(flavour: Flavour) -> list[tuple[str, str, str, Any]]:
    peak = 1.0 if flavour == "clean" else 1.35
    share_cap = 0.12 if flavour == "clean" else 0.19
    out: list[tuple[str, str, str, Any]] = []
    for r in REPLICAS:
        out += [
            (
                r,
                "kvgate_pool_usage_ratio",
                "",
                lambda t, x, g: np.clip(0.03 + x * peak + g.normal(0, 0.01, len(t)), 0, 1),
            ),
            (
                r,
                "kvgate_pool_used_blocks",
                "",
                lambda t, x, g: np.round(POOL_BLOCKS * (0.03 + x * 0.9 * peak)),
            ),
            (r, "kvgate_pool_blocks_total", "", lambda t, x, g: np.full(len(t), POOL_BLOCKS)),
            (
                r,
                "kvgate_sim_gpu_memory_used_bytes",
                "category=kv",
                lambda t, x, g: 1e9 + x * 5.2e10 * peak,
            ),
            (
                r,
                "kvgate_sim_gpu_memory_used_bytes",
                "category=weights",
                lambda t, x, g: np.full(len(t), 1.6e10),
            ),
            (r, "kvgate_sim_gpu_memory_total_bytes", "", lambda t, x, g: np.full(len(t), 8.0e10)),
            (r, "kvgate_oom_total", "", lambda t, x, g: np.zeros(len(t))),
            (
                r,
                "kvgate_evictions_total",
                "reason=cold_prefix",
                lambda t, x, g: np.cumsum(x > 0.75),
            ),
            (
                r,
                "kvgate_evictions_total",
                "reason=soft_quota",
                lambda t, x, g: np.cumsum(x > 0.8) // 2,
            ),
        ]
        for tenant in (*TENANTS, "batchco"):
            out.append(
                (
                    r,
                    "kvgate_tenant_pool_share",
                    f"tenant={tenant}",
                    lambda t, x, g, c=share_cap: np.clip(
                        x * c / 0.85 + g.normal(0, 0.002, len(t)), 0, c
                    ),
                )
            )
    out.append(
        ("gateway", "kvgate_gateway_ledger_drift_tokens", "", lambda t, x, g: np.zeros(len(t)))
    )
    return out


def _faults(line: Timeline) -> pd.DataFrame:
    """Two kills, r1 then r0, each restarted after 6 s."""
    starts = [line.fault_t, line.fault_t + 20.0]
    return pd.DataFrame(
        {
            "fault_id": ["f1", "f2"],
            "kind": ["kill", "kill"],
            "effect": ["kills", "kills"],
            "target": ["r1", "r0"],
            "pid": [4242, 4243],
            "t_start": starts,
            "t_end": [t + 6.0 for t in starts],
            "params": [json.dumps({"signal": "SIGKILL"})] * 2,
            "outcome": [Outcome.OK, Outcome.OK],
            "rollback": ["restarted", "restarted"],
        }
    )
