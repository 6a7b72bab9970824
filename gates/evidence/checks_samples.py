"""Samples the gates cannot read as written: shares outside 0..1, a gauge in percent, nulls.

A share gauge (a KV pool's used share, a tenant's share of it) is 0..1 wherever the gates
read it. An engine whose gauge is in percent (0..100) would read as a pool 85 times full,
or a tenant at 1600% of its cap: nothing true could be judged on it, so such a run is
refused, naming the rows and where the gauge's scale is declared (the server profile's
`metrics.kv_usage_scale`, contract/servers.py). A profile that declares a scale other than
1 has its gauge converted to a share before the gates read it, and the verdict says so.

A null reading (a writer that lost a value) is no reading: the metrics skip it (a counter's
increase is taken across it, gates/windows.py), and the verdict counts them per metric.
"""

from __future__ import annotations

import pandas as pd

from contract import servers
from gates.evidence.base import Effect, Finding, evidence_check, flagged
from gates.rundir import RunData

TENANT_SHARE = "kvgate_tenant_pool_share"
# Float rounding of a ratio (blocks / total) stays far below this; a reading beyond it is
# not a share.
SHARE_SLACK = 1e-3


def share_gauges(run: RunData) -> dict[str, float]:
    """Each share-valued metric name -> the scale that makes its readings a share: the run's
    own profile's kv_usage gauge by its declared scale, every other profile's as a share."""
    gauges = dict.fromkeys((*servers.metric_names("kv_usage"), TENANT_SHARE), 1.0)
    own = run.profile.metrics
    gauges.update(dict.fromkeys(own.kv_usage, own.kv_usage_scale))
    return gauges


@evidence_check("share_range", order=40)
def share_range(run: RunData) -> list[Finding]:
    """Share-valued samples (KV usage, a tenant's pool share) lie within 0..1 (as scaled)."""
    samples = run.samples
    findings = []
    for name, scale in share_gauges(run).items():
        values = samples.loc[samples["metric"].eq(name), "value"].dropna()
        shares = values * scale
        bad = shares[(shares < -SHARE_SLACK) | (shares > 1 + SHARE_SLACK)]
        if bad.empty:
            continue
        first = bad.index[0]
        message = (
            f"share gauge {name} reads {values[first]:g} at row {first} ({len(bad)} of its "
            f"{len(values)} readings lie outside 0..1 once scaled by {scale:g}; a share is 0..1)"
            f"; {_hint(run, name, values)}"
        )
        findings.append(
            flagged("share_range", Effect.REFUSE, message, "samples", bad.index.tolist(), "value")
        )
    return findings


def _hint(run: RunData, name: str, values: pd.Series) -> str:
    looks = (
        "every reading lies within 0..100, so they look like percent"
        if values.between(0, 100).all()
        else "they are no share at any scale"
    )
    if name not in run.profile.metrics.kv_usage:
        return f"{looks}: fix what wrote the run to record a share"
    return (
        f"{looks}: the run's profile ({run.profile.source_file}, kept in meta.json as "
        f"target_profile) reads {name} with metrics.kv_usage_scale "
        f"{run.profile.metrics.kv_usage_scale:g}; if this engine reports percent, set "
        "`kv_usage_scale: 0.01` under metrics there and judge again with --current-profiles"
    )


@evidence_check("share_scale", order=105)
def share_scale(run: RunData) -> list[Finding]:
    """A KV-usage gauge the profile declares in another scale is read as a share."""
    metrics = run.profile.metrics
    if metrics.kv_usage_scale == 1.0:
        return []
    samples = run.samples
    scaled = samples["metric"].isin(metrics.kv_usage)
    if not scaled.any():
        return []
    converted = samples.copy()
    converted.loc[scaled, "value"] = converted.loc[scaled, "value"] * metrics.kv_usage_scale
    run.samples = converted
    message = (
        f"{int(scaled.sum())} readings of {', '.join(metrics.kv_usage)} were multiplied by "
        f"{metrics.kv_usage_scale:g} (the profile's metrics.kv_usage_scale) to read as shares"
    )
    return [
        flagged(
            "share_scale",
            Effect.NOTE,
            message,
            "samples",
            samples.index[scaled].tolist(),
            "value",
        )
    ]


@evidence_check("sample_nulls", order=120)
def sample_nulls(run: RunData) -> list[Finding]:
    """Null sample values are counted per metric (the metrics skip them)."""
    samples = run.samples
    null = samples["value"].isna()
    if not null.any():
        return []
    counts = samples.loc[null, "metric"].astype(str).fillna("(no metric)").value_counts()
    listed = ", ".join(f"{metric} {n}" for metric, n in counts.items())
    message = (
        f"{int(null.sum())} samples have no value ({listed}): each is left out, and a "
        "counter's increase is taken from its last reading before them"
    )
    return [
        flagged("sample_nulls", Effect.NOTE, message, "samples", null[null].index.tolist(), "value")
    ]
