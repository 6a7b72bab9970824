"""Hand-built run directories with known answers, for the gate and report tests.

Times are seconds from T0; the default windows are idle [0, 10], stress [10, 100],
after-load [100, 120].
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from contract.host import HostCpu
from gates import schema

T0 = 1_000_000.0


class RunBuilder:
    """Collects rows of the four tables and meta.json, then writes them as a run directory."""

    def __init__(self) -> None:
        self.meta: dict[str, Any] = {
            "status": "completed",  # as the harness writes a run that ran to its end
            "plan": {"name": "hand-built"},
            "target": {
                "kind": "reference",
                "model": "llama-3-8b",
                "policy": "seed",
                "scheduler_config_digest": "sha256:hand",
                "config": {"admission_watermark": 0.82, "tenant_max_share": 0.15},
            },
            "harness_version": "test",
            "t_start": T0,
            "t_end": T0 + 120,
            "cpu_warning": False,
            "cpu_warnings": [],
            "sim_lag_ms_p99": 1.0,
            "sim_lag_bound_ms": 50.0,
            "windows": {
                "idle_before": [T0, T0 + 10],
                "stress": [T0 + 10, T0 + 100],
                "after_load": [T0 + 100, T0 + 120],
            },
            "phases": [],
            "capacity": {"rejection_started_users": None, "timeouts_started_users": None},
        }
        self.rows: dict[str, list[dict[str, Any]]] = {name: [] for name in schema.TABLES}

    def request(self, request_id: str, t: float = 20.0, **fields: Any) -> RunBuilder:
        row: dict[str, Any] = dict.fromkeys(schema.REQUEST_COLUMNS)
        row |= {
            "request_id": request_id,
            "traffic_class": "short_qa",
            "tenant": "acme",
            "priority": "interactive",
            "t_send": T0 + t,
            "outcome": "ok",
            "http_status": 200,
            "target_prompt_tokens": 100,
        }
        row |= fields
        if row.get("cancel_at") is not None:
            row["cancel_at"] = T0 + row["cancel_at"]
        self.rows[schema.REQUESTS].append(row)
        return self

    def event(self, event: str, t: float, replica: str = "r0", **fields: Any) -> RunBuilder:
        seq = len(self.rows[schema.SERVER_EVENTS])
        row: dict[str, Any] = dict.fromkeys(schema.SERVER_EVENT_COLUMNS)
        row |= {"t": T0 + t, "replica": replica, "seq": seq, "event": event, "blocks": 0}
        row |= {
            "pool_used_blocks": 0,
            "pool_total_blocks": 1000,
            "reserved_tokens": 0,
            "used_tokens": 0,
        }
        row |= fields
        self.rows[schema.SERVER_EVENTS].append(row)
        return self

    def sample(
        self,
        metric: str,
        value: float,
        t: float,
        target: str = "r0",
        labels: str = "",
        source: str = "prometheus",
    ) -> RunBuilder:
        row = {
            "t": T0 + t,
            "source": source,
            "target": target,
            "metric": metric,
            "labels": labels,
            "value": value,
        }
        self.rows[schema.SAMPLES].append(row)
        return self

    def fault(
        self,
        t_start: float,
        target: str = "r1",
        kind: str = "kill",
        t_end: float | None = None,
        params: dict[str, Any] | None = None,
        effect: str | None = None,
    ) -> RunBuilder:
        """A faults row; without `effect`, a row as kvgate wrote it before that column."""
        row = {
            "fault_id": f"f{len(self.rows[schema.FAULTS])}",
            "kind": kind,
            "target": target,
            "pid": 1,
            "t_start": T0 + t_start,
            "t_end": None if t_end is None else T0 + t_end,
            "params": json.dumps(params or {}),
            "outcome": "ok",
            "rollback": "restarted",
        }
        self.rows[schema.FAULTS].append(row if effect is None else row | {"effect": effect})
        return self

    def write(self, path: Path, fmt: str = "jsonl") -> Path:
        path.mkdir(parents=True, exist_ok=True)
        (path / schema.META_FILE).write_text(json.dumps(self.meta))
        for name, rows in self.rows.items():
            if not rows:
                continue
            if fmt == "parquet":
                pd.DataFrame(rows).to_parquet(path / f"{name}.parquet", index=False)
            else:
                (path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return path


# A request that ran to its end: all 64 tokens it asked for, finish_reason `length` (a
# stream with content has its first token's time: the evidence checks refuse one without).
FINISHED: dict[str, Any] = {
    "ttft_s": 0.2,
    "e2e_s": 3.0,
    "chunks": 64,
    "completion_tokens": 64,
    "max_tokens": 64,
    "finish_reason": "length",
}


def preempted(completed: int, lost: int = 0) -> RunBuilder:
    """Preempted requests: `completed` that were resumed and finished all they asked for,
    and `lost` that ended in an error."""
    b = RunBuilder()
    for i in range(completed):
        b.request(f"p{i}", **FINISHED).event("preempted", 30, request_id=f"p{i}")
        b.event("resumed", 30.5, request_id=f"p{i}")
    for i in range(lost):
        b.request(f"lost{i}", outcome="error").event("preempted", 30, request_id=f"lost{i}")
    return b


def batch_waiting(b: RunBuilder, t0: float, t1: float, n: int = 5) -> RunBuilder:
    """`n` batch requests queued at t0 and admitted at t1: lower-priority work that waits."""
    for i in range(n):
        rid = f"b{t0}-{i}"
        b.request(rid, t=t0, priority="batch", traffic_class="batch", ttft_s=t1 - t0 + 0.1)
        b.event("queued", t0, request_id=rid, priority="batch")
        b.event("admitted", t1, request_id=rid, priority="batch")
    return b


def critical(b: RunBuilder, start: float, n: int, ttft: float) -> RunBuilder:
    """`n` critical short_qa requests from `start`, 0.1 s apart, each with first token `ttft`."""
    for i in range(n):
        b.request(f"c{start}-{i}", t=start + i * 0.1, priority="critical", ttft_s=ttft)
    return b


def cpu_warning(b: RunBuilder) -> RunBuilder:
    """The load generator hit its CPU warning: the run's timings cannot be trusted."""
    b.meta["cpu_warning"] = True
    b.meta["cpu_warnings"] = [{"t": 0, "worker": "local", "cpu_percent": 97}]
    return b


