"""The scheduler recorder inside a real vLLM (the CPU build `make vllm` caches): a cancelled
stream, a completion, and three long streams in a 15-block pool that vLLM must preempt, and
the recorder's lines checked against what the client saw and against vLLM's own preemption
counter. Deselected by default (pyproject's addopts); run it with

    .venv/bin/pytest -m real_engine tests/real/test_vllm_recorder.py
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import os
import random
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from contract.host import OWN_GROUP
from harness.engines.vllm import VllmLaunch, cpu_install, event_rows, launch
from harness.jsonl import JsonlTail
from harness.plan import VllmTarget
from tests.waiting import wait_until

INSTALL = cpu_install()
BLOCK = 128
pytestmark = [
    pytest.mark.real_engine,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not INSTALL.complete, reason=f"no vLLM CPU install: {INSTALL.why}"),
]
# Three long streams admitted in this order; FCFS preempts the last admitted first: B (the
# worst rank, at_risk), then C while A of worse rank still runs (lower_priority_running).
LONG = (("kvg-long-a", 2), ("kvg-long-c", 0), ("kvg-long-b", 2))
LONG_TOKENS = 1000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _serving(ln: VllmLaunch, port: int) -> Iterator[str]:
    """vLLM started in its own session, healthy; the whole process group stopped after."""
    with ln.log_path.open("ab") as log:
        proc = subprocess.Popen(
            ln.argv,
            env={**os.environ, **ln.env},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            process_group=OWN_GROUP,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: proc.poll() is not None or _get(base + "/health") is not None,
            timeout_s=240,
            what=f"vLLM's /health (log: {ln.log_path})",
        )
        assert proc.poll() is None, ln.log_path.read_text(errors="replace")[-3000:]
        yield base
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the EngineCore and worker outlive their parent
        proc.wait(timeout=30)


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return str(resp.read().decode())
    except OSError:
        return None


def _prompt(seed: str, words: int = 200) -> str:
    """Distinct words per request, so no two requests share prefix-cache blocks."""
    rng = random.Random(seed)
    return " ".join(
        f"{rng.choice('kv pool tenant evict admit quota block')}{rng.randrange(999)}"
        for _ in range(words)
    )


def _stream(
    base: str, rid: str, body: dict[str, Any], stop: Callable[[int], bool] = lambda _: False
) -> dict[str, Any]:
    """POST a streaming chat completion with X-Request-Id; reads it to the end, or closes the
    connection once `stop(content_chunks)` holds (then `t_close` is when)."""
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    payload = {"model": "tiny-llama", "stream": True, **body}
    payload["stream_options"] = {"include_usage": True}
    conn.request(
        "POST",
        "/v1/chat/completions",
        body=json.dumps(payload),
        headers={"Content-Type": "application/json", "X-Request-Id": rid},
    )
    resp = conn.getresponse()
    got: dict[str, Any] = {"status": resp.status, "chunks": 0}
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: {"):
            continue
        data = json.loads(line.removeprefix("data: "))
        for choice in data.get("choices", []):
            got["chunks"] += bool(choice.get("delta", {}).get("content"))
            got["finish_reason"] = choice.get("finish_reason") or got.get("finish_reason")
        got["usage"] = data.get("usage") or got.get("usage")
        if stop(got["chunks"]):
            got["t_close"] = time.time()
            assert conn.sock is not None
            conn.sock.close()
            break
    conn.close()
    return got


def _preemptions_total(base: str) -> float:
    text = _get(base + "/metrics") or ""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:num_preemptions_total")
    )


class _Lines:
    """Everything the recorder wrote so far, read through a JsonlTail."""

    def __init__(self, path: Path) -> None:
        self.tail = JsonlTail(path)
        self.all: list[dict[str, Any]] = []

    def wait(self, what: str, pred: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        def seen() -> dict[str, Any] | None:
            self.all += self.tail.poll()
            return next((line for line in self.all if pred(line)), None)

        return wait_until(seen, timeout_s=120, what=what)

    def of(self, rid: str) -> list[dict[str, Any]]:
        return [line for line in self.all if _kvgate_id(line) == rid]


def _kvgate_id(line: dict[str, Any]) -> str | None:
    rows = event_rows(line, {0: "critical", 2: "batch"})
    return rows[0]["request_id"] if rows else None


def _event(name: str, rid: str) -> Callable[[dict[str, Any]], bool]:
    return lambda line: line["event"] == name and _kvgate_id(line) == rid


def _run_load(base: str, lines: _Lines) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """A completion, a stream closed after its first token, then the three long streams,
    each sent once the one before it is admitted; the client's view of each."""
    completion = urllib.request.Request(
        base + "/v1/completions",
        data=json.dumps({"model": "tiny-llama", "prompt": "hello", "max_tokens": 4}).encode(),
        headers={"Content-Type": "application/json", "X-Request-Id": "kvg-cmpl-1"},
    )
    with urllib.request.urlopen(completion, timeout=60) as resp:
        assert resp.status == 200
    body = {"messages": [{"role": "user", "content": _prompt("cancel")}], "max_tokens": 1000}
    cancel = _stream(base, "kvg-cancel-1", body | {"priority": 0}, stop=lambda n: n >= 1)
    lines.wait("the cancelled stream's release", _event("released", "kvg-cancel-1"))
    seen: dict[str, dict[str, Any]] = {}

    def send(rid: str, priority: int) -> None:
        content = [{"role": "user", "content": _prompt(rid)}]
        body = {"messages": content, "max_tokens": LONG_TOKENS, "priority": priority}
        seen[rid] = _stream(base, rid, body)

    threads = []
    for rid, priority in LONG:
        threads.append(threading.Thread(target=send, args=(rid, priority)))
        threads[-1].start()
        lines.wait(f"{rid} admitted", _event("admitted", rid))
    for thread in threads:
        thread.join(timeout=200)
    for rid, _ in LONG:
        lines.wait(f"{rid} released", _event("released", rid))
    return cancel, seen


