"""`kvgate bench server --hostile`: hostile input against a fresh reference deployment.

Owns the fixed corpus of hostile requests (the robustness tests send the same one), a raw
HTTP/1.1 client that can send bytes no HTTP library will (bad framing, non-UTF-8 headers),
and the benchmark: N hostile cases (the corpus, then seeded random mutations) counting 5xx
and dropped connections, the gateway's RSS before and after, the 7 MB prompt's refusal time
and RSS growth, and /health latency while hostile bodies arrive. It measures; it asserts
nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import multiprocessing
import random
import socket
import statistics
import subprocess
import tempfile
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.client import HTTPResponse
from pathlib import Path
from typing import Any

import psutil

from harness.bench.base import Bench, start_process, stop_process

MODEL = "llama-3-8b"
KEY = b"Bearer kvg-acme-key"
ADMIN = b"Bearer kvg-admin-key"
MSGS = [{"role": "user", "content": "hi"}]
UNKNOWN_STREAM_OPTIONS = {"include_usage": True, "unknown_option": 1}


@dataclass(frozen=True, slots=True)
class Case:
    """One hostile request; `headers` replace the defaults of the same name."""

    name: str
    method: bytes = b"POST"
    path: bytes = b"/v1/chat/completions"
    headers: tuple[tuple[bytes, bytes], ...] = ()
    body: bytes = b""
    raw: bytes | None = None  # the whole request as is (request line and all)
    auto_length: bool = True


@dataclass(slots=True)
class Answer:
    status: int | None  # None: no answer (the server closed the connection, or it timed out)
    body: bytes = b""
    content_type: str = ""
    seconds: float = 0.0
    timed_out: bool = False  # no answer and no close within the client's timeout


def chat(**fields: object) -> bytes:
    return json.dumps({"model": MODEL, "messages": MSGS, "max_tokens": 2, **fields}).encode()


def _chat_raw(content: bytes) -> bytes:
    return b'{"model":"%s","max_tokens":2,"messages":[{"role":"user","content":"%s"}]}' % (
        MODEL.encode(),
        content,
    )


def big_prompt(megabytes: float = 7.0) -> bytes:
    words = "lorem ipsum dolor sit amet " * (int(megabytes * (1 << 20)) // 27)
    return chat(messages=[{"role": "user", "content": words}])


def _with(name: bytes, value: bytes, body: bytes | None = None) -> Case:
    """A chat request with one hostile header (the case is named after it)."""
    return Case(f"{name.decode()}={value[:12]!r}", headers=((name, value),), body=body or chat())


def _admin_get(name: str, path: bytes) -> Case:
    return Case(name, b"GET", path, ((b"Authorization", ADMIN),))


def _raw_get(name: str, head: bytes) -> Case:
    return Case(name, raw=b"GET " + head + b"\r\n\r\n")


def corpus() -> list[Case]:
    """The fixed hostile cases: every kind once answered 500 or dropped, and parser errors."""
    model = MODEL.encode()
    enc = b"Content-Encoding"
    prefix = b"X-Kvgate-Prefix-Tokens"
    post = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
    ids = b",".join([b"7"] * 200_000)
    return [
        Case("int_5000_digits", body=b'{"model":"%s","max_tokens":%s}' % (model, b"9" * 5000)),
        Case("int_5000_digits_seed", body=chat()[:-1] + b',"seed":' + b"1" * 5000 + b"}"),
        Case("surrogate_escape", body=_chat_raw(b"\\ud800")),
        Case("surrogate_raw_bytes", body=_chat_raw(b"\xed\xa0\x80")),
        Case("invalid_utf8", body=_chat_raw(b"\xff\xfe")),
        _with(enc, b"gzip", gzip.compress(chat())),
        _with(enc, b"gzip", b"\x1f\x8bnot gzip"),
        _with(enc, b"gzip", gzip.compress(bytes(32 << 20), compresslevel=1)),
        _with(enc, b"deflate", b"nope"),
        _with(enc, b"deflate", zlib.compress(chat())),
        _with(enc, b"br", b"nope"),
        _with(prefix, "²".encode()),
        _with(prefix, b"+5"),
        _with(prefix, b"9" * 5000),
        _with(prefix, "٣".encode()),
        _with(prefix, b"1_0"),
        _with(prefix, b"-1"),
        _admin_get("cursor_huge", b"/debug/events?after=r0:" + b"9" * 40),
        _admin_get("cursor_plain_huge", b"/debug/events?after=" + b"9" * 40),
        _admin_get("cursor_non_ascii", b"/debug/events?after=r0:%D9%A3"),
        _admin_get("cursor_superscript", b"/debug/events?after=%C2%B2"),
        _admin_get("cursor_crlf_name", b"/debug/events?after=r0%0D%0AX-Evil:%201:5"),
        _admin_get("cursor_many_parts", b"/debug/events?after=" + b",".join([b"r0:1"] * 500)),
        _with(b"Authorization", b"Bearer \xff\xfe\xc3\xa9"),
        Case("admin_non_ascii", b"GET", b"/admin/replicas", ((b"Authorization", b"Bearer \xe2"),)),
        _with(b"X-Request-Id", b"id-\xc3\xa9"),
        _with(b"X-Priority", b"\xff"),
        _with(b"X-Kvgate-Internal-Token", b"\xff\xfe"),
        Case("deep_nesting", body=b"[" * 100_000 + b"]" * 100_000),
        Case("not_an_object", body=b"[1,2,3]"),
        Case("empty_body", body=b""),
        Case("prompt_7mb", body=big_prompt()),
        Case("prompt_ids_huge", path=b"/v1/completions", body=b'{"model":"%s","prompt":[%s]}'
             % (model, ids)),
        Case("max_tokens_huge", body=chat(max_tokens=10**300)),
        Case("method_not_allowed", b"GET", b"/v1/chat/completions"),
        Case("unknown_path", b"GET", b"/v2/../../etc/passwd"),
        _raw_get("bad_header_char", b"/health HTTP/1.1\r\nHost: x\r\nBad\x01Name: v"),
        _raw_get("header_too_long", b"/health HTTP/1.1\r\nHost: x\r\nX-A: " + b"a" * 9000),
        _raw_get("url_too_long", b"/" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x"),
        _raw_get("too_many_headers", b"/health HTTP/1.1\r\nHost: x\r\n"
                 + b"\r\n".join(b"X-%d: 1" % i for i in range(300))),
        _raw_get("nul_in_path", b"/\x00 HTTP/1.1\r\nHost: x"),
        Case("tls_on_http", raw=b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(40)),
        Case("garbage_line", raw=b"HELLO THERE\r\n\r\n"),
        Case("bad_chunking", raw=post + b"Authorization: " + KEY
             + b"\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"),
        Case("length_and_chunked", raw=post
             + b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
        Case("negative_length", raw=post + b"Content-Length: -1\r\n\r\n"),
        Case("unknown_field", body=chat(frobnicate=1, stream_options=UNKNOWN_STREAM_OPTIONS)),
        Case("metrics_no_key", b"GET", b"/metrics", ((b"Authorization", b""),)),
        Case("events_tenant_key", b"GET", b"/debug/events"),
        Case("info_no_key", b"GET", b"/debug/info", ((b"Authorization", b""),)),
    ]  # fmt: skip


def build(case: Case, host: str) -> bytes:
    """The raw bytes of `case` (the key of tenant acme unless the case sets Authorization)."""
    if case.raw is not None:
        return case.raw
    names = {n.lower() for n, _ in case.headers}
    head = [b"%s %s HTTP/1.1" % (case.method, case.path), b"Host: " + host.encode()]
    if b"authorization" not in names:
        head.append(b"Authorization: " + KEY)
    if b"content-type" not in names and case.method == b"POST":
        head.append(b"Content-Type: application/json")
    head += [n + b": " + v for n, v in case.headers if v or n.lower() != b"authorization"]
    if case.auto_length and (case.body or case.method == b"POST"):
        head.append(b"Content-Length: %d" % len(case.body))
    head.append(b"Connection: close")
    return b"\r\n".join(head) + b"\r\n\r\n" + case.body


def exchange(url: str, data: bytes, timeout_s: float = 30.0) -> Answer:
    """Send raw bytes, read one HTTP answer. `status=None` when the server closed the
    connection without answering (a dropped connection)."""
    host, _, port = url.removeprefix("http://").rstrip("/").partition(":")
    t0 = time.perf_counter()
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        # The server may answer and close before reading everything: read the answer anyway.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(data)
        resp = HTTPResponse(sock)
        try:
            resp.begin()
            body = resp.read()
        except ConnectionError:  # closed or reset by the server
            return Answer(None, seconds=time.perf_counter() - t0)
        except TimeoutError:  # neither an answer nor a close in time
            return Answer(None, seconds=time.perf_counter() - t0, timed_out=True)
        return Answer(
            resp.status, body, resp.getheader("Content-Type") or "", time.perf_counter() - t0
        )


def problem(answer: Answer) -> str | None:
    """Why `answer` is not acceptable for hostile input: a 5xx, a drop, a non-JSON error."""
    if answer.status is None:
        return "dropped connection"
    if answer.status >= 500:
        return f"HTTP {answer.status}: {answer.body[:200]!r}"
    if answer.status >= 400:
        if not answer.content_type.startswith("application/json"):
            return f"HTTP {answer.status} with {answer.content_type!r}, not JSON"
        try:
            err = json.loads(answer.body)["error"]
            complete = {"message", "type", "code"} <= set(err)
        except (ValueError, KeyError, TypeError):
            complete = False
        if not complete:
            return f"HTTP {answer.status} body is not an OpenAI error: {answer.body[:200]!r}"
    return None


def mutate(rng: random.Random, base: Sequence[Case]) -> Case:
    """A random hostile variation: a corpus case with bytes flipped, cut or spliced, or a
    valid body with a hostile header value."""
    case = rng.choice(base)
    if case.raw is not None or not case.body or len(case.body) > 100_000:
        case = Case("valid", body=chat())
    body = bytearray(case.body)
    how = rng.randrange(4)
    if how == 0:
        for _ in range(rng.randint(1, 8)):
            body[rng.randrange(len(body))] = rng.randrange(256)
    elif how == 1:
        body = body[: rng.randrange(len(body))]
    elif how == 2:
        pos = rng.randrange(len(body))
        body[pos:pos] = rng.choice([b"\\ud83d", b"\xed\xb0\x80", b"9" * 4400, b'"x":', b"\x00"])
    else:
        name = rng.choice(
            [b"X-Request-Id", b"X-Priority", b"X-Kvgate-Prefix-Tokens", b"Authorization"]
        )
        value = bytes(
            rng.choice(list(range(0x20, 0x7F)) + list(range(0x80, 0x100)))
            for _ in range(rng.randint(0, 300))
        )
        return Case(f"{case.name}+header", headers=((name, value.strip()),), body=bytes(body))
    return Case(f"{case.name}+mutated", headers=case.headers, body=bytes(body))  # fmt: skip


@dataclass(slots=True)
class Tally:
    cases: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def run_cases(url: str, cases: Sequence[Case], tally: Tally) -> None:
    host = url.removeprefix("http://").rstrip("/")
    for case in cases:
        answer = exchange(url, build(case, host))
        tally.cases += 1
        key = str(answer.status) if answer.status is not None else "dropped"
        tally.by_status[key] = tally.by_status.get(key, 0) + 1
        why = problem(answer)
        if why:
            tally.problems.append(f"{case.name}: {why}")


def rss_mb(pid: int) -> float:
    return float(psutil.Process(pid).memory_info().rss) / (1 << 20)


def big_prompt_refusal(url: str, pid: int) -> dict[str, float | int | None]:
    """Send the 7 MB prompt 3 times; the slowest answer and the RSS growth it left."""
    host = url.removeprefix("http://")
    data = build(Case("prompt_7mb", body=big_prompt()), host)
    before = rss_mb(pid)
    times, statuses = [], []
    for _ in range(3):
        answer = exchange(url, data)
        times.append(answer.seconds * 1000)
        statuses.append(answer.status)
    return {
        "status": statuses[-1],
        "ms_max": round(max(times), 1),
        "ms_min": round(min(times), 1),
        "rss_growth_mb": round(rss_mb(pid) - before, 1),
    }


def _attack(url: str, stop: Any) -> None:
    """One sender process: gzip bombs and 7 MB prompts until `stop` is set."""
    host = url.removeprefix("http://")
    names = ("gzip_bomb", "prompt_7mb", "gzip_valid")
    heavy = [build(c, host) for c in corpus() if c.name in names or c.body[:2] == b"\x1f\x8b"]
    i = 0
    while not stop.is_set():
        exchange(url, heavy[i % len(heavy)])
        i += 1


def health_under_attack(url: str, seconds: float, senders: int) -> dict[str, float]:
    """/health latency (ms) measured every 20 ms while `senders` processes (separate, so
    their work does not delay this one's probes) send gzip bombs and 7 MB prompts."""
    host = url.removeprefix("http://")
    stop = multiprocessing.Event()
    procs = [multiprocessing.Process(target=_attack, args=(url, stop)) for _ in range(senders)]
    for p in procs:
        p.start()
    time.sleep(2.0)  # let every sender build its bodies and start sending
    lat: list[float] = []
    probe = b"GET /health HTTP/1.1\r\nHost: " + host.encode() + b"\r\nConnection: close\r\n\r\n"
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        lat.append(exchange(url, probe).seconds * 1000)
        time.sleep(0.02)
    stop.set()
    for p in procs:
        p.join(60)
    lat.sort()
    return {
        "probes": len(lat),
        "p50_ms": round(statistics.median(lat), 2),
        "p99_ms": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))], 2),
        "max_ms": round(lat[-1], 2),
    }


