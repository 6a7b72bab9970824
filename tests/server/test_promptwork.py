"""Prompt tokenizing stays off the event loop except for short prompts: a replica's loop is
also the simulated GPU's clock, and a burst of long prompts tokenized on it held the steps
back by hundreds of milliseconds."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections.abc import Callable

import pytest

from server.promptwork import INLINE_CHARS, POOL_NICE, PromptTokenizer
from server.protocol import parse_body
from server.tokenizer import DEFAULT_TOKENIZER_PATH, TextTokenizer
from tests.server.procs import ROOT
from workloads.prompts import generator_for


def _tokenize_where(text: str) -> tuple[list[int], str]:
    """The ids of `text` as a chat prompt, and the name of the thread that encoded it."""
    tokenizer = TextTokenizer(DEFAULT_TOKENIZER_PATH)
    seen: list[str] = []
    for name in ("encode", "encode_nogil"):
        real: Callable[[str], list[int]] = getattr(tokenizer, name)

        def spy(s: str, real: Callable[[str], list[int]] = real) -> list[int]:
            seen.append(threading.current_thread().name)
            return real(s)

        setattr(tokenizer, name, spy)
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]})
    parsed = parse_body("chat", body.encode())
    work = PromptTokenizer(tokenizer)
    try:
        ids = asyncio.run(work.tokens(parsed, 16, []))
    finally:
        work.close()
    assert len(seen) == 1
    return ids, seen[0]


@pytest.mark.parametrize("tokens", [512, 2048])
def test_prompts_past_a_few_hundred_tokens_tokenize_on_the_pool(tokens: int) -> None:
    text = generator_for(None).unique_text(tokens, 1, 0)
    assert len(text) > INLINE_CHARS
    ids, thread = _tokenize_where(text)
    assert thread.startswith("kvgate-tokenize")
    assert len(ids) >= tokens  # the chat template adds its own tokens


def test_a_short_question_tokenizes_on_the_loop() -> None:
    text = generator_for(None).unique_text(32, 1, 0)
    assert len(text) <= INLINE_CHARS
    _, thread = _tokenize_where(text)
    assert thread == threading.main_thread().name


_NICE_PROBE = """
import os, threading
from server.promptwork import PromptTokenizer
from server.tokenizer import TextTokenizer
def nice():
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
work = PromptTokenizer(TextTokenizer())
print(nice(), work._pool.submit(nice).result(10), nice())
"""


@pytest.mark.skipif(sys.platform != "linux", reason="nice is per thread only on Linux")
def test_the_pool_runs_below_the_event_loop_priority() -> None:
    # In a process of its own: this one is gevent-patched (Locust), where the pool's
    # threads are greenlets on the test's own thread, whose priority must not change.
    out = subprocess.run(
        [sys.executable, "-c", _NICE_PROBE], cwd=ROOT, capture_output=True, check=True, timeout=60
    )
    before, pool, after = (int(n) for n in out.stdout.split())
    assert pool == min(before + POOL_NICE, 19) and after == before
