"""A toy gate metric written by the recipe of docs/extending.md, as a new
gates/metrics_*.py module would be: seconds per output token after the first.

Importing it registers the metric; the tests that use it import it through the
`toy_metric` fixture, which takes it out of the registry again afterwards.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from gates.registry import Cause, Observations, metric
from gates.rundir import RunData
from gates.terms import GateFilter
from gates.windows import select

NAME = "toy_time_per_token"


@metric(
    NAME,
    filters=("traffic_class", "priority", "tenant", "window"),
    unit="s",
    kind="trend",
    timing=True,  # a time on the load generator's clock
    cause=Cause.NONE,
)
def time_per_token(run: RunData, flt: GateFilter, params: Mapping[str, Any]) -> Observations:
    """Seconds per output token after the first, of each answered request (s)."""
    rows = select(run.requests, run, flt, "t_send")
    if isinstance(rows, str):
        return Observations.none(rows)
    rows = rows[rows["ttft_s"].notna() & rows["e2e_s"].notna() & rows["completion_tokens"].gt(1)]
    if rows.empty:
        return Observations.none("no answered request has more than one output token")
    value = (rows["e2e_s"] - rows["ttft_s"]) / (rows["completion_tokens"] - 1)
    frame = pd.DataFrame(
        {
            "value": value.to_numpy(dtype=float),
            "request_id": rows["request_id"].to_numpy(),
            "t": rows["t_send"].to_numpy(dtype=float),
        }
    )
    return Observations(frame=frame, n_samples=len(rows))
