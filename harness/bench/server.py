"""`kvgate bench server`: how many token events one replica process writes per second at 500
concurrent streams, how far its steps fall behind the simulated GPU's clock, and its CPU
cost per 1,000 token events. With `--hostile`, the hostile-input benchmark instead
(hostile.py; `--hostile --help` lists its options); with `--release`, how fast a deployment
releases cancelled and killed work (release.py).

One replica process (seed policy, sim engine) and one separate reader process that keeps
`--streams` streams open (closed loop: a finished stream is replaced at once) and only counts
bytes, so the figures are the server's, not the client's.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import selectors
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import Request, urlopen

import psutil

from harness.bench.base import Bench, BenchUsageError, run, show_fields, start_process, stop_process

TARGET_EVENTS_PER_S = 20_000
TARGET_LAG_P99_MS = 5.0
TARGET_LAG_MAX_MS = 20.0
TENANTS = 10
BENCH_ADMIN_KEY = "bench-admin-key"  # /debug/steps takes the admin key


POLL_S = 0.002  # the reader polls instead of waking per packet, to stay off the server's CPU


def _open(host: str, port: int, payload: bytes) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=10)
    sock.sendall(payload)
    sock.setblocking(False)
    return sock


def _read_loop(host: str, port: int, payloads: list[bytes], seconds: float) -> int:
    """Keep one stream per payload open until time is up (a finished one is reopened);
    returns the SSE events received."""
    sel = selectors.DefaultSelector()
    for i, payload in enumerate(payloads):
        sel.register(_open(host, port, payload), selectors.EVENT_READ, i)
    events = 0
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        time.sleep(POLL_S)
        for key, _ in sel.select(timeout=0):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                data = sock.recv(1 << 20)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data = b""
            events += data.count(b"\n\n")
            if not data:  # the response ended (Connection: close): start the next one
                sel.unregister(sock)
                sock.close()
                sel.register(_open(host, port, payloads[key.data]), selectors.EVENT_READ, key.data)
    for key in list(sel.get_map().values()):
        sock = key.fileobj
        assert isinstance(sock, socket.socket)
        sock.close()
    return events


def _request(host: str, i: int, max_tokens: int) -> bytes:
    body = json.dumps(
        {
            "model": "llama-3-8b",
            "messages": [{"role": "user", "content": f"bench stream {i}"}],
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
        }
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer bench-key-{i % TENANTS}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    return head + body


def reader(url: str, streams: int, seconds: float, max_tokens: int, out: Connection) -> None:
    """Entry point of the reader process: sends the SSE event count when time is up."""
    u = urlparse(url)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    payloads = [_request(host, i, max_tokens) for i in range(streams)]
    out.send(_read_loop(host, port, payloads, seconds))
    out.close()


def _tenants_file(path: Path) -> None:
    lines = [f"admin_keys: [{BENCH_ADMIN_KEY}]", "tenants:"]
    for i in range(TENANTS):
        lines += [
            f"  bench{i}:",
            f"    keys: [bench-key-{i}]",
            "    priorities: [interactive]",
            "    quota: {hard_reserved_tokens: 1000000, soft_reserved_tokens: 1000000,",
            "            max_active_seqs: 1000, max_context_tokens: 32768,",
            "            max_gpu_seconds: 100000, budgets: {interactive: 1000000}}",
        ]
    path.write_text("\n".join(lines) + "\n")


def _get(url: str) -> dict[str, Any]:
    req = Request(url, headers={"Authorization": f"Bearer {BENCH_ADMIN_KEY}"})
    with urlopen(req, timeout=10) as resp:
        data: dict[str, Any] = json.loads(resp.read())
    return data


def _cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def _busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy, over all cores."""
    t = psutil.cpu_times()
    return float(t.user + t.nice + t.system + t.irq + t.softirq)


def _start_replica(work: Path, time_scale: float) -> tuple[subprocess.Popen[bytes], str]:
    tenants = work / "tenants.yaml"
    _tenants_file(tenants)
    args = ["--replica-id", "bench", "--port", "0", "--state-dir", str(work)]
    args += ["--tenants", str(tenants), "--time-scale", str(time_scale)]
    proc, ready = start_process("server.replica", args, work / "ready.json", work / "replica.log")
    return proc, str(ready["url"])


def measure(args: argparse.Namespace) -> dict[str, Any]:
    if not (1 <= args.streams <= 5000 and args.window > 0 and args.warmup >= 0):
        raise BenchUsageError("need 1 <= --streams <= 5000, --window > 0, --warmup >= 0")
    with tempfile.TemporaryDirectory(prefix="kvgate-bench-") as tmp:
        proc, url = _start_replica(Path(tmp), args.time_scale)
        try:
            return _measure_against(proc, url, args)
        finally:
            stop_process(proc)