def host_cpu(
    b: RunBuilder,
    foreign: Callable[[float], float],
    cpus: int = 2,
    steal: float = 0.0,
    span: tuple[float, float] = (0.0, 120.0),
) -> RunBuilder:
    """The host sampler's rows once a second over `span`: `foreign(t)` cores used by other
    processes at +t s (`steal` of them stolen by the hypervisor), the rest idle."""
    for second in range(int(span[0]) + 1, int(span[1]) + 1):
        rows = {
            HostCpu.CPUS: float(cpus),
            HostCpu.BUSY: foreign(second) - steal + 0.4,
            HostCpu.STEAL: steal,
            HostCpu.KVGATE: 0.4,
            HostCpu.FOREIGN: foreign(second),
        }
        for metric, value in rows.items():
            b.sample(str(metric), value, second, target="host", source="host")
    return b


def gate_file(path: Path, *gates: str) -> Path:
    """A gate file made of YAML gate entries (each a string of `- id: ...` YAML)."""
    body = "version: 1\ngates:\n" + "\n".join(gates)
    path.write_text(body)
    return path


PREFIX_TOKENS = 1536  # the security probe's private prefix


def prefix_group(
    b: RunBuilder,
    g: int,
    *,
    cached: tuple[int | None, int | None] = (0, 0),
    ttft: tuple[float, float] = (0.30, 0.30),
    replicas: tuple[str | None, str | None, str | None] = ("r0", "r0", "r0"),
    warm_outcome: str = "ok",
    prober: str = "globex",
) -> RunBuilder:
    """One private-prefix probe group of the security_probe class: acme warms its private
    prefix, `prober` sends the identical prompt and a cold control; `cached` and `ttft` are
    the probe's and the control's, `replicas` the warm request's, probe's and control's."""
    roles = (
        ("prefix_warm", "acme", None, 0.35, replicas[0]),
        ("prefix_probe", prober, cached[0], ttft[0], replicas[1]),
        ("prefix_control", prober, cached[1], ttft[1], replicas[2]),
    )
    for k, (role, tenant, cached_tokens, ttft_s, replica) in enumerate(roles):
        ok = warm_outcome == "ok" or role != "prefix_warm"
        b.request(
            f"{role}-{g}",
            t=20 + g + k * 0.3,
            traffic_class="security_probe",
            tenant=tenant,
            probe=role,
            probe_group=f"pg-{g}",
            replica=replica,
            cached_tokens=cached_tokens if role != "prefix_warm" else 0,
            ttft_s=ttft_s if ok else None,
            outcome="ok" if ok else warm_outcome,
            http_status=200 if ok else 503,
            target_prompt_tokens=PREFIX_TOKENS + 32,
        )
    return b
