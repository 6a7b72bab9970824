"""The release probe: cancel-to-release on a server that shows no per-request events.

While the target is otherwise idle (after the load), each probe
1. reads the server's KV-usage gauge (its profile's `kv_usage` metric) at `hz` to find the
   idle level;
2. sends one large streaming request and reads until its first content chunk, while the
   gauge shows the request's KV held;
3. closes the connection (the cancel) and keeps reading the gauge at `hz` until it has
   fallen at least half-way back to the idle level.
The latency is that fall's first reading minus the cancel, with a resolution of one reading
interval plus the scrape itself (both recorded). A probe whose request never shows in the
gauge (too small for its resolution, or the gauge is missing) is recorded as unresolved,
never as a fast release.

Rows go to the samples table as `kvgate_release_probe_seconds` (value: the latency; labels:
`resolution_ms`, `held`, `idle`) or `kvgate_release_probe_unresolved` (labels: why).
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

from harness.samplers.http import request

Row = dict[str, object]
PROBE_METRIC = "kvgate_release_probe_seconds"
UNRESOLVED_METRIC = "kvgate_release_probe_unresolved"
PROBE_MAX_TOKENS = 256  # a probe's output allowance; its prompt is sized to leave room for it


@dataclass(frozen=True, slots=True)
class ProbeSpec:
    base_url: str
    model: str
    api_key: str | None
    metrics_url: str  # where the KV-usage gauge is scraped
    gauge_names: Sequence[str]  # the profile's kv_usage names, the first one seen is used
    metrics_token: str | None = None
    prompt: str = ""
    max_tokens: int = PROBE_MAX_TOKENS
    hz: float = 20.0
    wait_s: float = 10.0  # longest wait for the gauge to show the request, then its release


def read_gauge(spec: ProbeSpec) -> float | None:
    """The summed value of the first gauge name the scrape shows; None if none answers."""
    try:
        resp = request(spec.metrics_url, token=spec.metrics_token, timeout_s=2.0)
    except OSError:
        return None
    if resp.status != 200:
        return None
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(resp.body.decode("utf-8", errors="replace")):
        for sample in family.samples:
            if sample.name in spec.gauge_names:
                totals[sample.name] = totals.get(sample.name, 0.0) + float(sample.value)
    return next((totals[n] for n in spec.gauge_names if n in totals), None)


def _open_stream(spec: ProbeSpec) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    parts = urlsplit(spec.base_url)
    conn_cls = (
        http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    )
    conn = conn_cls(parts.hostname or "127.0.0.1", parts.port, timeout=spec.wait_s)
    body = {
        "model": spec.model,
        "messages": [{"role": "user", "content": spec.prompt}],
        "max_tokens": spec.max_tokens,
        "stream": True,
    }
    headers = {"Content-Type": "application/json"}
    if spec.api_key:
        headers["Authorization"] = f"Bearer {spec.api_key}"
    conn.request("POST", parts.path.rstrip("/") + "/v1/chat/completions", json.dumps(body), headers)
    return conn, conn.getresponse()


def _first_content(resp: http.client.HTTPResponse, deadline: float) -> bool:
    """Read SSE lines until one carries content; False at the end or the deadline."""
    while time.monotonic() < deadline:
        line = resp.readline()
        if not line:
            return False
        if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
            continue
        try:
            delta = json.loads(line[5:])["choices"][0].get("delta", {})
        except (ValueError, KeyError, IndexError):
            continue
        if delta.get("content"):
            return True
    return False


def _poll(
    spec: ProbeSpec, until: Callable[[float], bool], deadline: float
) -> tuple[float, float] | None:
    """(time, value) of the first reading at `hz` for which `until(value)` holds."""
    interval = 1.0 / spec.hz
    while time.monotonic() < deadline:
        started = time.monotonic()
        value = read_gauge(spec)
        if value is not None and until(value):
            return time.time(), value
        time.sleep(max(0.0, interval - (time.monotonic() - started)))
    return None


def probe_once(spec: ProbeSpec) -> Row:
    """One probe's sample row (a latency, or why it could not be resolved)."""
    t0 = time.time()
    idle = read_gauge(spec)
    if idle is None:
        return _unresolved(t0, f"no {'/'.join(spec.gauge_names)} at {spec.metrics_url}")
    conn, resp = _open_stream(spec)
    try:
        if resp.status != 200:
            body = resp.read(2000).decode("utf-8", errors="replace").strip()
            return _unresolved(t0, f"the probe request got HTTP {resp.status}: {body}")
        if not _first_content(resp, time.monotonic() + spec.wait_s):
            return _unresolved(t0, "the probe request sent no content")
        held = read_gauge(spec)
        if held is None or held <= idle:
            return _unresolved(t0, "the gauge never showed the probe's KV (below its resolution)")
    finally:
        t_cancel = time.time()
        resp.close()  # the cancel: the server must see the client go away (the response
        conn.close()  # holds the socket too, so both are closed)
    line = idle + (held - idle) / 2
    interval_s = 1.0 / spec.hz
    fell = _poll(spec, lambda v: v <= line, time.monotonic() + spec.wait_s)
    if fell is None:
        return _unresolved(t0, f"the gauge did not fall back within {spec.wait_s:g} s")
    labels = f"held={held:.6g},idle={idle:.6g},resolution_ms={1000 * interval_s:.0f}"
    return {
        "t": t_cancel,
        "source": "release_probe",
        "target": "server",
        "metric": PROBE_METRIC,
        "labels": labels,
        "value": max(0.0, fell[0] - t_cancel),
    }


def _unresolved(t: float, why: str) -> Row:
    reason = " ".join(why.replace(",", ";").replace("=", ":").split())[:400]
    return {
        "t": t,
        "source": "release_probe",
        "target": "server",
        "metric": UNRESOLVED_METRIC,
        "labels": f"why={reason}",
        "value": 1.0,
    }


def prompt_tokens_for(
    wanted: int, max_model_len: int | None, max_tokens: int, server_per_kvgate: float
) -> int:
    """The probe's prompt size in kvgate's tokens: what the plan asks, but small enough that
    prompt plus output fit the server's context (`max_model_len`, in the server's tokens:
    `server_per_kvgate` of them per kvgate token, as the run's requests measured), with a
    tenth of the context to spare for the chat template."""
    if not max_model_len:
        return wanted
    room = (0.9 * max_model_len - max_tokens) / max(server_per_kvgate, 1e-6)
    return max(16, min(wanted, int(room)))


def run_probes(spec: ProbeSpec, count: int) -> list[Row]:
    """`count` probes in a row; a network error ends a probe as unresolved, not the run."""
    rows = []
    for _ in range(count):
        try:
            rows.append(probe_once(spec))
        except (OSError, http.client.HTTPException) as exc:
            rows.append(_unresolved(time.time(), f"the probe failed: {exc}"))
    return rows
