"""`kvgate bench proxy [--json]`: do harness.netproxy's toxics do what they say?

A local HTTP server runs in a thread of this process; a proxy process stands in front of it.
(a) latency: for each requested latency, keep-alive round trips through a `latency` toxic;
    error = round trip − baseline − requested, the baseline being the median round trip
    through the proxy with no toxic. Target: median and p95 error within 5 ms.
(b) reset_peer: requests on fresh connections, and one on a keep-alive connection opened
    before the toxic, under `reset_peer` (timeout 0): each must end as a disconnect
    (connection reset, or closed without a response) at the http.client caller.
(c) bandwidth: a download of about `--bandwidth-s` seconds' worth per `rate`: achieved rate
    against asked. Target: the cap holds (at most 5% over) and at least 90% of it is reached.
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gates.stats import percentile
from harness.bench.base import Bench, BenchError, BenchUsageError, run
from harness.netproxy.client import ProxyClient, start_proxy

LATENCY_TARGET_MS = 5.0
BANDWIDTH_OVER_MAX = 1.05
BANDWIDTH_UNDER_MIN = 0.90
WARMUP_ROUND_TRIPS = 3
IO_TIMEOUT_S = 30.0


class _Handler(BaseHTTPRequestHandler):
    """GET /ping -> b"pong"; GET /bytes/N -> N bytes (keep-alive)."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed ACK

    def do_GET(self) -> None:
        body = b"pong"
        if self.path.startswith("/bytes/"):
            body = b"x" * int(self.path.removeprefix("/bytes/"))
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # the reset_peer toxic resets the server's side too: expected, not news


@contextmanager
def _http_server() -> Iterator[str]:
    server = _QuietServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _connection(address: str) -> http.client.HTTPConnection:
    host, port = address.rsplit(":", 1)
    return http.client.HTTPConnection(host, int(port), timeout=IO_TIMEOUT_S)


def _get(conn: http.client.HTTPConnection, path: str) -> bytes:
    conn.request("GET", path)
    resp = conn.getresponse()
    body = resp.read()
    if resp.status != 200:
        raise BenchError(f"GET {path}: {resp.status}")
    return body


def _round_trips_ms(address: str, n: int) -> list[float]:
    conn = _connection(address)
    try:
        for _ in range(WARMUP_ROUND_TRIPS):
            _get(conn, "/ping")
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            _get(conn, "/ping")
            out.append((time.perf_counter() - t0) * 1000)
        return out
    finally:
        conn.close()


