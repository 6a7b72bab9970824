"""The `network` fault, and kvgate's proxy in the traffic's path that it needs.

A plan with a network fault gets kvgate's proxy (`harness.netproxy`) between the load
generator and the target: `start_proxy_in_path` starts it before the load (upstream: the
target's host:port), the Locust users send to its URL while samplers keep talking to the
target directly, and the orchestrator stops it at teardown. Each network fault adds one
toxic to it and removes it in its rollback.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from harness.faults.base import FaultContext, FaultError, FaultRecord, ToxicClient
from harness.plan import Plan
from harness.plan_faults import NetworkFault

CONTROL_LIMIT_S = 10.0  # a DELETE on the proxy's control API (its client times out at 5 s)

if TYPE_CHECKING:
    from harness.netproxy_client import ProxyProcess


class NetworkAction:
    """network: add the toxic to the proxy; the rollback removes it."""

    def __init__(self, spec: NetworkFault, context: FaultContext) -> None:
        if context.proxy is None:
            raise FaultError(
                "network faults need kvgate's proxy in the traffic's path, and this run "
                "has none (the orchestrator starts it for plans with a network fault)"
            )
        self.spec = spec
        self.proxy: ToxicClient = context.proxy
        self.target = "proxy"
        self.hold_s = spec.duration_s
        self.rollback_limit_s = CONTROL_LIMIT_S

    def apply(self, record: FaultRecord) -> None:
        toxic = self.spec.toxic
        name = record.params["toxic_name"] = f"kvgate-{record.fault_id}"
        try:
            self.proxy.add_toxic(
                name,
                toxic.type,
                dict(toxic.attributes),
                stream=toxic.stream,
                toxicity=toxic.toxicity,
            )
        except Exception as exc:  # the client's errors are its own; the row must say why
            with contextlib.suppress(Exception):
                self.proxy.remove_toxic(name)  # in case it was added before the error
            raise FaultError(f"the proxy did not add the {toxic.type} toxic: {exc}") from exc
        record.begin()

    def rollback(self, record: FaultRecord) -> None:
        name = record.params["toxic_name"]
        try:
            self.proxy.remove_toxic(name)
        except Exception as exc:
            raise FaultError(f"the proxy did not remove toxic {name}: {exc}") from exc
        record.rollback.append(f"removed toxic {name}")


@dataclass(slots=True)
class ProxyInPath:
    """kvgate's proxy between the load generator and the target, for one run."""

    process: ProxyProcess
    client: ToxicClient
    upstream: str  # host:port of the target
    traffic_url: str  # where the Locust users send instead of the target's URL

    def describe(self) -> dict[str, Any]:
        """meta.json's `target.proxy`."""
        return {
            "listen": self.process.listen_url,
            "upstream": self.upstream,
            "control": self.process.control_url,
            "pid": self.process.pid,
        }

    def stop(self) -> dict[str, Any]:
        """Stop the proxy; its description, with its final counters when it still answered
        (connections accepted and reset, bytes each way: did the traffic go through it)."""
        described = self.describe()
        try:
            described["stats"] = asdict(self.process.client.stats())
        except Exception as exc:  # the counters are a nicety; stopping it is not
            described["stats"] = {"error": str(exc)}
        finally:
            self.process.stop()
        return described


def needs_proxy(plan: Plan) -> bool:
    return any(isinstance(fault, NetworkFault) for fault in plan.faults)


def start_proxy_in_path(
    plan: Plan, base_url: str, *, remote_workers: bool = False
) -> ProxyInPath | None:
    """The proxy for a plan with a network fault (None for any other plan)."""
    if not needs_proxy(plan):
        return None
    if remote_workers:
        raise FaultError(
            "network faults need every Locust worker on this host (kvgate's proxy listens "
            "on loopback only); drop --master-bind, or the plan's network faults"
        )
    # imported here: only plans with a network fault run the proxy (aiohttp and all)
    from harness.netproxy_client import ProxyClient, start_proxy

    parts = urlsplit(base_url)
    if parts.scheme != "http" or parts.hostname is None:
        raise FaultError(f"network faults need an http:// target; {base_url} is not one")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    upstream = f"{host}:{parts.port or 80}"
    process = start_proxy(upstream)
    try:
        client = ProxyClient(process.control_url)
    except BaseException:
        process.stop()
        raise
    traffic_url = process.listen_url.rstrip("/") + parts.path.rstrip("/")
    return ProxyInPath(process, client, upstream, traffic_url)
