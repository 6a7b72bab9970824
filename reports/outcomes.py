"""How every request ended, by traffic class, and what went wrong with the telemetry.

The outcome table is in every summary and report whatever the gates said: a run where 40%
of requests failed must show it on the first screen, next to the commonest error messages,
even where no gate looks at that class.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

import contract
from contract import Outcome
from contract.enums import ANSWERED_OR_CANCELLED
from gates import categories
from gates.applicability import target_profile
from gates.metrics_client import LABELLED, failure_label
from gates.rundir import RunData
from gates.windows import counter_increase

TOP_MESSAGES = 3


@dataclass(frozen=True, slots=True)
class OutcomeRow:
    traffic_class: str
    total: int
    counts: dict[str, int]  # outcome -> requests
    top_errors: list[tuple[str, int]]  # ("HTTP 400 model_not_found: ...", count), commonest first

    def share_not_ok(self) -> float:
        return 1.0 - self.counts.get(Outcome.OK, 0) / self.total if self.total else 0.0


def _top(bad: pd.DataFrame) -> list[tuple[str, int]]:
    """The commonest labels, each with one message as an example."""
    labels = failure_label(bad)
    found = []
    for label, n in labels.value_counts().head(TOP_MESSAGES).items():
        example = bad.loc[labels.eq(label).to_numpy(), "error_message"].dropna().head(1)
        text = str(label)
        if not example.empty and str(example.iloc[0])[:80] not in text:
            text += f" (e.g. “{str(example.iloc[0])[:100]}”)"
        found.append((text, int(n)))
    return found


def outcome_table(run: RunData) -> tuple[list[str], list[OutcomeRow]]:
    """(the outcomes seen, in contract order; one row per traffic class, then "all")."""
    requests = run.requests[LABELLED]  # grouping copies only what is read
    if requests.empty:
        return [], []
    seen = {str(o) for o in requests["outcome"].dropna().unique()}
    columns: list[str] = [o for o in contract.OUTCOMES if o in seen]
    outcome, klass = requests["outcome"], requests["traffic_class"]
    # only the outcome column is read of every request; the rest only of those that failed
    failing = requests[~outcome.isin(ANSWERED_OR_CANCELLED)]
    rows = []
    for name in sorted({str(k) for k in klass.dropna().unique()}):
        mine = klass.eq(name).to_numpy()
        counts = {str(k): int(v) for k, v in categories.counts(outcome[mine]).items()}
        top = _top(failing[failing["traffic_class"].eq(name)])
        rows.append(OutcomeRow(name, int(mine.sum()), counts, top))
    counts = {str(k): int(v) for k, v in categories.counts(outcome).items()}
    rows.append(OutcomeRow("all", len(requests), counts, _top(failing)))
    return columns, rows


@dataclass(frozen=True, slots=True)
class ScrapeProblem:
    target: str
    source: str
    reason: str
    count: int
    first_t: float


def scrape_problems(run: RunData) -> list[ScrapeProblem]:
    """Failed observations the samplers recorded (a /metrics 404, a refused connection), one
    per target, source and reason, commonest first."""
    samples = run.samples
    errors = samples[
        samples["metric"].isin(("scrape_error",))
        | categories.per_category(
            samples["labels"],
            lambda labels: labels.astype("string").str.startswith("error=", na=False),
        )
    ]
    if errors.empty:
        return []
    reason = errors["labels"].astype(str).str.removeprefix("error=")
    grouped = errors.assign(reason=reason).groupby(["target", "source", "reason"], sort=False)
    found = [
        ScrapeProblem(str(t), str(s), str(r), len(g), float(g["t"].min()))
        for (t, s, r), g in grouped
    ]
    return sorted(found, key=lambda p: -p.count)


@dataclass(frozen=True, slots=True)
class ReleaseProbeResult:
    """The release probe's readings (harness/release_probe.py), for servers without events."""

    latencies_s: list[float]
    resolution_ms: float | None
    unresolved: list[str]

    def sentence(self) -> str:
        parts = []
        if self.latencies_s:
            values = sorted(self.latencies_s)
            median = values[len(values) // 2]
            parts.append(
                f"cancel to release seen in the KV gauge: median {1000 * median:.0f} ms, max "
                f"{1000 * values[-1]:.0f} ms over {len(values)} probe(s), at "
                f"{self.resolution_ms:.0f} ms resolution"
            )
        if self.unresolved:
            parts.append(f"{len(self.unresolved)} unresolved ({self.unresolved[0]})")
        return "Release probe: " + "; ".join(parts)


def release_probe(run: RunData) -> ReleaseProbeResult | None:
    samples = run.samples
    rows = samples[samples["source"].eq("release_probe")]
    if rows.empty:
        return None
    done = rows[rows["metric"].eq("kvgate_release_probe_seconds")]
    resolution = done["labels"].astype(str).str.extract(r"resolution_ms=([0-9.]+)")[0]
    unresolved = rows[rows["metric"].eq("kvgate_release_probe_unresolved")]
    return ReleaseProbeResult(
        latencies_s=[float(v) for v in done["value"]],
        resolution_ms=float(resolution.iloc[0]) if len(resolution.dropna()) else None,
        unresolved=[str(x).removeprefix("why=") for x in unresolved["labels"]],
    )


@dataclass(frozen=True, slots=True)
class TokenRatio:
    """How the server counted kvgate's prompts: its usage.prompt_tokens over the size kvgate
    aimed for, median per class (chat formatting adds a few tokens to every prompt)."""

    by_class: dict[str, tuple[float, int]]  # class -> (median ratio, requests)
    overall: float
    n: int

    def sentence(self) -> str:
        text = (
            f"Prompt sizes: the server counted {self.overall:.2f}x the tokens kvgate aimed "
            f"for (median over {self.n} requests)"
        )
        if abs(self.overall - 1) > 0.1:
            text += (
                f"; its tokenizer differs from kvgate's, so `--set traffic.prompt_scale="
                f"{1 / self.overall:.2f}` would send the sizes the plan means"
            )
        return text


def token_ratio(run: RunData, min_tokens: int = 256) -> TokenRatio | None:
    """Over requests the server reported usage for, of prompts of at least `min_tokens`
    (where a chat template's few tokens do not dominate)."""
    rows = run.requests
    counted = rows["prompt_tokens"].notna() & rows["target_prompt_tokens"].ge(min_tokens)
    rows = rows.loc[counted, ["prompt_tokens", "target_prompt_tokens", "traffic_class"]]
    if rows.empty:
        return None
    ratio = rows["prompt_tokens"].astype(float) / rows["target_prompt_tokens"].astype(float)
    by_class = {
        str(k): (float(g.median()), len(g)) for k, g in ratio.groupby(rows["traffic_class"])
    }
    return TokenRatio(by_class, float(ratio.median()), len(ratio))


COUNTERS = ("preemptions", "request_success", "request_failure", "request_aborts")


def server_counters(run: RunData) -> list[tuple[str, str, float]]:
    """(quantity, metric, increase over the run) of the counters the target's profile names
    (contract/profiles/): what a server without per-request events says about itself. None
    for a server whose profile gives those events: its report shows them instead."""
    profile = target_profile(run)
    if "server_events" in profile.provides:
        return []
    found = []
    for quantity in COUNTERS:
        for name in getattr(profile.metrics, quantity):
            rows = run.samples[run.samples["metric"].isin((name, name + "_total"))]
            if rows.empty:
                continue
            found.append((quantity, name, float(counter_increase(rows)["increase"].sum())))
            break
    return found
