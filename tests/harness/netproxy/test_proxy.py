"""The network fault proxy as a process: proxying, each toxic, the control API, stopping by PID.

Timing assertions are lower bounds only (a toxic that holds data for 200 ms cannot deliver
it sooner, however slow the machine); every upper bound is a generous socket timeout.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psutil
import pytest

from harness.netproxy.client import ProxyError, ProxyProcess, start_proxy
from tests.waiting import wait_until

IO_TIMEOUT_S = 10.0
READY_TIMEOUT_S = 60.0  # the proxy is up in about a second; a busy machine takes several
SLACK_S = 0.005  # timer granularity: a wait may end this much before its deadline


class EchoHandler(socketserver.BaseRequestHandler):
    """Echoes every chunk; a chunk starting with b"bye" is echoed, then the server closes."""

    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)
            if data.startswith(b"bye"):
                return


class HttpHandler(BaseHTTPRequestHandler):
    """GET /hello -> "hello"; GET /bytes/N -> N bytes of b"x" (keep-alive)."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        body = b"hello"
        if self.path.startswith("/bytes/"):
            body = b"x" * int(self.path.removeprefix("/bytes/"))
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class Quiet:
    """A server mixin: peers reset by a toxic are expected, not tracebacks to print."""

    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        pass


class EchoServer(Quiet, socketserver.ThreadingTCPServer):
    pass


class HttpServer(Quiet, ThreadingHTTPServer):
    pass


def serve_in_thread(server: socketserver.TCPServer) -> Iterator[str]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    try:
        yield f"{host!s}:{port}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def echo_upstream() -> Iterator[str]:
    server = EchoServer(("127.0.0.1", 0), EchoHandler)
    yield from serve_in_thread(server)


@pytest.fixture(scope="module")
def http_upstream() -> Iterator[str]:
    server = HttpServer(("127.0.0.1", 0), HttpHandler)
    yield from serve_in_thread(server)


def _proxy(upstream: str) -> Iterator[ProxyProcess]:
    with start_proxy(upstream, ready_timeout_s=READY_TIMEOUT_S) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def echo_proxy(echo_upstream: str) -> Iterator[ProxyProcess]:
    yield from _proxy(echo_upstream)


@pytest.fixture(scope="module")
def http_proxy(http_upstream: str) -> Iterator[ProxyProcess]:
    yield from _proxy(http_upstream)


@pytest.fixture(autouse=True)
def clean_toxics(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    for name in ("echo_proxy", "http_proxy"):
        if name in request.fixturenames:
            client = request.getfixturevalue(name).client
            for toxic in client.toxics():
                client.remove_toxic(toxic.name)


def connect(proxy: ProxyProcess) -> socket.socket:
    host, port = proxy.listen.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=IO_TIMEOUT_S)


def http_get(proxy: ProxyProcess, path: str) -> bytes:
    host, port = proxy.listen.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=IO_TIMEOUT_S)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        assert resp.status == 200
        return resp.read()
    finally:
        conn.close()