def test_the_recorder_sees_each_request_s_life_as_vllm_lives_it(tmp_path: Path) -> None:
    spec = VllmTarget(kv_blocks=16, max_model_len=1536, scheduling_policy="fcfs")
    port = _free_port()
    ln = launch(spec, port, tmp_path)
    assert ln.events_path is not None
    lines = _Lines(ln.events_path)
    with _serving(ln, port) as base:
        before = _preemptions_total(base)
        cancel, seen = _run_load(base, lines)
        preempted = [line for line in lines.all if line["event"] == "preempted"]
        with contextlib.suppress(AssertionError):  # vLLM's counter follows its outputs
            wait_until(lambda: _preemptions_total(base) - before >= len(preempted), 20)
        counted = _preemptions_total(base) - before
    lines.all += lines.tail.poll()

    init = lines.all[0]
    assert (init["event"], init["policy"], init["num_blocks"]) == ("init", "fcfs", 16)
    assert init["block_size"] == BLOCK and init["pool_total_blocks"] == 15
    assert [line["seq"] for line in lines.all] == list(range(len(lines.all)))
    _check_completion(lines.of("kvg-cmpl-1"))
    _check_cancel(lines.of("kvg-cancel-1"), cancel)
    for rid, priority in LONG:
        _check_long(lines.of(rid), seen[rid], priority)
    reasons = {(_kvgate_id(line), line["reason"]) for line in preempted}
    assert ("kvg-long-b", "at_risk") in reasons  # the worst rank running: nothing worse left
    assert ("kvg-long-c", "lower_priority_running") in reasons  # FCFS took critical over batch
    assert counted == len(preempted), f"vllm:num_preemptions_total rose by {counted}"
    assert lines.all[-1]["event"] == "released" and lines.all[-1]["pool_used_blocks"] == 0


def _names(events: list[dict[str, Any]]) -> list[str]:
    return [line["event"] for line in events]


def _check_completion(events: list[dict[str, Any]]) -> None:
    assert re.fullmatch(r"cmpl-kvg-cmpl-1-0-[0-9a-f]{8}", events[0]["vllm_id"])
    assert _names(events) == ["queued", "admitted", "finished", "released"]
    assert events[2]["reason"] == "length" and events[2]["output_tokens"] == 4


def _check_cancel(events: list[dict[str, Any]], client: dict[str, Any]) -> None:
    assert re.fullmatch(r"chatcmpl-kvg-cancel-1-[0-9a-f]{8}", events[0]["vllm_id"])
    assert _names(events) == ["queued", "admitted", "aborted", "released"]
    aborted, released = events[2], events[3]
    assert aborted["reason"] == "abort" and aborted["blocks"] == 0
    assert released["t"] >= client["t_close"] and released["blocks"] > 0
    assert 0 < aborted["output_tokens"] < 1000


def _check_long(events: list[dict[str, Any]], client: dict[str, Any], priority: int) -> None:
    names = _names(events)
    assert names[:2] == ["queued", "admitted"] and names[-2:] == ["finished", "released"]
    middle = names[2:-2]
    assert middle == ["preempted", "resumed"] * (len(middle) // 2), names
    assert {line["priority"] for line in events} == {priority}
    finished, released = events[-2], events[-1]
    usage = client["usage"]
    assert client["finish_reason"] == finished["reason"] == "length"
    assert finished["output_tokens"] == usage["completion_tokens"] == LONG_TOKENS
    assert finished["prompt_tokens"] == usage["prompt_tokens"]
    assert finished["num_preemptions"] == names.count("preempted")
    kv = finished["prompt_tokens"] + finished["output_tokens"]
    assert released["blocks"] in (math.ceil((kv - 1) / BLOCK), math.ceil(kv / BLOCK))
