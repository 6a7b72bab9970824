"""Host contention: other processes on the run's host took CPU its server and its load
generator needed (the foreign CPU, which harness/samplers/host.py samples once a second).

A server kvgate runs on its own host (the reference server, a vLLM it starts, a `transformers
serve` on loopback) is as fast as the CPU it gets. Beside a busy neighbour, another job, or a
hypervisor that steals its time, a correct server really is slow, and its latency gates fail
although nothing is wrong with it. Measured on a 2-core host: `transformers serve`'s correct
run read critical TTFT p95 0.34 s on a quiet machine and 1.05 s (FAIL) beside a test suite
that used a whole core; the correct vLLM configuration fell from 40 to 3 requests a second,
and FAILed availability, beside two suites that used nearly both. A release manager who
reads FAIL rolls back, so such a run is INVALID with the reason, and its findings doubt
timing: as with a load generator over its CPU budget, a timing breach then counts only when
it is +inf, and a breach no timing can fake (an OOM, a tenant over its cap, a cross-tenant
prefix hit) still FAILs it (gates/evaluator.py, rule 1).

The bounds, shares of the host's CPUs (contract/host.py; a plan sets its own as
samplers.foreign_cpu_bound_share and samplers.foreign_cpu_window_bound_share, and meta.json
keeps the run's, which judging it again reads):
- a mean of 25% over the load: half a core on a 2-core host, half of the smallest
  contention measured to turn a correct run into a FAIL (a whole core), and far above what
  a host's own daemons and kernel threads use (about a hundredth of a core there);
- 50% in any 10 s of it: a p99 is the slowest 1% of the requests, and 10 s of a load of a
  few minutes holds more than that, so a burst that slows every request in it can move a
  p99 alone while the mean over the load stays low; half the host is the whole core
  measured to triple a p95.
Half of either bound, short of it, is a note: the run is judged, and the reader knows it ran
on a host that was not quiet. A run without the samples (recorded before kvgate sampled its
host, or with samplers.host off), or whose target on this host could not be found, gets a
note that the contention was not measured: never INVALID for that.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from contract.host import (
    FOREIGN_MEAN_BOUND_SHARE,
    FOREIGN_WINDOW_BOUND_SHARE,
    FOREIGN_WINDOW_S,
    HostCpu,
)
from gates import schema
from gates.evidence.base import Effect, Finding, evidence_check
from gates.rundir import RunData

CHECK = "host_contention"
NOTICED = 0.5  # of either bound: noted, though the run is judged
STEAL_SHOWN = 0.05  # cores stolen on average from which the message says so


@evidence_check(CHECK, order=230)
def host_contention(run: RunData) -> list[Finding]:
    """Other processes on the host used no more of its CPUs than the bounds while the load ran."""
    samples = run.samples
    span = _load_span(run.meta)
    during = samples[_within(samples["t"], span)]
    foreign = _series(during, HostCpu.FOREIGN)
    reasons = _unmeasured(during)
    if foreign.empty:
        return [_not_measured(reasons)]
    cpus = _cpus(samples, run.meta)
    if cpus is None:
        return [
            Finding(
                CHECK,
                Effect.NOTE,
                f"other processes on this host used {_cores(foreign.mean())} CPUs on average "
                "during the load, but neither the samples nor meta.json say how many CPUs it "
                "has: the contention could not be held against its bounds",
                table=schema.SAMPLES,
            )
        ]
    mean, worst = float(foreign.mean()), _worst_window(foreign)
    mean_bound = _share(run.meta, "foreign_cpu_bound_share", FOREIGN_MEAN_BOUND_SHARE)
    window_bound = _share(run.meta, "foreign_cpu_window_bound_share", FOREIGN_WINDOW_BOUND_SHARE)
    used = (
        f"other processes on this host used {_cores(mean)} of its {cpus:g} CPUs on average "
        f"during the load ({mean / cpus:.0%}; worst {FOREIGN_WINDOW_S:g} s: {_cores(worst)}, "
        f"{worst / cpus:.0%}){_stolen(during)}"
    )
    bounds = (
        f"{mean_bound:.0%} of its CPUs on average and {window_bound:.0%} in any "
        f"{FOREIGN_WINDOW_S:g} s, as samplers.foreign_cpu_bound_share and "
        "samplers.foreign_cpu_window_bound_share set them"
    )
    found = []
    if mean > mean_bound * cpus or worst > window_bound * cpus:
        found.append(
            Finding(
                CHECK,
                Effect.INVALID,
                f"{used}: the server's and the client's timings are not this system's; rerun "
                f"on a quiet host (the bounds: {bounds})",
                table=schema.SAMPLES,
                doubts_timing=True,
            )
        )
    elif mean >= NOTICED * mean_bound * cpus or worst >= NOTICED * window_bound * cpus:
        found.append(
            Finding(
                CHECK,
                Effect.NOTE,
                f"{used}: within the bounds ({bounds}), so the run was judged, on a host that "
                "was not quiet",
                table=schema.SAMPLES,
            )
        )
    if reasons:
        found.append(_partly_measured(reasons, len(foreign)))
    return found


def _load_span(meta: dict[str, Any]) -> tuple[float, float] | None:
    """The stress window, else the run's, else None (every sample)."""
    windows = meta.get("windows")
    for span in (
        windows.get("stress") if isinstance(windows, dict) else None,
        (meta.get("t_start"), meta.get("t_end")),
    ):
        if isinstance(span, list | tuple) and len(span) == 2:
            t0, t1 = span
            if isinstance(t0, int | float) and isinstance(t1, int | float):
                return float(t0), float(t1)
    return None