def round_trip(sock: socket.socket, payload: bytes = b"ping") -> float:
    t0 = time.monotonic()
    sock.sendall(payload)
    assert recv_exactly(sock, len(payload)) == payload
    return time.monotonic() - t0


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def recv_to_eof(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_passes_a_half_close_on(echo_proxy: ProxyProcess) -> None:
    with connect(echo_proxy) as sock:
        sock.sendall(b"ping")
        sock.shutdown(socket.SHUT_WR)  # the echo server answers, sees EOF and closes
        assert recv_to_eof(sock) == b"ping"


def test_proxies_http_and_counts_it(http_proxy: ProxyProcess) -> None:
    before = http_proxy.client.stats()
    assert http_get(http_proxy, "/hello") == b"hello"
    assert http_get(http_proxy, "/bytes/100000") == b"x" * 100000
    after = http_proxy.client.stats()
    assert after.accepted == before.accepted + 2
    assert after.bytes_downstream - before.bytes_downstream > 100000
    assert after.bytes_upstream > before.bytes_upstream
    wait_until(lambda: http_proxy.client.stats().active == 0, what="both connections to close")


def test_latency_applies_to_open_and_new_connections(echo_proxy: ProxyProcess) -> None:
    with connect(echo_proxy) as opened_before:
        round_trip(opened_before)
        echo_proxy.client.add_toxic("slow", "latency", {"latency": 200})
        assert round_trip(opened_before) >= 0.2 - SLACK_S
        with connect(echo_proxy) as opened_after:
            assert round_trip(opened_after) >= 0.2 - SLACK_S


def test_jitter_keeps_the_order(echo_proxy: ProxyProcess) -> None:
    echo_proxy.client.add_toxic("shaky", "latency", {"latency": 20, "jitter": 20})
    sent = b"".join(b"%03d;" % i for i in range(20))
    with connect(echo_proxy) as sock:
        for i in range(0, len(sent), 4):
            sock.sendall(sent[i : i + 4])
            time.sleep(0.002)  # separate chunks, each with its own delay
        assert recv_exactly(sock, len(sent)) == sent


def test_latency_upstream_delays_the_request(echo_proxy: ProxyProcess) -> None:
    echo_proxy.client.add_toxic("slow", "latency", {"latency": 200}, stream="upstream")
    with connect(echo_proxy) as sock:
        assert round_trip(sock) >= 0.2 - SLACK_S


def test_removing_a_toxic_releases_held_data_and_restores_flow(echo_proxy: ProxyProcess) -> None:
    client = echo_proxy.client
    client.add_toxic("stuck", "latency", {"latency": 600_000})
    with connect(echo_proxy) as sock:
        sock.sendall(b"ping")
        sock.settimeout(0.3)  # negative check: held for 600 s, nothing comes meanwhile
        with pytest.raises(TimeoutError):
            sock.recv(4)
        sock.settimeout(IO_TIMEOUT_S)
        client.remove_toxic("stuck")
        assert recv_exactly(sock, 4) == b"ping"  # long before the 600 s latency
        round_trip(sock)
    assert client.toxics() == []


def test_reset_peer_resets_the_http_client(http_proxy: ProxyProcess) -> None:
    before = http_proxy.client.stats().reset
    http_proxy.client.add_toxic("cut", "reset_peer", {"timeout": 0})
    for _ in range(3):
        with pytest.raises(ConnectionResetError) as err:
            http_get(http_proxy, "/hello")
        assert not isinstance(err.value, http.client.RemoteDisconnected)  # a RST, not a FIN
    assert http_proxy.client.stats().reset == before + 3


def test_reset_peer_waits_its_timeout_after_the_first_data(echo_proxy: ProxyProcess) -> None:
    echo_proxy.client.add_toxic("cut", "reset_peer", {"timeout": 300})
    with connect(echo_proxy) as sock:
        t0 = time.monotonic()
        sock.sendall(b"ping")
        with pytest.raises(ConnectionResetError):
            recv_to_eof(sock)
        assert time.monotonic() - t0 >= 0.3 - SLACK_S


def test_reset_peer_on_the_upstream_stream(echo_proxy: ProxyProcess) -> None:
    echo_proxy.client.add_toxic("cut", "reset_peer", {"timeout": 0}, stream="upstream")
    with connect(echo_proxy) as sock:
        sock.sendall(b"ping")
        with pytest.raises(ConnectionResetError):
            recv_to_eof(sock)


def test_timeout_blackholes_then_closes(echo_proxy: ProxyProcess) -> None:
    echo_proxy.client.add_toxic("hole", "timeout", {"timeout": 300})
    with connect(echo_proxy) as sock:
        t0 = time.monotonic()
        sock.sendall(b"ping")
        assert recv_to_eof(sock) == b""  # nothing came through, then a close
        assert time.monotonic() - t0 >= 0.3 - SLACK_S


def test_timeout_zero_holds_until_removed(echo_proxy: ProxyProcess) -> None:
    client = echo_proxy.client
    client.add_toxic("hole", "timeout", {"timeout": 0})
    with connect(echo_proxy) as sock, connect(echo_proxy) as idle:
        sock.sendall(b"ping")
        sock.settimeout(0.5)  # negative check: held until removed, nothing comes meanwhile
        with pytest.raises(TimeoutError):
            sock.recv(4)
        sock.settimeout(IO_TIMEOUT_S)
        client.remove_toxic("hole")
        assert recv_to_eof(sock) == b""  # it lost data, so removal closes it
        round_trip(idle)  # lost nothing: it lives on
    with connect(echo_proxy) as sock:
        round_trip(sock)


def test_slow_close_delays_the_close(echo_proxy: ProxyProcess) -> None:
    echo_proxy.client.add_toxic("linger", "slow_close", {"delay": 300})
    with connect(echo_proxy) as sock:
        t0 = time.monotonic()
        sock.sendall(b"bye")  # the echo server answers, then closes
        assert recv_to_eof(sock) == b"bye"
        assert time.monotonic() - t0 >= 0.3 - SLACK_S


def test_bandwidth_caps_a_big_transfer(http_proxy: ProxyProcess) -> None:
    http_proxy.client.add_toxic("narrow", "bandwidth", {"rate": 100})
    t0 = time.monotonic()
    assert http_get(http_proxy, "/bytes/60000") == b"x" * 60000
    assert time.monotonic() - t0 >= 60000 / 100_000 - SLACK_S


def test_limit_data_closes_after_its_bytes(echo_proxy: ProxyProcess) -> None:
    echo_proxy.client.add_toxic("short", "limit_data", {"bytes": 10})
    with connect(echo_proxy) as sock:
        sock.sendall(b"x" * 100)
        assert recv_to_eof(sock) == b"x" * 10


def test_toxicity_is_drawn_per_connection(http_proxy: ProxyProcess) -> None:
    http_proxy.client.add_toxic("half", "reset_peer", {"timeout": 0}, toxicity=0.5)
    outcomes: set[bytes | str] = set()
    for _ in range(40):  # all 40 alike: probability 2**-39
        try:
            outcomes.add(http_get(http_proxy, "/hello"))
        except ConnectionResetError:
            outcomes.add("reset")
    assert outcomes == {b"hello", "reset"}


def test_toxicity_zero_never_applies(http_proxy: ProxyProcess) -> None:
    http_proxy.client.add_toxic("never", "reset_peer", {"timeout": 0}, toxicity=0.0)
    for _ in range(10):
        assert http_get(http_proxy, "/hello") == b"hello"


def test_control_api_lists_and_round_trips_toxics(echo_proxy: ProxyProcess) -> None:
    client = echo_proxy.client
    added = client.add_toxic("slow", "latency", {"latency": 5}, stream="upstream", toxicity=0.5)
    assert added.to_json() == {
        "name": "slow",
        "type": "latency",
        "stream": "upstream",
        "toxicity": 0.5,
        "attributes": {"latency": 5, "jitter": 0},
    }
    assert client.toxics() == [added]
    with urllib.request.urlopen(f"{echo_proxy.control_url}/health", timeout=5) as resp:
        assert json.loads(resp.read()) == {"ok": True}


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"name": "t", "type": "nope"}, "unknown toxic type 'nope'"),
        ({"name": "t", "type": "latency", "attributes": {"latency": -1}}, "latency=-1"),
        ({"name": "t", "type": "latency", "attributes": {"delay": 1}}, "['delay']"),
        ({"name": "t", "type": "bandwidth", "attributes": {"rate": 0}}, "rate must be > 0"),
        ({"name": "t", "type": "latency", "toxicity": 2}, "toxicity 2"),
        ({"name": "t", "type": "latency", "stream": "sideways"}, "stream 'sideways'"),
        ({"name": "a b", "type": "latency"}, "name 'a b'"),
        ("not an object", "JSON object"),
    ],
)
def test_control_api_refuses_bad_toxics(echo_proxy: ProxyProcess, body: object, named: str) -> None:
    status, reply = post_raw(echo_proxy, json.dumps(body).encode())
    assert status == 400
    assert named in reply["error"]


