"""The release probe against a fake server whose KV gauge frees a cancelled request late."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from harness.release_probe import (
    PROBE_METRIC,
    UNRESOLVED_METRIC,
    ProbeSpec,
    prompt_tokens_for,
    run_probes,
)

GAUGE = "vllm:kv_cache_usage_perc"


class KvServer(BaseHTTPRequestHandler):
    """Streams tokens until the client goes away; the gauge shows 0.4 while a stream holds KV
    and falls back to 0.01 `release_s` after the disconnect (`held` 0: it never shows)."""

    usage = 0.01
    held = 0.4
    release_s = 0.3
    lock = threading.Lock()

    def do_GET(self) -> None:
        with self.lock:
            body = f'# TYPE {GAUGE} gauge\n{GAUGE}{{model_name="m"}} {type(self).usage}\n'
        self._send(200, body.encode(), "text/plain")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        cls = type(self)
        with self.lock:
            cls.usage = 0.01 + cls.held
        chunk = b'data: {"choices": [{"index": 0, "delta": {"content": "x"}}]}\n\n'
        try:
            for _ in range(2000):
                self.wfile.write(chunk)
                self.wfile.flush()
                time.sleep(0.01)
        except OSError:
            pass  # the client went away: free its KV, late
        threading.Timer(cls.release_s, self._free).start()

    def _free(self) -> None:
        with self.lock:
            type(self).usage = 0.01

    def _send(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, type[KvServer]]]:
    handler = type("Handler", (KvServer,), {"usage": 0.01, "held": 0.4, "release_s": 0.3})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    httpd.shutdown()
    httpd.server_close()


def spec(url: str) -> ProbeSpec:
    # The fake frees the KV 0.3 s after the cancel; wait_s is for a gauge that never falls.
    return ProbeSpec(url, "m", None, url + "/metrics", (GAUGE,), prompt="hello", wait_s=10.0)


def test_the_probe_measures_a_late_release_with_its_resolution(
    server: tuple[str, type[KvServer]],
) -> None:
    url, _ = server
    rows = run_probes(spec(url), 2)
    assert [r["metric"] for r in rows] == [PROBE_METRIC, PROBE_METRIC]
    for row in rows:
        assert isinstance(row["value"], float) and row["value"] >= 0.3  # never early
        assert "resolution_ms=50" in str(row["labels"])


def test_a_request_the_gauge_cannot_see_is_unresolved_never_fast(
    server: tuple[str, type[KvServer]],
) -> None:
    url, handler = server
    handler.held = 0.0
    (row,) = run_probes(spec(url), 1)
    assert row["metric"] == UNRESOLVED_METRIC and "never showed" in str(row["labels"])


def test_a_server_without_the_gauge_is_unresolved(refused_url: str) -> None:
    (row,) = run_probes(spec(refused_url), 1)
    assert row["metric"] == UNRESOLVED_METRIC and "no vllm:kv_cache_usage_perc" in str(
        row["labels"]
    )


def test_the_probe_prompt_fits_the_servers_context() -> None:
    """Sized in kvgate's tokens so that, in the server's (here 1.08 of them per kvgate
    token, as a chat template adds), prompt plus output stay inside max_model_len with a
    tenth to spare; a server that says no context length gets what the plan asks."""
    tokens = prompt_tokens_for(4096, max_model_len=4096, max_tokens=256, server_per_kvgate=1.08)
    assert tokens * 1.08 + 256 <= 0.9 * 4096 and tokens >= 0.9 * 4096 / 1.08 - 256 / 1.08 - 1
    assert (
        prompt_tokens_for(2048, max_model_len=None, max_tokens=256, server_per_kvgate=1.0) == 2048
    )
    assert (
        prompt_tokens_for(2048, max_model_len=65536, max_tokens=256, server_per_kvgate=1.0) == 2048
    )
    assert prompt_tokens_for(2048, max_model_len=128, max_tokens=256, server_per_kvgate=1.0) == 16