def _measure_against(
    proc: subprocess.Popen[bytes], url: str, args: argparse.Namespace
) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    total_s = args.warmup + args.window + 1.0
    rd = ctx.Process(target=reader, args=(url, args.streams, total_s, args.max_tokens, send))
    rd.start()
    try:
        ps, reader_ps = psutil.Process(proc.pid), psutil.Process(rd.pid)
        time.sleep(args.warmup)
        m0, r0 = _busy_cpu_s(), _cpu_s(reader_ps)
        s0, c0, t0 = _get(url + "/debug/steps"), ps.cpu_times(), time.monotonic()
        time.sleep(args.window)
        s1, c1, t1 = _get(url + "/debug/steps?lags=1"), ps.cpu_times(), time.monotonic()
        m1, r1 = _busy_cpu_s(), _cpu_s(reader_ps)
        client_events = recv.recv() if recv.poll(total_s + 10) else 0
    finally:
        rd.join(15)
        if rd.is_alive():
            rd.kill()
    elapsed = t1 - t0
    events = int(s1["token_events"]) - int(s0["token_events"])
    steps = int(s1["steps"]) - int(s0["steps"])
    lags = sorted(s1["lags"][-steps:]) if steps > 0 else [0.0]
    cpu = (c1.user + c1.system) - (c0.user + c0.system)
    # What the rest of the machine used meanwhile: on a shared machine, lag that comes with
    # other processes' CPU is theirs, not the replica's.
    others = (m1 - m0) - cpu - (r1 - r0)
    per_s = events / elapsed
    p99 = lags[min(len(lags) - 1, int(0.99 * len(lags)))] * 1000
    worst = lags[-1] * 1000
    return {
        "token_events_per_s": round(per_s, 1),
        "lag_ms_p99": round(p99, 3),
        "cpu_s_per_1k_events": round(cpu / (events / 1000), 4) if events else None,
        "lag_ms_p50": round(lags[len(lags) // 2] * 1000, 3),
        "lag_ms_max": round(worst, 3),
        "steps_per_s": round(steps / elapsed, 1),
        "server_cpu_percent": round(100 * cpu / elapsed, 1),
        "reader_cpu_percent": round(100 * (r1 - r0) / elapsed, 1),
        "other_processes_cpu_percent": round(100 * max(others, 0.0) / elapsed, 1),
        "client_sse_events": client_events,
        "streams": args.streams,
        "window_s": round(elapsed, 2),
        "time_scale": args.time_scale,
        "targets": {
            "token_events_per_s": TARGET_EVENTS_PER_S,
            "lag_ms_p99": TARGET_LAG_P99_MS,
            "lag_ms_max": TARGET_LAG_MAX_MS,
        },
        "meets_targets": per_s >= TARGET_EVENTS_PER_S
        and p99 <= TARGET_LAG_P99_MS
        and worst <= TARGET_LAG_MAX_MS,
    }


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--hostile",
        action="store_true",
        help="run the hostile-input benchmark instead (its options: --hostile --help)",
    )
    parser.add_argument(
        "--release",
        action="store_true",
        help="run the release benchmark instead: disconnect-to-release and kill-to-settled "
        "(its options: --release --help)",
    )
    parser.add_argument("--streams", type=int, default=500)
    parser.add_argument("--warmup", type=float, default=4.0, help="seconds before measuring")
    parser.add_argument("--window", type=float, default=10.0, help="seconds measured")
    parser.add_argument("--max-tokens", type=int, default=512, help="per stream, then replaced")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=0.5,
        help="the replica's --time-scale (0.5: an H100 step model twice as fast, so the GPU "
        "model is not what limits events/s)",
    )


BENCH = Bench(
    "kvgate bench server",
    __doc__ or "",
    _options,
    measure,
    show=lambda result: show_fields(result, width=22),
)


def main(argv: Sequence[str] | None = None) -> int:
    rest = list(sys.argv[1:] if argv is None else argv)
    # Imported only when chosen: the reader process imports this module, and should start
    # streaming at once.
    if "--hostile" in rest:
        rest.remove("--hostile")
        from harness.bench import hostile

        return run(hostile.BENCH, rest)
    if "--release" in rest:
        rest.remove("--release")
        from harness.bench import release

        return run(release.BENCH, rest)
    return run(BENCH, rest)
