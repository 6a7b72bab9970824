"""Which gates apply to a run: the data each gate needs against what its target can give.

A gate declares `needs` (kinds of data, contract.servers.DATA_KINDS; "a|b" is either). A
kind is available when the target's server profile (the snapshot meta.json keeps, else
contract/profiles/ by meta.target.kind: gates/run_profile.py) provides it, or when the
run's tables show it anyway (a hand-built run directory, a server giving more than its
profile says). A gate whose need is neither is N/A, with the reason: the run is judged on
the gates that apply. A kind the profile promises but the run lacks is not N/A but missing
data, judged as such (a scrape that failed is a problem to see).
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from contract import EventKind, servers
from gates.rundir import RunData

# The request events only a scheduler that logs them gives.
REQUEST_EVENTS = (
    EventKind.ADMITTED,
    EventKind.QUEUED,
    EventKind.PREEMPTED,
    EventKind.RELEASED,
    EventKind.FINISHED,
    EventKind.CANCELLED,
)
RELEASE_HISTOGRAM = "kvgate_release_latency_seconds_bucket"
GPU_MEMORY_METRICS = ("DCGM_FI_DEV_FB_USED", "kvgate_sim_gpu_memory_used_bytes")


def target_profile(run: RunData) -> servers.ServerProfile:
    """The profile the run is judged by: its meta.json snapshot, else today's file, said so
    in the verdict (gates/run_profile.py)."""
    return run.profile


def kv_usage_metrics() -> tuple[str, ...]:
    """Every profile's KV-usage gauge names, and the reference pool's block count."""
    return (*servers.metric_names("kv_usage"), "kvgate_pool_used_blocks")


def _has_metric(run: RunData, names: tuple[str, ...]) -> bool:
    return bool(run.samples["metric"].isin(names).any())


def _events(run: RunData, kinds: tuple[str, ...]) -> pd.DataFrame:
    events = run.server_events
    return events[events["event"].isin(kinds)]


# How a run's own tables show each kind of data, whatever its profile says.
SEEN: dict[str, Callable[[RunData], bool]] = {
    "server_events": lambda run: not _events(run, REQUEST_EVENTS).empty,
    "granted_priority": lambda run: bool(_events(run, REQUEST_EVENTS)["priority"].notna().any()),
    "tenant_share": lambda run: (
        _has_metric(run, ("kvgate_tenant_pool_share",))
        or bool(_events(run, (EventKind.ADMITTED,))["tenant"].notna().any())
    ),
    "gateway_ledger": lambda run: _has_metric(run, ("kvgate_gateway_ledger_drift_tokens",)),
    "kv_usage": lambda run: _has_metric(run, kv_usage_metrics()),
    "gpu_memory": lambda run: _has_metric(run, GPU_MEMORY_METRICS),
    "release_timing": lambda run: (
        not _events(run, (EventKind.RELEASED,)).empty or _has_metric(run, (RELEASE_HISTOGRAM,))
    ),
    "cached_tokens": lambda run: bool(run.requests["cached_tokens"].notna().any()),
    "preemption_count": lambda run: (
        not _events(run, (EventKind.PREEMPTED,)).empty
        or _has_metric(run, servers.metric_names("preemptions"))
    ),
}
assert set(SEEN) == set(servers.DATA_KINDS), "every data kind needs a way to be seen"


def available(run: RunData, kind: str) -> bool:
    key = ("available", kind)
    if key not in run.cache:
        profile = target_profile(run)
        run.cache[key] = kind not in profile.lacks and (kind in profile.provides or SEEN[kind](run))
    return bool(run.cache[key])


def not_applicable(run: RunData, needs: tuple[str, ...]) -> str | None:
    """Why a gate needing `needs` cannot apply to this run's target, or None if it can."""
    profile = target_profile(run)
    for need in needs:
        options = need.split("|")
        if any(available(run, kind) for kind in options):
            continue
        lacking = [profile.lacks[kind] for kind in options if kind in profile.lacks]
        if lacking:
            return f"{'; '.join(lacking)} ({profile.source_file})"
        what = " or ".join(servers.DATA_KINDS[kind] for kind in options)
        return (
            f"needs {what}, which {profile.title} targets do not give "
            f"({profile.source_file}) and this run does not show"
        )
    return None
