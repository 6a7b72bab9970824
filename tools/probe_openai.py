"""Probe how an OpenAI-compatible server behaves on the wire (stdlib only).

    python tools/probe_openai.py http://127.0.0.1:18080 [--model ID] [--pid PID] [--only NAME,...]

Sends a bounded set of requests to the server at URL (loopback only: the probes are meant
for a server on this machine) and prints one JSON object per probe, then a summary line.
Probes: endpoints, stream, errors, limits, throughput, disconnect. `--pid` lets the
disconnect probe read the server's CPU time from /proc to see whether generation stops
when the client goes away. Every request has a timeout; the whole run is bounded.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import threading
import time
import urllib.parse
from typing import Any

TIMEOUT_S = 120.0


class Target:
    def __init__(self, url: str, model: str | None) -> None:
        u = urllib.parse.urlsplit(url)
        if u.hostname not in ("127.0.0.1", "localhost", "::1"):
            raise SystemExit("probe_openai: only loopback targets are probed")
        self.host = u.hostname
        self.port = u.port or 80
        self.model = model

    def conn(self, timeout: float = TIMEOUT_S) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def get(self, path: str) -> tuple[int, dict[str, str], bytes]:
        c = self.conn(10)
        try:
            c.request("GET", path)
            r = c.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            c.close()

    def post(
        self,
        path: str,
        body: dict[str, Any],
        headers: dict[str, str] | None = None,
        timeout: float = TIMEOUT_S,
    ) -> tuple[int, dict[str, str], bytes]:
        c = self.conn(timeout)
        try:
            c.request(
                "POST",
                path,
                json.dumps(body),
                {"Content-Type": "application/json", **(headers or {})},
            )
            r = c.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            c.close()

    def chat(
        self, content: str, max_tokens: int | None, stream: bool = True, **extra: Any
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "messages": [{"role": "user", "content": content}],
            "stream": stream,
        }
        if self.model is not None:
            body["model"] = self.model
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        body.update(extra)
        return body

    def stream(
        self,
        body: dict[str, Any],
        headers: dict[str, str] | None = None,
        stop_after_content: int | None = None,
        timeout: float = TIMEOUT_S,
    ) -> dict[str, Any]:
        """POSTs a streaming request and reads its SSE events; returns what came, with times."""
        c = self.conn(timeout)
        t0 = time.perf_counter()
        out: dict[str, Any] = {"events": [], "done": False, "ttft_s": None, "content_chunks": 0}
        try:
            c.request(
                "POST",
                "/v1/chat/completions",
                json.dumps(body),
                {"Content-Type": "application/json", **(headers or {})},
            )
            r = c.getresponse()
            out["status"] = r.status
            out["headers"] = {k.lower(): v for k, v in r.getheaders()}
            if r.status != 200:
                out["body"] = r.read()[:500].decode("utf-8", "replace")
                return out
            while True:
                line = r.readline()
                if not line:
                    break
                line = line.rstrip(b"\r\n")
                if not line:
                    continue
                if not line.startswith(b"data:"):
                    out["events"].append({"non_data": line.decode("utf-8", "replace")})
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    out["done"] = True
                    out["events"].append("[DONE]")
                    continue
                try:
                    ev = json.loads(data)
                except ValueError:
                    out["events"].append({"unparsed": data[:200].decode("utf-8", "replace")})
                    continue
                out["events"].append(ev)
                for ch in ev.get("choices") or ():
                    if (ch.get("delta") or {}).get("content"):
                        if out["ttft_s"] is None:
                            out["ttft_s"] = time.perf_counter() - t0
                        out["content_chunks"] += 1
                if stop_after_content is not None and out["content_chunks"] >= stop_after_content:
                    out["closed_early"] = True
                    break
        except (OSError, http.client.HTTPException) as exc:
            out["exception"] = repr(exc)
        finally:
            c.close()  # mid-stream: the server sees the client go away
            out["e2e_s"] = time.perf_counter() - t0
        return out


def words(n: int) -> str:
    """About n tokens of text for the kvgate BPE (a common word and a space per token)."""
    vocab = ["the", "model", "server", "token", "cache", "request", "tenant", "time"]
    return " ".join(vocab[i % len(vocab)] for i in range(n))


def summarize_stream(res: dict[str, Any]) -> dict[str, Any]:
    evs = [e for e in res.get("events", []) if isinstance(e, dict)]
    first = evs[0] if evs else None
    usage_at = [i for i, e in enumerate(evs) if e.get("usage")]
    finish = [
        (i, ch.get("finish_reason"))
        for i, e in enumerate(evs)
        for ch in e.get("choices") or ()
        if ch.get("finish_reason")
    ]
    usage = evs[usage_at[-1]]["usage"] if usage_at else None
    return {
        "status": res.get("status"),
        "body": res.get("body"),
        "n_events": len(res.get("events", [])),
        "first_event": first,
        "role_only_first": bool(
            first
            and first.get("choices")
            and first["choices"][0].get("delta", {}).get("role")
            and not first["choices"][0]["delta"].get("content")
        ),
        "content_chunks": res.get("content_chunks"),
        "done_sentinel": res.get("done"),
        "finish": finish,
        "usage_event_index": usage_at,
        "usage": usage,
        "usage_has_cached_tokens": bool(
            usage and (usage.get("prompt_tokens_details") or {}).get("cached_tokens") is not None
        ),
        "last_event": evs[-1] if evs else None,
        "ttft_s": res.get("ttft_s"),
        "e2e_s": res.get("e2e_s"),
        "exception": res.get("exception"),
        "content_type": (res.get("headers") or {}).get("content-type"),
    }


def p_endpoints(t: Target, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path in (
        "/v1/models",
        "/health",
        "/metrics",
        "/tokenize",
        "/version",
        "/info",
        "/get_server_info",
        "/ping",
    ):
        try:
            st, hd, body = t.get(path)
            out[path] = {
                "status": st,
                "content_type": hd.get("content-type"),
                "body": body[:400].decode("utf-8", "replace"),
            }
        except OSError as exc:
            out[path] = {"exception": repr(exc)}
    st, _, body = t.post("/tokenize", {"model": t.model, "prompt": "hello"})
    out["POST /tokenize"] = {"status": st, "body": body[:200].decode("utf-8", "replace")}
    return out


def p_stream(t: Target, args: argparse.Namespace) -> dict[str, Any]:
    out = {}
    out["plain"] = summarize_stream(t.stream(t.chat("hello there", 4)))
    out["include_usage"] = summarize_stream(
        t.stream(t.chat("hello there", 4, stream_options={"include_usage": True}))
    )
    out["continuous_usage_stats"] = summarize_stream(
        t.stream(
            t.chat(
                "hello there",
                4,
                stream_options={"include_usage": True, "continuous_usage_stats": True},
            )
        )
    )
    # Same long prefix twice: is cached_tokens reported the second time?
    prefix = words(600)
    t.stream(t.chat(prefix + " first", 2, stream_options={"include_usage": True}))
    out["repeat_prefix_second"] = summarize_stream(
        t.stream(t.chat(prefix + " second", 2, stream_options={"include_usage": True}))
    )
    st, _, body = t.post("/v1/chat/completions", t.chat("hello there", 4, stream=False))
    out["non_stream"] = {"status": st, "body": body[:600].decode("utf-8", "replace")}
    out["no_model_field"] = summarize_stream(
        t.stream({"messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 2})
    )
    return out


def short(res: dict[str, Any]) -> dict[str, Any]:
    s = summarize_stream(res)
    return {
        k: s[k]
        for k in (
            "status",
            "body",
            "content_chunks",
            "done_sentinel",
            "finish",
            "usage",
            "e2e_s",
            "exception",
        )
    }


def p_errors(t: Target, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    b = t.chat("hello", 2)
    b["model"] = "llama-3-8b"
    out["wrong_model"] = short(t.stream(b))
    for name, extra in (
        ("ignore_eos", {"ignore_eos": True}),
        ("priority", {"priority": 5}),
        ("cache_salt", {"cache_salt": "tenant-a"}),
        ("top_k", {"top_k": 5}),
        ("min_tokens", {"min_tokens": 3}),
        ("user", {"user": "alice"}),
        ("n_2", {"n": 2}),
        ("logprobs", {"logprobs": True}),
    ):
        out["field_" + name] = short(t.stream(t.chat("hello", 2, **extra)))
    out["no_auth"] = short(t.stream(t.chat("hello", 2)))
    out["bad_bearer"] = short(
        t.stream(t.chat("hello", 2), headers={"Authorization": "Bearer wrong-key"})
    )
    out["x_priority_header"] = short(
        t.stream(t.chat("hello", 2), headers={"X-Priority": "critical"})
    )
    rid = "kvg-probe-fixed-id"
    res = t.stream(t.chat("hello", 2), headers={"X-Request-Id": rid})
    out["x_request_id_echo"] = {
        "sent": rid,
        "response_header": (res.get("headers") or {}).get("x-request-id"),
        "chunk_id": (res["events"][0] or {}).get("id") if res.get("events") else None,
    }
    st, _, body = t.post("/v1/chat/completions", {"model": t.model, "stream": True})
    out["missing_messages"] = {"status": st, "body": body[:300].decode("utf-8", "replace")}
    c = t.conn(10)
    c.request("POST", "/v1/chat/completions", b"{not json", {"Content-Type": "application/json"})
    r = c.getresponse()
    out["malformed_json"] = {"status": r.status, "body": r.read()[:300].decode("utf-8", "replace")}
    c.close()
    out["max_tokens_0"] = short(t.stream(t.chat("hello", 0)))
    out["max_tokens_negative"] = short(t.stream(t.chat("hello", -1)))
    return out


def p_limits(t: Target, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in (4000, args.long_prompt):
        res = t.stream(t.chat(words(n), 2, stream_options={"include_usage": True}), timeout=300)
        out[f"prompt_{n}_words"] = short(res) | {"ttft_s": res.get("ttft_s")}
    # max_tokens far beyond the context: does it refuse, clamp or start? (closed after 3 chunks)
    res = t.stream(t.chat("hello", 10**6), stop_after_content=3, timeout=60)
    out["max_tokens_1e6"] = short(res) | {"closed_early": res.get("closed_early")}
    time.sleep(0.5)
    return out


def run_concurrent(t: Target, n: int, max_tokens: int, prompt_words: int = 50) -> dict[str, Any]:
    results: list[dict[str, Any]] = [{} for _ in range(n)]

    def one(i: int) -> None:
        results[i] = t.stream(
            t.chat(
                f"{i} " + words(prompt_words), max_tokens, stream_options={"include_usage": True}
            ),
            timeout=300,
        )

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0

    def completion_tokens(r: dict[str, Any]) -> int:
        usage = summarize_stream(r)["usage"] or {}
        return int(usage.get("completion_tokens") or 0)

    toks = sum(completion_tokens(r) for r in results)
    ttfts = sorted(r["ttft_s"] for r in results if r.get("ttft_s") is not None)
    per_stream = [
        (completion_tokens(r) - 1) / (r["e2e_s"] - r["ttft_s"])
        for r in results
        if r.get("ttft_s") and completion_tokens(r) > 1 and r["e2e_s"] > r["ttft_s"]
    ]
    return {
        "streams": n,
        "max_tokens": max_tokens,
        "ok": sum(
            1 for r in results if r.get("status") == 200 and completion_tokens(r) == max_tokens
        ),
        "completion_tokens": toks,
        "wall_s": round(wall, 2),
        "aggregate_tok_s": round(toks / wall, 1),
        "per_stream_decode_tok_s_mean": round(sum(per_stream) / len(per_stream), 1)
        if per_stream
        else None,
        "ttft_s_min_max": [round(ttfts[0], 3), round(ttfts[-1], 3)] if ttfts else None,
    }


def p_throughput(t: Target, args: argparse.Namespace) -> dict[str, Any]:
    t.stream(t.chat("warm up", 8))
    out = {}
    for rep in range(args.repeats):
        for n in (1, 4, 8):
            out[f"c{n}#{rep + 1}"] = run_concurrent(t, n, args.max_tokens)
    return out


def cpu_seconds(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return None


def p_disconnect(t: Target, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if args.pid:
        c0 = cpu_seconds(args.pid)
        time.sleep(2)
        out["idle_cpu_s_per_s"] = round(((cpu_seconds(args.pid) or 0) - (c0 or 0)) / 2, 3)
    res = t.stream(t.chat("hello", 5000), stop_after_content=5, timeout=60)
    out["closed_after_chunks"] = res.get("content_chunks")
    if args.pid:
        time.sleep(0.5)
        c0 = cpu_seconds(args.pid)
        time.sleep(3)
        out["cpu_s_per_s_after_disconnect"] = round(
            ((cpu_seconds(args.pid) or 0) - (c0 or 0)) / 3, 3
        )
    # The server still answers, and a fresh stream runs at the idle speed.
    out["after"] = run_concurrent(t, 1, 64)
    # Four streams cut at once, then one more request.
    threads = [
        threading.Thread(
            target=t.stream, args=(t.chat("x", 5000),), kwargs={"stop_after_content": 3}
        )
        for _ in range(4)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if args.pid:
        time.sleep(0.5)
        c0 = cpu_seconds(args.pid)
        time.sleep(3)
        out["cpu_s_per_s_after_4_disconnects"] = round(
            ((cpu_seconds(args.pid) or 0) - (c0 or 0)) / 3, 3
        )
    out["after_4"] = run_concurrent(t, 1, 64)
    return out


PROBES = {
    "endpoints": p_endpoints,
    "stream": p_stream,
    "errors": p_errors,
    "limits": p_limits,
    "throughput": p_throughput,
    "disconnect": p_disconnect,
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("url")
    p.add_argument("--model", help="model id to send (default: the first of /v1/models)")
    p.add_argument(
        "--pid", type=int, help="server PID, for the CPU reading of the disconnect probe"
    )
    p.add_argument("--only", help="comma-separated probes: " + ",".join(PROBES))
    p.add_argument(
        "--max-tokens", type=int, default=64, help="tokens per stream in the throughput probe"
    )
    p.add_argument("--repeats", type=int, default=2, help="rounds of the throughput probe")
    p.add_argument(
        "--long-prompt", type=int, default=33000, help="words in the over-context prompt"
    )
    args = p.parse_args(argv)
    t = Target(args.url, args.model)
    if t.model is None:
        st, _, body = t.get("/v1/models")
        if st == 200:
            t.model = json.loads(body)["data"][0]["id"]
    names = args.only.split(",") if args.only else list(PROBES)
    for name in names:
        t0 = time.perf_counter()
        result = PROBES[name](t, args)
        print(
            json.dumps(
                {
                    "probe": name,
                    "model": t.model,
                    "took_s": round(time.perf_counter() - t0, 2),
                    "result": result,
                }
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
