"""Prompt tokenizing stays off the event loop except for short prompts: a replica's loop is
also the simulated GPU's clock, and a burst of long prompts tokenized on it held the steps
back by hundreds of milliseconds."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable

import pytest

from server.promptwork import INLINE_CHARS, PromptTokenizer
from server.protocol import parse_body
from server.tokenizer import DEFAULT_TOKENIZER_PATH, TextTokenizer
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