def start_deployment(
    work: Path, replicas: int = 2, time_scale: float = 0.05
) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """A fresh `server.serve` under `work` (its state and log there); its ready file."""
    work.mkdir(parents=True, exist_ok=True)
    args = ["--replicas", str(replicas), "--port", "0", "--time-scale", str(time_scale)]
    args += ["--state-dir", str(work / "state")]
    return start_process("server.serve", args, work / "ready.json", work / "serve.log")


def measure(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kvgate-hostile-") as tmp:
        proc, ready = start_deployment(Path(tmp))
        try:
            url, pid = str(ready["gateway_url"]), int(ready["pid"])
            rss_before = rss_mb(pid)
            rng = random.Random(args.seed)
            base = corpus()
            cases = list(base) + [mutate(rng, base) for _ in range(args.cases - len(base))]
            tally = Tally()
            run_cases(url, cases, tally)
            rss_after = rss_mb(pid)
            prompt = big_prompt_refusal(url, pid)
            health = health_under_attack(url, args.health_seconds, args.senders)
            alive = proc.poll() is None and all(
                psutil.pid_exists(int(r["pid"])) for r in ready["replicas"]
            )
            return {
                "cases": tally.cases,
                "by_status": dict(sorted(tally.by_status.items())),
                "server_errors_5xx": sum(
                    n for s, n in tally.by_status.items() if s.isdigit() and int(s) >= 500
                ),
                "dropped_connections": tally.by_status.get("dropped", 0),
                "problems": tally.problems[:20],
                "gateway_rss_mb_before": round(rss_before, 1),
                "gateway_rss_mb_after": round(rss_after, 1),
                "gateway_rss_mb_end": round(rss_mb(pid), 1),
                "prompt_7mb": prompt,
                "health_under_attack": health,
                "processes_alive": alive,
            }
        finally:
            stop_process(proc, grace_s=20)


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cases", type=int, default=600, help="hostile requests (>= corpus)")
    parser.add_argument("--seed", type=int, default=13, help="seed of the random mutations")
    parser.add_argument("--health-seconds", type=float, default=10.0)
    parser.add_argument("--senders", type=int, default=3, help="threads sending heavy bodies")


BENCH = Bench(
    "kvgate bench server --hostile", __doc__ or "", _options, measure, json_help="print JSON only"
)
