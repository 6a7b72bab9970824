"""kvgate's proxy in the traffic's path, for plans with a fault that uses it (`network`).

`start_proxy_in_path` starts it before the load (upstream: the target's host:port), the
Locust users send to its URL while samplers keep talking to the target directly, and the
orchestrator stops it at teardown. Each network fault adds one toxic to it and removes it in
its rollback (harness/faults/kinds/network.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from harness.faults.base import FaultError, ToxicClient

if TYPE_CHECKING:
    from harness.netproxy.client import ProxyProcess
    from harness.plan import Plan


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
    return any(fault.uses_proxy for fault in plan.faults)


def start_proxy_in_path(
    plan: Plan, base_url: str, *, remote_workers: bool = False
) -> ProxyInPath | None:
    """The proxy for a plan with a fault that uses it (None for any other plan)."""
    if not needs_proxy(plan):
        return None
    if remote_workers:
        raise FaultError(
            "network faults need every Locust worker on this host (kvgate's proxy listens "
            "on loopback only); drop --master-bind, or the plan's network faults"
        )
    # imported here: only plans with a network fault run the proxy (aiohttp and all)
    from harness.netproxy.client import ProxyClient, start_proxy

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
