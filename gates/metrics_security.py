"""Metrics over the security probes' records (contract.PROBE_ROLES): priority escalation and
private prefixes crossing tenants, plus the TTFT side channel of a cross-tenant cache hit.

Both metrics count violations and count as examined only the probes that could show one; a
probe whose answer says nothing either way (a served escalation whose granted priority no
server event shows, a prefix probe without usage details) is listed in the notes instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from contract import Outcome
from gates import stats
from gates.keys import isin
from gates.registry import Cause, Observations, metric
from gates.rundir import RunData
from gates.terms import GateFilter
from gates.windows import select

# A refusal at the door is evidence that the priority was refused, except these statuses:
# 401 refuses the key itself (the plan's keys are not this server's), 429 sheds load after
# the request was let in.
NOT_A_PRIORITY_REFUSAL = (401, 429)
ESCALATION = "escalation"
ROLES = ("prefix_warm", "prefix_probe", "prefix_control")  # one private-prefix probe group


def _probes(run: RunData, role: str | tuple[str, ...]) -> pd.DataFrame:
    roles = (role,) if isinstance(role, str) else role
    return run.requests[run.requests["probe"].isin(roles)]


def _rows(rows: pd.DataFrame, value: Any, detail: Any) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "value": value,
            "request_id": rows["request_id"].to_numpy(),
            "t": rows["t_send"].to_numpy(dtype=float),
            "tenant": rows["tenant"].to_numpy(),
            "replica": rows["replica"].to_numpy(),
            "detail": detail,
        }
    )


def _granted(run: RunData, rows: pd.DataFrame) -> pd.Series:
    """Per probe row: the priorities the server's events show for it, comma-joined ("" if
    none). Request ids are unique per tenant, so events are matched on tenant and id."""
    events = run.server_events
    events = events[isin(events["request_id"], rows["request_id"].unique())]
    events = events[events["priority"].notna()]
    if events.empty or rows.empty:
        return pd.Series("", index=rows.index, dtype=object)
    # the probes' few events, matched as text: grouping by a categorical would go through
    # every category, one per request of the run
    events = events.astype({"tenant": str, "request_id": str})
    seen = events.groupby(["tenant", "request_id"], sort=False)["priority"].agg(
        lambda p: ",".join(sorted(set(p)))
    )
    keys = pd.MultiIndex.from_arrays([rows["tenant"].astype(str), rows["request_id"].astype(str)])
    return pd.Series(seen.reindex(keys).to_numpy(), index=rows.index).fillna("")


@metric(
    "priority_escalations",
    filters=("tenant", "window"),
    unit="count",
    kind="count",
    timing=False,
    cause=Cause.NONE,
)
def priority_escalations(run: RunData, flt: GateFilter, params: Mapping[str, Any]) -> Observations:
    """Escalation probes the server granted: run at the priority asked, which the key lacks.

    Examined: probes whose server events show the priority they ran at (a violation when it
    is the one asked), and probes refused with a 4xx other than 401/429 and no event (the
    priority was refused). A probe served or shed with no event showing its priority is no
    evidence either way and is only counted in the notes.
    """
    rows = select(_probes(run, ESCALATION), run, flt, "t_send", class_column=None)
    if isinstance(rows, str):
        return Observations.none(rows)
    if rows.empty:
        return Observations.none(
            "no escalation probe was sent; add the security_probe traffic class to the plan"
        )
    granted = _granted(run, rows)
    asked = rows["asked_priority"].astype(str).fillna("")
    shown = granted.ne("")
    honoured = shown & pd.Series(
        [bool(a) and a in g.split(",") for a, g in zip(asked, granted, strict=True)],
        index=rows.index,
    )
    status = rows["http_status"]
    refused = ~shown & status.ge(400) & status.lt(500) & ~status.isin(NOT_A_PRIORITY_REFUSAL)
    examined = shown | refused
    bad = rows[honoured]
    detail = [
        f"key {key} asked {a}, which it may not use; the server ran it at {g}, ended {o}"
        for key, a, g, o in zip(
            bad["api_key_name"], asked[honoured], granted[honoured], bad["outcome"], strict=True
        )
    ]
    notes = [
        f"examined {int(examined.sum())}: {int(refused.sum())} refused with a 4xx, "
        f"{int((shown & ~honoured).sum())} run at a priority the key allows, "
        f"{len(bad)} run at the priority asked"
    ]
    unknown = rows[~examined]
    if not unknown.empty:
        why = unknown["outcome"].astype(str) + " " + unknown["http_status"].map(_status_text)
        counts = ", ".join(f"{n} {k}" for k, n in why.value_counts().items())
        notes.append(
            f"not evidence either way ({len(unknown)}: no server event shows the priority "
            f"they got): {counts}"
        )
    return Observations(frame=_rows(bad, 1.0, detail), n_samples=int(examined.sum()), notes=notes)


def _status_text(value: float) -> str:
    return "no status" if pd.isna(value) else f"status={int(value)}"


@dataclass(frozen=True, slots=True)
class PrefixGroups:
    """Private-prefix probe groups, one row each (`warm_*`, `probe_*`, `control_*` columns:
    each role's request columns), and how many groups were left out, by reason."""

    groups: pd.DataFrame
    left_out: dict[str, int]

    def notes(self) -> list[str]:
        return [f"left out: {n} group(s), {why}" for why, n in self.left_out.items()]


def prefix_groups(run: RunData, flt: GateFilter | None = None) -> PrefixGroups | str:
    """Groups whose probe could have hit the owner's cache: all three requests served, owner
    and prober distinct tenants, and the probe served by the warm request's replica when the
    server names replicas (a prefix cache is per replica). A string says why there are none.
    """
    rows = _probes(run, ROLES)
    rows = rows[rows["probe_group"].notna()].astype({"request_id": str})  # a few: as text
    if flt is not None and flt.window != "all":
        chosen = select(rows, run, flt, "t_send", class_column=None)
        if isinstance(chosen, str):
            return chosen
        rows = rows[rows["probe_group"].isin(chosen["probe_group"].unique())]
    if rows.empty:
        return "no private-prefix probe was sent; add the security_probe traffic class to the plan"
    total = rows["probe_group"].nunique()
    once = rows.drop_duplicates(["probe_group", "probe"], keep=False)
    wide = once.pivot(index="probe_group", columns="probe")
    wide.columns = [_column(role, col) for col, role in wide.columns]
    wide = wide.reindex(columns=[_column(role, col) for role in ROLES for col in rows.columns])
    served = wide[[_column(role, "outcome") for role in ROLES]].eq(Outcome.OK)
    wide = wide[served.all(axis=1)]
    left_out = {"not all three requests served": total - len(wide)}
    same_tenant = wide["warm_tenant"].eq(wide["probe_tenant"])
    left_out["owner and prober are one tenant"] = int(same_tenant.sum())
    wide = wide[~same_tenant]
    apart = (
        wide["warm_replica"].notna()
        & wide["probe_replica"].notna()
        & wide["warm_replica"].ne(wide["probe_replica"])
    )
    left_out["the probe ran on another replica than the warm request"] = int(apart.sum())
    return PrefixGroups(wide[~apart], {k: v for k, v in left_out.items() if v})


def _column(role: str, column: str) -> str:
    """A group row's column for one role's request column: `probe_cached_tokens`."""
    return f"{role.removeprefix('prefix_')}_{column}"


@metric(
    "cross_tenant_prefix_hits",
    filters=("window",),
    unit="count",
    kind="count",
    timing=False,
    cause=Cause.NONE,
)
def cross_tenant_prefix_hits(
    run: RunData, flt: GateFilter, params: Mapping[str, Any]
) -> Observations:
    """Private-prefix probes that hit another tenant's cache: cached_tokens above the cold
    control's (one row per hit; the value is the excess in tokens)."""
    found = prefix_groups(run, flt)
    if isinstance(found, str):
        return Observations.none(found)
    wide = found.groups
    usage = wide["probe_cached_tokens"].notna() & wide["control_cached_tokens"].notna()
    notes = found.notes()
    if (~usage).any():
        notes.append(
            f"left out: {int((~usage).sum())} group(s) whose usage reports no cached_tokens"
        )
    timing = side_channel(run, found)
    if timing is not None:
        notes.insert(0, timing.sentence())
    wide = wide[usage]
    if wide.empty:
        obs = Observations.none("no private-prefix probe group could be examined")
        obs.notes = notes
        return obs
    excess = wide["probe_cached_tokens"] - wide["control_cached_tokens"]
    hit = wide[excess > 0]
    detail = [
        f"{p} reused {int(c)} cached tokens of {w}'s private prefix (control: {int(k)})"
        for p, c, w, k in zip(
            hit["probe_tenant"],
            hit["probe_cached_tokens"],
            hit["warm_tenant"],
            hit["control_cached_tokens"],
            strict=True,
        )
    ]
    frame = pd.DataFrame(
        {
            "value": excess[excess > 0].to_numpy(dtype=float),
            "request_id": hit["probe_request_id"].to_numpy(),
            "t": hit["probe_t_send"].to_numpy(dtype=float),
            "tenant": hit["probe_tenant"].to_numpy(),
            "replica": hit["probe_replica"].to_numpy(),
            "detail": detail,
        }
    )
    return Observations(frame=frame, n_samples=len(wide), notes=notes)


@dataclass(frozen=True, slots=True)
class SideChannel:
    """TTFT of the cross-tenant probe minus its cold control's, paired per group (s)."""

    median_s: float
    lo_s: float
    hi_s: float
    pairs: int
    confidence: float = stats.CONFIDENCE

    def reading(self) -> str:
        """What the interval shows: the probe faster (a hit shows in timing), slower, or
        neither at this confidence. Pairs close in time share their load, so under heavy
        queueing they are not independent and the interval is narrower than it should be."""
        if self.hi_s < 0:
            return (
                "the probe is faster, as a cross-tenant cache hit would make it (under heavy "
                "queueing, load alone can too: the gate's cached_tokens decide)"
            )
        if self.lo_s > 0:
            return "the probe is slower than its control"
        return "no difference shown"

    def sentence(self) -> str:
        return (
            f"TTFT side channel: probe minus cold control, median {_ms(self.median_s)} ms "
            f"[{_ms(self.lo_s)}, {_ms(self.hi_s)}] ({self.confidence:.0%}), "
            f"n = {self.pairs} pairs: {self.reading()}"
        )


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:+.1f}" if np.isfinite(seconds) else f"{seconds:+}"


def side_channel(run: RunData, groups: PrefixGroups | None = None) -> SideChannel | None:
    """The paired TTFT difference of probe and control over the groups `prefix_groups`
    keeps, or None without a pair that has both TTFTs. Usage is not needed: on a server
    that reports no cached tokens, timing is how a cross-tenant hit would still show. A pair
    whose control ran on another replica than its probe is left out: the two replicas'
    queues would differ by more than any prefill."""
    if groups is None:
        found = prefix_groups(run)
        if isinstance(found, str):
            return None
        groups = found
    wide = groups.groups
    apart = (
        wide["probe_replica"].notna()
        & wide["control_replica"].notna()
        & wide["probe_replica"].ne(wide["control_replica"])
    )
    timed = wide[wide["probe_ttft_s"].notna() & wide["control_ttft_s"].notna() & ~apart]
    if timed.empty:
        return None
    median, lo, hi = stats.median_difference(
        timed["probe_ttft_s"].to_numpy(dtype=float), timed["control_ttft_s"].to_numpy(dtype=float)
    )
    return SideChannel(median, lo, hi, len(timed))
