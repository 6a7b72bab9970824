"""The metric registry with every built-in metric registered (import this, not the parts)."""

from __future__ import annotations

from gates import (
    metrics_capacity,
    metrics_client,
    metrics_drift,
    metrics_priority,
    metrics_requests,
    metrics_security,
    metrics_server,
)
from gates.registry import REGISTRY, MetricDef, Observations

__all__ = [
    "REGISTRY",
    "MetricDef",
    "Observations",
    "metrics_capacity",
    "metrics_client",
    "metrics_drift",
    "metrics_priority",
    "metrics_requests",
    "metrics_security",
    "metrics_server",
]