def _within(t: pd.Series, span: tuple[float, float] | None) -> pd.Series:
    if span is None:
        return pd.Series(True, index=t.index)
    return (t >= span[0]) & (t <= span[1])


def _series(samples: pd.DataFrame, metric: HostCpu) -> pd.Series:
    """`metric`'s readings, indexed by time (epoch s), in time order."""
    rows = samples[samples["metric"].eq(str(metric))].dropna(subset=["t", "value"])
    return pd.Series(rows["value"].to_numpy(float), index=rows["t"].to_numpy(float)).sort_index()


def _worst_window(foreign: pd.Series) -> float:
    """The highest mean over FOREIGN_WINDOW_S seconds of samples; the mean of all when the
    load was shorter. A window counts once the samples cover its whole length (each reading
    covers the interval before it, about a sampling step)."""
    t = foreign.index.to_numpy(float)
    step = float(np.median(np.diff(t))) if len(t) > 1 else 0.0
    full = t - t[0] + step >= FOREIGN_WINDOW_S
    if not full.any():
        return float(foreign.mean())
    times = pd.to_datetime(t, unit="s")
    rolling = pd.Series(foreign.to_numpy(), index=times).rolling(f"{FOREIGN_WINDOW_S}s").mean()
    return float(rolling.to_numpy()[full].max())


def _cpus(samples: pd.DataFrame, meta: dict[str, Any]) -> float | None:
    """The host's CPU count: as the sampler read it, else meta.json's first host's."""
    counted = _series(samples, HostCpu.CPUS)
    if not counted.empty and counted.max() > 0:
        return float(counted.max())
    hosts = meta.get("hosts")
    first = hosts[0] if isinstance(hosts, list) and hosts and isinstance(hosts[0], dict) else {}
    cpus = first.get("cpus")
    return float(cpus) if isinstance(cpus, int) and cpus > 0 else None


def _share(meta: dict[str, Any], field: str, default: float) -> float:
    """The run's own bound (meta.json), else kvgate's default (a run built by hand)."""
    value = meta.get(field)
    return float(value) if isinstance(value, int | float) and value > 0 else default


def _stolen(samples: pd.DataFrame) -> str:
    steal = _series(samples, HostCpu.STEAL)
    if steal.empty or steal.mean() < STEAL_SHOWN:
        return ""
    return f", {_cores(steal.mean())} of them stolen by the hypervisor"


def _unmeasured(samples: pd.DataFrame) -> dict[str, int]:
    """Why seconds went unmeasured -> how many, from the sampler's `unmeasured` rows."""
    rows = samples[samples["metric"].eq(str(HostCpu.UNMEASURED))]
    reasons = rows["labels"].astype(str).str.removeprefix("reason=")
    return {str(k): int(v) for k, v in reasons.value_counts().items()}


def _not_measured(reasons: dict[str, int]) -> Finding:
    why = (
        f" ({'; '.join(reasons)})"
        if reasons
        else " (no host samples: a run recorded before kvgate sampled its host's CPU, or "
        "with samplers.host off)"
    )
    return Finding(
        CHECK,
        Effect.NOTE,
        f"the CPU other processes used on this host during the load was not measured{why}: "
        "whether a busy neighbour slowed the server or the load generator cannot be said",
    )


def _partly_measured(reasons: dict[str, int], measured: int) -> Finding:
    missing = sum(reasons.values())
    return Finding(
        CHECK,
        Effect.NOTE,
        f"the CPU other processes used was not measured in {missing} of the load's "
        f"{missing + measured} host samples ({'; '.join(reasons)}): the contention was "
        "judged on the rest",
        table=schema.SAMPLES,
    )


def _cores(value: float) -> str:
    return f"{value:.2f}" if value < 1 else f"{value:.1f}"
