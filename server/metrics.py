"""Prometheus metrics of the reference server (names as server/README.md lists them).

Replica gauges and counters are read from the scheduler's `stats()` and the virtual GPU at
scrape time (a custom collector: nothing is updated per token); the two histograms (release
latency, step lag) are observed as events happen. Each process uses its own registry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from server.engine.sim import VirtualGpu
from server.scheduler import Priority, Scheduler, SchedulerStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
RELEASE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5)
# Fine around 10-50 ms, where a run's validity is decided (harness/summary.py: each
# scrape interval reads as its worst step's bucket bound, against a 20 ms bound by default).
LAG_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.25,
    0.5,
    1,
    2.5,
)


def _gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


class SchedulerCollector(Collector):
    """Turns one `Scheduler.stats()` snapshot and the GPU's memory into metric families."""

    def __init__(self, scheduler: Scheduler, gpu: VirtualGpu, lag_max: Callable[[], float]):
        self._scheduler = scheduler
        self._gpu = gpu
        self._lag_max = lag_max

    def collect(self) -> Iterator[Metric]:
        s = self._scheduler.stats()
        yield from self._pool(s)
        yield from self._queues(s)
        yield from self._tenants(s)
        yield from self._counters(s)
        yield from self._gpu_memory()
        g = _gauge("kvgate_step_lag_max_seconds", "Largest step lag behind the model's clock")
        g.add_metric([], self._lag_max())
        yield g

    def _pool(self, s: SchedulerStats) -> Iterator[Metric]:
        for name, doc, value in (
            ("kvgate_pool_blocks_total", "KV pool size in blocks", s.pool_total_blocks),
            ("kvgate_pool_used_blocks", "KV blocks holding tokens", s.pool_used_blocks),
            ("kvgate_pool_reserved_blocks", "KV blocks committed", s.pool_reserved_blocks),
            (
                "kvgate_pool_usage_ratio",
                "Used blocks / pool",
                s.pool_used_blocks / s.pool_total_blocks if s.pool_total_blocks else 0.0,
            ),
            ("kvgate_fragmentation_ratio", "Unused share of used blocks", s.fragmentation),
        ):
            g = _gauge(name, doc)
            g.add_metric([], float(value))
            yield g

    def _queues(self, s: SchedulerStats) -> Iterator[Metric]:
        for name, doc, values in (
            ("kvgate_waiting_requests", "Queued requests", s.waiting_by_priority),
            ("kvgate_running_requests", "Requests holding KV", s.running_by_priority),
            (
                "kvgate_estimated_wait_seconds",
                "Estimated queue wait",
                s.estimated_wait_s_by_priority,
            ),
        ):
            g = _gauge(name, doc, ("priority",))
            for p in Priority:
                g.add_metric([p.value], float(values.get(p, 0)))
            yield g

    def _tenants(self, s: SchedulerStats) -> Iterator[Metric]:
        for name, doc, values in (
            ("kvgate_tenant_reserved_tokens", "Tokens reserved", s.tenant_reserved_tokens),
            ("kvgate_tenant_pool_share", "Share of the pool", s.tenant_pool_share),
            ("kvgate_tenant_active_sequences", "Active sequences", s.tenant_active_seqs),
        ):
            g = _gauge(name, doc, ("tenant",))
            for tenant, value in sorted(values.items()):
                g.add_metric([tenant], float(value))
            yield g

    def _counters(self, s: SchedulerStats) -> Iterator[Metric]:
        c = CounterMetricFamily(
            "kvgate_rejected_requests", "Rejections", labels=["reason", "priority", "tenant"]
        )
        for (reason, prio, tenant), n in sorted(s.rejected_requests.items()):
            c.add_metric([reason, prio, tenant], n)
        yield c
        for name, doc, label, values in (
            ("kvgate_rejected_tokens", "Tokens rejected", "reason", s.rejected_tokens),
            ("kvgate_evictions", "Evictions", "reason", s.evictions),
        ):
            c = CounterMetricFamily(name, doc, labels=[label])
            for key, n in sorted(values.items()):
                c.add_metric([str(key)], n)
            yield c
        c = CounterMetricFamily("kvgate_preemptions", "Preemptions", labels=["priority"])
        for p in Priority:
            c.add_metric([p.value], s.preemptions.get(p, 0))
        yield c
        for name, doc, value in (
            ("kvgate_recomputes", "Recomputes after preemption", s.recomputes),
            ("kvgate_prefix_cache_queries", "Prefix-cache lookups", s.prefix_queries),
            ("kvgate_prefix_cache_hits", "Prefix-cache hits", s.prefix_hits),
            ("kvgate_oom", "Out-of-memory deaths of this process (it exits on one)", 0),
        ):
            c = CounterMetricFamily(name, doc)
            c.add_metric([], value)
            yield c

    def _gpu_memory(self) -> Iterator[Metric]:
        g = _gauge("kvgate_sim_gpu_memory_used_bytes", "Virtual GPU memory used", ("category",))
        for cat, value in self._gpu.by_category().items():
            g.add_metric([cat], float(value))
        yield g
        t = _gauge("kvgate_sim_gpu_memory_total_bytes", "Virtual GPU memory")
        t.add_metric([], float(self._gpu.total_bytes))
        yield t


class ReplicaMetrics:
    """The replica's registry: the scrape-time collector plus the two histograms."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.release_latency = Histogram(
            "kvgate_release_latency_seconds",
            "Cancel to release of the request's blocks",
            buckets=RELEASE_BUCKETS,
            registry=self.registry,
        )
        self.step_lag = Histogram(
            "kvgate_step_lag_seconds",
            "How far each step ended behind the model's clock",
            buckets=LAG_BUCKETS,
            registry=self.registry,
        )

    def attach(self, scheduler: Scheduler, gpu: VirtualGpu, lag_max: Callable[[], float]) -> None:
        self.registry.register(SchedulerCollector(scheduler, gpu, lag_max))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class GatewayMetrics:
    """The gateway's registry: ledger by tenant, drift, replica liveness, retries."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.ledger_reserved = Gauge(
            "kvgate_gateway_ledger_reserved_tokens",
            "Tokens the global ledger holds per tenant",
            ["tenant"],
            registry=self.registry,
        )
        self.ledger_drift = Gauge(
            "kvgate_gateway_ledger_drift_tokens",
            "Ledger minus the sum of reservations live replicas report",
            registry=self.registry,
        )
        self.replica_up = Gauge(
            "kvgate_gateway_replica_up",
            "1 when the replica is running",
            ["replica"],
            registry=self.registry,
        )
        self.retries = Counter(
            "kvgate_gateway_retries",
            "Replayable requests retried on another replica",
            registry=self.registry,
        )
        self.rejections = Counter(
            "kvgate_gateway_rejected_requests",
            "Requests the gateway answered with an error itself",
            ["code", "tenant"],
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
