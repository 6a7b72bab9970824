"""Prometheus sampler: scrape `/metrics` of the gateway and every replica into sample rows.

Keeps only the metric families the gates and reports read (name prefixes: the reference
server's `kvgate_`, vLLM's `vllm:`, SGLang's `sglang:`, TGI's `tgi_`), and drops the
`_created` timestamps client libraries add. A failed scrape becomes a `scrape_error` row,
never an exception: a dead replica is something to record, not a reason to stop sampling.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from harness.samplers.http import Response, request

Row = dict[str, object]


def canonical_labels(labels: dict[str, str]) -> str:
    """`k=v,k=v` sorted by key: the form the samples table stores."""
    return ",".join(f"{k}={labels[k]}" for k in sorted(labels))


def parse_metrics(
    text: str, *, t: float, target: str, prefixes: Sequence[str], source: str = "prometheus"
) -> list[Row]:
    """Sample rows for every kept metric sample in a Prometheus text exposition."""
    rows: list[Row] = []
    for family in text_string_to_metric_families(text):
        if prefixes and not family.name.startswith(tuple(prefixes)):
            continue
        for sample in family.samples:
            if sample.name.endswith("_created") or not math.isfinite(sample.value):
                continue
            rows.append(
                {
                    "t": t,
                    "source": source,
                    "target": target,
                    "metric": sample.name,
                    "labels": canonical_labels(dict(sample.labels)),
                    "value": float(sample.value),
                }
            )
    return rows


def error_row(t: float, source: str, target: str, metric: str, why: str) -> Row:
    """A sample that records a failed observation (value 1) with the reason as a label."""
    reason = why.replace(",", ";").replace("=", ":")[:200]
    return {
        "t": t,
        "source": source,
        "target": target,
        "metric": metric,
        "labels": f"error={reason}",
        "value": 1.0,
    }


@dataclass(slots=True)
class Endpoint:
    """One scrape target: a name for the samples table and its base URL."""

    name: str
    url: str


class PrometheusSampler:
    """Scrapes each endpoint's `/metrics` once per `sample()` call, with `token` as the bearer
    key when given (the reference server's /metrics takes the admin key)."""

    def __init__(
        self,
        endpoints: Callable[[], list[Endpoint]],
        prefixes: Sequence[str],
        fetch: Callable[..., Response] = request,
        token: str | None = None,
    ) -> None:
        self._endpoints = endpoints
        self._prefixes = tuple(prefixes)
        self._fetch = fetch
        self._token = token

    def sample(self) -> list[Row]:
        rows: list[Row] = []
        for endpoint in self._endpoints():
            t = time.time()
            try:
                resp = self._fetch(endpoint.url.rstrip("/") + "/metrics", token=self._token)
                if resp.status != 200:
                    raise OSError(f"HTTP {resp.status}")
                text = resp.body.decode("utf-8", errors="replace")
                rows.extend(parse_metrics(text, t=t, target=endpoint.name, prefixes=self._prefixes))
            except (OSError, ValueError) as exc:
                rows.append(error_row(t, "prometheus", endpoint.name, "scrape_error", str(exc)))
        return rows