def test_control_api_refuses_non_json_and_duplicates(echo_proxy: ProxyProcess) -> None:
    for body in (b"{oops", b"\xff", b""):
        status, reply = post_raw(echo_proxy, body)
        assert status == 400
        assert "not JSON" in reply["error"]
    echo_proxy.client.add_toxic("twice", "latency", {})
    with pytest.raises(ProxyError, match="'twice' exists") as err:
        echo_proxy.client.add_toxic("twice", "latency", {})
    assert err.value.status == 400


def test_control_api_404s_an_unknown_toxic(echo_proxy: ProxyProcess) -> None:
    with pytest.raises(ProxyError, match="no toxic named 'ghost'") as err:
        echo_proxy.client.remove_toxic("ghost")
    assert err.value.status == 404
    echo_proxy.client.remove_toxic("ghost", missing_ok=True)


def post_raw(proxy: ProxyProcess, body: bytes) -> tuple[int, dict[str, str]]:
    req = urllib.request.Request(f"{proxy.control_url}/toxics", data=body, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.mark.parametrize("flag", ["--listen", "--control"])
def test_refuses_non_loopback_addresses(flag: str) -> None:
    cmd = [sys.executable, "-m", "harness.netproxy", "--upstream", "127.0.0.1:9", flag]
    done = subprocess.run([*cmd, "0.0.0.0:0"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert f"{flag} '0.0.0.0:0' is not a loopback address" in done.stderr


def test_stop_leaves_nothing_behind(echo_upstream: str) -> None:
    with (
        start_proxy(echo_upstream, ready_timeout_s=READY_TIMEOUT_S) as proxy,
        connect(proxy) as sock,
    ):
        round_trip(sock)
        proxy.stop()
        assert recv_to_eof(sock) == b""  # open connections are closed, not left hanging
    assert proxy.proc.returncode == 0
    assert not psutil.pid_exists(proxy.pid)
    assert not proxy.tmp_dir.exists()
    with pytest.raises(ConnectionRefusedError):
        connect(proxy)


def test_stop_kills_a_proxy_that_ignores_sigterm(echo_upstream: str) -> None:
    with start_proxy(echo_upstream, ready_timeout_s=READY_TIMEOUT_S) as proxy:
        os.kill(proxy.pid, signal.SIGSTOP)  # a stopped process cannot act on SIGTERM
        proxy.stop(grace_s=0.3)
    assert proxy.proc.returncode == -signal.SIGKILL
    assert not psutil.pid_exists(proxy.pid)


def test_start_failure_names_the_cause() -> None:
    with pytest.raises(ProxyError, match=r"exited with code 2.*must be HOST:PORT"):
        start_proxy("no-port-here")