def _sleep_overshoot_ms(seconds: float, n: int) -> list[float]:
    """How late this host wakes a process from a timer: the floor under any latency toxic."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        time.sleep(seconds)
        out.append((time.perf_counter() - t0 - seconds) * 1000)
    return out


def measure_latency(
    direct: str, listen: str, client: ProxyClient, requested_ms: Sequence[float], n: int
) -> dict[str, Any]:
    direct_ms = statistics.median(_round_trips_ms(direct, n))
    baseline_ms = statistics.median(_round_trips_ms(listen, n))
    rows = []
    for latency in requested_ms:
        client.add_toxic("bench-latency", "latency", {"latency": latency})
        try:
            errors = [rtt - baseline_ms - latency for rtt in _round_trips_ms(listen, n)]
        finally:
            client.remove_toxic("bench-latency")
        host = _sleep_overshoot_ms(latency / 1000, n) if latency > 0 else [0.0]
        rows.append(
            {
                "requested_ms": latency,
                "n": n,
                "median_error_ms": round(statistics.median(errors), 3),
                "p95_error_ms": round(percentile(errors, 95), 3),
                "max_error_ms": round(max(errors), 3),
                "host_sleep_p95_late_ms": round(percentile(host, 95), 3),
            }
        )
    met = all(
        abs(r["median_error_ms"]) <= LATENCY_TARGET_MS and r["p95_error_ms"] <= LATENCY_TARGET_MS
        for r in rows
    )
    return {
        "direct_median_ms": round(direct_ms, 3),
        "baseline_median_ms": round(baseline_ms, 3),
        "proxy_overhead_ms": round(baseline_ms - direct_ms, 3),
        "rows": rows,
        "target_ms": LATENCY_TARGET_MS,
        "target_met": met,
    }


def _outcome(conn: http.client.HTTPConnection) -> str:
    """How one GET ends, as its caller sees it."""
    try:
        _get(conn, "/ping")
    except http.client.RemoteDisconnected:  # a clean close; a subclass of the next
        return "server_disconnected"
    except ConnectionResetError:
        return "connection_reset"
    except (OSError, http.client.HTTPException) as err:
        return f"error:{type(err).__name__}"
    finally:
        conn.close()
    return "ok"


def measure_reset(listen: str, client: ProxyClient, n: int) -> dict[str, Any]:
    kept_alive = _connection(listen)
    _get(kept_alive, "/ping")  # open before the toxic: it must be reset too
    client.add_toxic("bench-reset", "reset_peer", {"timeout": 0})
    try:
        outcomes = Counter(_outcome(_connection(listen)) for _ in range(n))
        kept_alive_outcome = _outcome(kept_alive)
    finally:
        client.remove_toxic("bench-reset")
    disconnects = outcomes["connection_reset"] + outcomes["server_disconnected"]
    return {
        "n": n,
        "outcomes": dict(outcomes),
        "disconnects": disconnects,
        "kept_alive_outcome": kept_alive_outcome,
        "restored_after_removal": _outcome(_connection(listen)) == "ok",
        "target_met": disconnects == n and kept_alive_outcome != "ok",
    }


def measure_bandwidth(
    listen: str, client: ProxyClient, rates_kbps: Sequence[float], seconds: float
) -> dict[str, Any]:
    rows = []
    for rate in rates_kbps:
        size = int(rate * 1000 * seconds)
        client.add_toxic("bench-bandwidth", "bandwidth", {"rate": rate})
        conn = _connection(listen)
        try:
            t0 = time.perf_counter()
            got = len(_get(conn, f"/bytes/{size}"))
            elapsed = time.perf_counter() - t0
        finally:
            conn.close()
            client.remove_toxic("bench-bandwidth")
        achieved = got / elapsed / 1000
        rows.append(
            {
                "rate_kbps": rate,
                "bytes": got,
                "seconds": round(elapsed, 3),
                "achieved_kbps": round(achieved, 1),
                "ratio": round(achieved / rate, 4),
            }
        )
    met = all(BANDWIDTH_UNDER_MIN <= r["ratio"] <= BANDWIDTH_OVER_MAX for r in rows)
    return {
        "rows": rows,
        "target_ratio": [BANDWIDTH_UNDER_MIN, BANDWIDTH_OVER_MAX],
        "target_met": met,
    }


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--round-trips", type=int, default=50, help="per requested latency")
    parser.add_argument("--latencies", default="0,20,50,100", help="requested latencies, ms")
    parser.add_argument("--resets", type=int, default=20, help="requests under reset_peer")
    parser.add_argument("--rates", default="100,1000,10000", help="bandwidth caps, KB/s")
    parser.add_argument("--bandwidth-s", type=float, default=1.0, help="seconds per download")


def _numbers(text: str) -> list[float]:
    return [float(part) for part in text.split(",") if part.strip()]


def measure(args: argparse.Namespace) -> dict[str, Any]:
    if args.round_trips < 2 or args.resets < 1 or args.bandwidth_s <= 0:
        raise BenchUsageError("--round-trips must be >= 2, --resets >= 1 and --bandwidth-s > 0")
    with _http_server() as direct, start_proxy(direct) as proxy:
        client = proxy.client
        return {
            "latency": measure_latency(
                direct, proxy.listen, client, _numbers(args.latencies), args.round_trips
            ),
            "reset_peer": measure_reset(proxy.listen, client, args.resets),
            "bandwidth": measure_bandwidth(
                proxy.listen, client, _numbers(args.rates), args.bandwidth_s
            ),
        }


def _print_table(result: dict[str, Any]) -> None:
    lat = result["latency"]
    print(
        f"latency (error = round trip - {lat['baseline_median_ms']:.2f} ms baseline - requested;"
        f" proxy overhead {lat['proxy_overhead_ms']:.2f} ms over direct)"
    )
    print(
        f"  {'requested':>10} {'n':>4} {'median err':>11} {'p95 err':>9} {'max err':>9}"
        f" {'host sleep p95 late':>20}"
    )
    for r in lat["rows"]:
        print(
            f"  {r['requested_ms']:>8.0f}ms {r['n']:>4} {r['median_error_ms']:>9.2f}ms"
            f" {r['p95_error_ms']:>7.2f}ms {r['max_error_ms']:>7.2f}ms"
            f" {r['host_sleep_p95_late_ms']:>18.2f}ms"
        )
    print(f"  target: median and p95 within {lat['target_ms']:.0f} ms: {_met(lat)}")
    reset = result["reset_peer"]
    print(
        f"reset_peer: {reset['disconnects']}/{reset['n']} new connections seen as a disconnect"
        f" {reset['outcomes']}; kept-alive connection: {reset['kept_alive_outcome']};"
        f" normal after removal: {reset['restored_after_removal']}: {_met(reset)}"
    )
    band = result["bandwidth"]
    print(f"bandwidth: {'asked':>10} {'achieved':>12} {'ratio':>7} {'seconds':>8}")
    for r in band["rows"]:
        print(
            f"           {r['rate_kbps']:>6.0f}KB/s {r['achieved_kbps']:>8.1f}KB/s"
            f" {r['ratio']:>7.3f} {r['seconds']:>8.2f}"
        )
    low, high = band["target_ratio"]
    print(f"  target: ratio in [{low}, {high}]: {_met(band)}")


def _met(section: dict[str, Any]) -> str:
    return "met" if section["target_met"] else "NOT met"


BENCH = Bench("kvgate bench proxy", __doc__ or "", _options, measure, show=_print_table)


def main(argv: Sequence[str] | None = None) -> int:
    return run(BENCH, argv)
