"""Bounded prompt work, shared by the gateway and the replica: the context check, a free
lower bound on a prompt's tokens checked before tokenizing, and parsing of large bodies and
tokenization of long prompts off the event loop on a small dedicated pool.

A prompt can only reach the tokenizer when its lower bound fits the context limit, so the
text tokenized per request is capped at `limit x max_token_chars` characters (about 430 K
for a 32 K context with the default tokenizer) whatever the body size.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

from server.protocol import ApiError, ParsedRequest, parse_body
from server.tokenizer import TextTokenizer, render_chat

# Prompts up to this many characters (about 350 tokens) tokenize on the loop, in under a
# millisecond; longer ones on the pool. Measured with the reference tokenizer: 0.6 ms for
# 1.4K characters, 3.6 ms for 5.7K, 10 ms for 16.7K. A peak's burst of thirty 2K-token
# prompts tokenized on the loop held a replica's steps back by 150-300 ms.
INLINE_CHARS = 2048
# Larger bodies parse on the pool: json.loads of a 7 MB body holds the loop for tens of ms,
# while a worker thread yields the GIL to the loop every switch interval (5 ms).
INLINE_BODY_BYTES = 256 * 1024
TOKENIZE_WORKERS = 2  # long prompts queue here rather than each taking a core and memory
# The pool's threads give way for the CPU to the process's event loop and to every other
# process (a replica's step loop keeps the virtual GPU's clock): a 32K-token prompt is about
# 50 ms of CPU, and the twenty that start a CI plan's peak are tokenized on the gateway and
# again on the replicas, all at once, on the same small host.
POOL_NICE = 10  # added to the niceness the thread inherits (19 at most)


def _yield_cpu(owner: int) -> None:
    """Runs in each pool thread: lower its CPU priority. Linux only, where nice is a
    property of the thread; elsewhere it would lower the whole process. `owner` is the
    native id of the thread that made the pool: where threads are greenlets (a gevent-patched
    process), the pool runs on that same thread, which must keep its priority."""
    tid = threading.get_native_id()
    if sys.platform == "linux" and tid != owner:
        with contextlib.suppress(OSError):
            nice = os.getpriority(os.PRIO_PROCESS, tid)
            os.setpriority(os.PRIO_PROCESS, tid, min(nice + POOL_NICE, 19))


@dataclass(frozen=True, slots=True)
class ContextLimit:
    """A context window in tokens and whose it is, for the refusal message."""

    tokens: int
    whose: str


def check_context(
    prompt: int, max_new: int, default: bool, limits: Sequence[ContextLimit], at_least: str = ""
) -> None:
    """ApiError(400 too_long) when prompt + max_new passes any limit. `at_least` describes a
    lower bound (the prompt was not tokenized) and goes into the message."""
    total = prompt + max_new
    asked = f"the default max_tokens ({max_new})" if default else f"max_tokens ({max_new})"
    for limit in limits:
        if total > limit.tokens:
            size = f"at least {prompt} tokens{at_least}" if at_least else f"{prompt} tokens"
            raise ApiError(
                400,
                "too_long",
                f"input ({size}) plus {asked} exceeds {limit.whose} {limit.tokens}-token "
                f"context limit; shorten the input or lower max_tokens",
            )


class PromptTokenizer:
    """Owns the tokenizing pool. Invariant: no text reaches the tokenizer unless its lower
    bound plus max_new fits every limit."""

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self.tokenizer = tokenizer
        self._pool = ThreadPoolExecutor(
            TOKENIZE_WORKERS,
            thread_name_prefix="kvgate-tokenize",
            initializer=_yield_cpu,
            initargs=(threading.get_native_id(),),
        )

    async def parse(self, kind: Literal["chat", "completion"], body: bytes) -> ParsedRequest:
        """`protocol.parse_body`, off the event loop for large bodies."""
        if len(body) <= INLINE_BODY_BYTES:
            return parse_body(kind, body)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, parse_body, kind, body)

    async def tokens(
        self,
        parsed: ParsedRequest,
        max_new: int,
        limits: Sequence[ContextLimit],
        exact: bool = True,
    ) -> list[int]:
        """The prompt's token ids, checked against `limits` (ApiError 400 otherwise); with
        `exact=False` only the lower bound is checked here (the replica's scheduler checks
        the exact count itself, and counts the refusal)."""
        default = parsed.max_tokens is None
        if parsed.prompt_ids is not None:
            ids = parsed.prompt_ids
        else:
            chars = parsed.prompt_chars()
            bound = self.tokenizer.min_tokens(chars)
            check_context(bound, max_new, default, limits, f" in {chars} characters")
            ids = await self._encode(parsed)
        if exact:
            check_context(len(ids), max_new, default, limits)
        return ids

    async def _encode(self, parsed: ParsedRequest) -> list[int]:
        text = render_chat(parsed.messages) if parsed.kind == "chat" else parsed.prompt_text or ""
        if not text:
            raise ApiError(400, "invalid_request", "'prompt' is empty; send at least one token")
        if len(text) <= INLINE_CHARS:
            return self.tokenizer.encode(text)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self.tokenizer.encode_nogil, text)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
