"""A prompt's prefix blocks: the ids its record carries in `prompt_blocks`, so that a run of
kvgate's own traffic exports its prefix structure as a trace's `hash_ids` do.

The prompt's tokens (the tokens the workload aimed for, `target_prompt_tokens`) are cut into
blocks of `BLOCK_TOKENS`, the last one partial; each block's id hashes the id before it and
what the block holds, as vLLM's prefix-cache hashes chain, so two prompts carry an equal id
exactly as far as their prefixes are equal. What a block holds is described, not spelled
out: a prompt is a sequence of runs, each `length` tokens that its `key` determines (the
words drawn from one seed, or one piece of literal text), and a block is described by the
slices of runs it covers and where each message begins. Hashing those descriptions costs
a few microseconds a block, however long the text, so nothing needs caching.
"""

from __future__ import annotations

import hashlib
import math
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final

from contract.trace import MOONCAKE_BLOCK_TOKENS

# Mooncake's block size, which the tools that replay Mooncake traces assume; meta.json
# records it as `prompt_block_tokens`.
BLOCK_TOKENS: Final = MOONCAKE_BLOCK_TOKENS
_DIGEST_BYTES = 8  # 64-bit ids: a collision among a billion blocks has odds of about 3e-2


@dataclass(frozen=True, slots=True)
class Run:
    """`length` tokens that `key` determines: tokens [a, b) of two runs with the same key are
    the same tokens, wherever they stand."""

    key: str
    length: int


class PromptText(str):
    """Prompt text that knows what generated it: its `runs`, whose lengths add up to the
    text's tokens. It is a `str` everywhere else (bodies, JSON), so messages carry it as they
    carry any text; text built from it (an f-string, a join) is plain text again."""

    runs: tuple[Run, ...]

    def __new__(cls, text: str, runs: tuple[Run, ...]) -> PromptText:
        self = super().__new__(cls, text)
        self.runs = runs
        return self


def literal(text: str, tokens: int) -> PromptText:
    """`text` taken as `tokens` tokens that only this text gives (a server's reply, whose
    tokens kvgate counts but does not split)."""
    digest = hashlib.blake2b(text.encode(), digest_size=_DIGEST_BYTES).hexdigest()
    return PromptText(text, (Run(f"t{digest}:{len(text)}", tokens),))


def runs_of(content: str) -> tuple[Run, ...]:
    """The runs of a message's content; plain text is one literal run of its words (prompts
    are single-token words joined by single spaces)."""
    if isinstance(content, PromptText):
        return content.runs
    return literal(content, content.count(" ") + 1 if content else 0).runs


def prompt_block_ids(
    messages: Iterable[Mapping[str, str]], tokens: int, block_tokens: int = BLOCK_TOKENS
) -> tuple[str, ...]:
    """The ids of the prompt's blocks: `ceil(tokens / block_tokens)` of them, over the
    messages' runs cut or padded to `tokens`. Padding stands for tokens the messages do not
    describe, so it is unique to this prompt: no block is shared that cannot be shown equal."""
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be at least 1, not {block_tokens}")
    ids: list[str] = []
    previous = b""
    for block in _blocks(_pieces(messages, tokens), block_tokens):
        digest = hashlib.blake2b(previous + block.encode(), digest_size=_DIGEST_BYTES).digest()
        ids.append(digest.hex())
        previous = digest
    assert len(ids) == math.ceil(tokens / block_tokens), "blocks must cover the prompt"
    return tuple(ids)


def prompt_blocks(
    messages: Iterable[Mapping[str, str]], tokens: int, block_tokens: int = BLOCK_TOKENS
) -> str | None:
    """The record's `prompt_blocks`: the ids space-separated (None for an empty prompt)."""
    return " ".join(prompt_block_ids(messages, tokens, block_tokens)) or None


# A piece is a message's start (its role, no tokens) or a run with its length so far.
_Piece = tuple[str, int]


def _pieces(messages: Iterable[Mapping[str, str]], tokens: int) -> Iterator[_Piece]:
    """Each message's start, then its runs, up to `tokens`; then the padding, if any."""
    left = tokens
    for message in messages:
        if left <= 0:
            return
        yield f"<{message.get('role', '')}>", 0
        for run in runs_of(message.get("content", "")):
            take = min(run.length, left)
            if take > 0:
                yield run.key, take
                left -= take
    if left > 0:
        yield f"?{uuid.uuid4().hex}", left


def _blocks(pieces: Iterator[_Piece], block_tokens: int) -> Iterator[str]:
    """Each block's description: the message starts and run slices `key[a:b]` it holds."""
    parts: list[str] = []
    room = block_tokens
    for key, length in pieces:
        if length == 0:
            parts.append(key)
            continue
        start = 0
        while start < length:
            take = min(room, length - start)
            parts.append(f"{key}[{start}:{start + take}]")
            start += take
            room -= take
            if room == 0:
                yield "|".join(parts)
                parts, room = [], block_tokens
    if room < block_tokens:
        yield "|".join(parts)
