"""One client variant of `kvgate bench client`, alone in its process so its CPU time is its own.

`python -m harness.bench.client_worker --variant ours|ours_userspace|httpuser|fasthttp
--url URL` runs N Locust users streaming from the reference server with
`X-Kvgate-Debug-Timing: 1` and prints one JSON line: TTFT error against the server's emit
time, and the content events handled per CPU-second of this process, both over a measuring
window after a warm-up.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any, ClassVar

import gevent
import locust  # noqa: F401  (first: gevent monkey-patching before anything else)
from locust import HttpUser, User, constant, task
from locust.contrib.fasthttp import FastHttpUser
from locust.env import Environment

from contract import Outcome
from contract.quantiles import percentile
from workloads import connection
from workloads.users.base import KvgateUser

DEMO_KEYS = ("kvg-sys-key", "kvg-acme-key", "kvg-globex-key", "kvg-initech-key")
PATH = "/v1/chat/completions"


class Window:
    """The measuring window and what was seen inside it (module state: one run per process)."""

    start: ClassVar[float] = float("inf")
    end: ClassVar[float] = float("inf")
    events: ClassVar[int] = 0
    requests: ClassVar[int] = 0
    not_ok: ClassVar[int] = 0
    ttft_errors: ClassVar[list[float]] = []
    read_delays: ClassVar[list[float]] = []  # our client only: read time minus arrival stamp

    @classmethod
    def content_at(cls, t: float) -> None:
        if cls.start <= t < cls.end:
            cls.events += 1

    @classmethod
    def first_content(cls, t_arrival: float, emit_ts: float | None) -> None:
        if emit_ts is not None and cls.start <= t_arrival < cls.end:
            cls.ttft_errors.append(t_arrival - emit_ts)


def _body(max_tokens: int, index: int) -> bytes:
    prompt = f"request {index} please summarize the report and explain the result"
    return json.dumps(
        {
            "model": "llama-3-8b",
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()


def _headers(index: int) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {DEMO_KEYS[index % len(DEMO_KEYS)]}",
        "X-Priority": "interactive",
        "X-Kvgate-Debug-Timing": "1",
        "Content-Type": "application/json",
    }


def _handle_line(line: bytes | str, t: float, first: bool) -> tuple[bool, bool]:
    """Parses one SSE line the way a Locust script would; returns (done, was_content)."""
    if isinstance(line, str):
        line = line.encode()
    if not line.startswith(b"data: "):
        return False, False
    data = line[6:]
    if data == b"[DONE]":
        return True, False
    chunk = json.loads(data)
    choices = chunk.get("choices") or ()
    content = any((c.get("delta") or {}).get("content") for c in choices)
    if content:
        Window.content_at(t)
        if first:
            Window.first_content(t, chunk.get("kvgate_emit_ts"))
    return False, content


class Ours(KvgateUser):
    traffic_class = "short_qa"
    label = "bench"
    debug_timing = True
    ignore_eos = True
    prompt_tokens = 16
    timeout_s = 60.0
    wait_time = constant(0)

    def on_start(self) -> None:
        self.api_key = DEMO_KEYS[self.index % len(DEMO_KEYS)]

    @task
    def stream(self) -> None:
        result = self.send_prompt()
        Window.requests += 1
        Window.not_ok += result.outcome != Outcome.OK
        if result.ttft_s is None:
            return
        t = result.t_send + result.ttft_s
        Window.first_content(t, result.first_emit_ts)
        if result.ttft_read_s is not None and Window.start <= t < Window.end:
            Window.read_delays.append(result.ttft_read_s - result.ttft_s)
        Window.content_at(t)
        for gap in result.gaps:
            t += gap
            Window.content_at(t)


class RequestsUser(HttpUser):
    max_tokens = 64
    wait_time = constant(0)
    _count = 0

    @task
    def stream(self) -> None:
        RequestsUser._count += 1
        index = RequestsUser._count
        first = True
        with self.client.post(
            PATH,
            data=_body(self.max_tokens, index),
            headers=_headers(index),
            stream=True,
            timeout=60,
            catch_response=True,
        ) as resp:
            Window.requests += 1
            Window.not_ok += resp.status_code != 200
            for line in resp.iter_lines():
                done, content = _handle_line(line, time.time(), first)
                first = first and not content
                if done:
                    break
            resp.success()


class FastUser(FastHttpUser):
    max_tokens = 64
    wait_time = constant(0)
    _count = 0

    @task
    def stream(self) -> None:
        FastUser._count += 1
        index = FastUser._count
        first = True
        Window.requests += 1
        try:
            lines = self.client.iter_lines(
                PATH, method="POST", data=_body(self.max_tokens, index), headers=_headers(index)
            )
            for line in lines:
                done, content = _handle_line(line, time.time(), first)
                first = first and not content
                if done:
                    break
        except Exception:  # any failure only counts against this variant's validity
            Window.not_ok += 1


def _percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100), or None (JSON has no NaN) when there is nothing."""
    return percentile(values, q) if values else None


def run(
    variant: str, url: str, streams: int, warmup_s: float, measure_s: float, tokens: int
) -> dict[str, Any]:
    user_class: type[User]
    if variant in ("ours", "ours_userspace"):
        connection.Connection.use_kernel_stamps = variant == "ours"
        user_class = type("Ours", (Ours,), {"max_tokens": tokens})
    elif variant == "httpuser":
        user_class = type("RequestsUser", (RequestsUser,), {"max_tokens": tokens})
    else:
        user_class = type("FastUser", (FastUser,), {"max_tokens": tokens})
    env = Environment(user_classes=[user_class], host=url)
    runner = env.create_local_runner()
    runner.start(streams, spawn_rate=streams)
    gevent.sleep(warmup_s)
    Window.start = time.time()
    cpu0 = time.process_time()
    Window.end = Window.start + measure_s
    gevent.sleep(measure_s)
    cpu_s = time.process_time() - cpu0
    runner.quit()
    errors_ms = [e * 1000.0 for e in Window.ttft_errors]
    delays_ms = [d * 1000.0 for d in Window.read_delays]
    return {
        "variant": variant,
        "streams": streams,
        "measure_s": measure_s,
        "requests": Window.requests,
        "not_ok": Window.not_ok,
        "events": Window.events,
        "cpu_s": cpu_s,
        "events_per_cpu_s": Window.events / cpu_s if cpu_s > 0 else None,
        "ttft_samples": len(errors_ms),
        "ttft_err_ms_p50": _percentile(errors_ms, 50),
        "ttft_err_ms_p99": _percentile(errors_ms, 99),
        "ttft_err_ms_max": max(errors_ms) if errors_ms else None,
        "read_delay_ms_p50": _percentile(delays_ms, 50),
        "read_delay_ms_p99": _percentile(delays_ms, 99),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.bench.client_worker")
    parser.add_argument(
        "--variant", required=True, choices=("ours", "ours_userspace", "httpuser", "fasthttp")
    )
    parser.add_argument("--url", required=True)
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--warmup-s", type=float, default=3.0)
    parser.add_argument("--measure-s", type=float, default=8.0)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    result = run(
        args.variant, args.url, args.streams, args.warmup_s, args.measure_s, args.max_tokens
    )
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
