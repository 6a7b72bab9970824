"""Prompt text for a trace's block ids: each id is one block of words that only it gives.

A trace has no text, only the ids of its prompts' blocks. `BlockText` makes the text: the
words of block `h` are drawn from a seed that `h` (and the run's seed) alone determines, so
equal ids are equal text and a server's prefix cache sees the reuse the trace had. Words
are single tokens for the reference tokenizer (prompts.py), so a block of n words is n
tokens, wherever it stands in the prompt; `check` proves it on the tokenizer itself.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from workloads.prompts import PromptGenerator

CACHE_BLOCKS: Final = 8192  # full blocks' text kept (a few MB): a session's blocks come back
CHECK_BLOCKS: Final = 4  # blocks tokenized together to check the block size


class BlockTextError(ValueError):
    """Block text that does not tokenize to its block size: the prefix structure would be off."""


@dataclass(frozen=True, slots=True)
class BlockCheck:
    """What `BlockText.check` found: tokens counted for `blocks` blocks of `block_tokens`."""

    blocks: int
    block_tokens: int
    counted: int | None  # None: no tokenizer to count with

    @property
    def exact(self) -> bool | None:
        return None if self.counted is None else self.counted == self.blocks * self.block_tokens


class BlockText:
    """Owns the text of every block id for one run. Invariant: `prompt(ids, n)` is n tokens
    (when the generator is exact), and two prompts agree on their text exactly as far as
    their ids agree."""

    def __init__(self, generator: PromptGenerator, block_tokens: int, seed: int) -> None:
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be at least 1, not {block_tokens}")
        self.generator = generator
        self.block_tokens = block_tokens
        self.seed = seed
        self._cache: OrderedDict[int, str] = OrderedDict()

    def block(self, hash_id: int) -> str:
        """The whole block's text (cached)."""
        text = self._cache.get(hash_id)
        if text is not None:
            self._cache.move_to_end(hash_id)
            return text
        text = str(self.generator.text(self.block_tokens, self._seed(hash_id)))
        self._cache[hash_id] = text
        if len(self._cache) > CACHE_BLOCKS:
            self._cache.popitem(last=False)
        return text

    def prompt(self, hash_ids: Sequence[int], tokens: int) -> str:
        """`tokens` tokens: the blocks in order, the last one cut to what is left."""
        if tokens > len(hash_ids) * self.block_tokens or tokens < 1:
            raise ValueError(
                f"{len(hash_ids)} blocks of {self.block_tokens} tokens cannot hold {tokens} tokens"
            )
        full, last = divmod(tokens, self.block_tokens)
        parts = [self.block(h) for h in hash_ids[:full]]
        if last:
            words = self.block(hash_ids[full]).split(" ", last)
            parts.append(" ".join(words[:last]))
        return " ".join(parts)

    def check(self, hash_ids: Sequence[int]) -> BlockCheck:
        """Tokenizes the first CHECK_BLOCKS blocks of `hash_ids` as one prompt; raises
        BlockTextError when they are not exactly their size in tokens."""
        ids = list(hash_ids[:CHECK_BLOCKS])
        tokens = len(ids) * self.block_tokens
        counted = self.generator.count(self.prompt(ids, tokens)) if ids else None
        found = BlockCheck(len(ids), self.block_tokens, counted)
        if found.exact is False:
            raise BlockTextError(
                f"{len(ids)} blocks of {self.block_tokens} tokens tokenize to {counted} tokens "
                f"with {self.generator.tokenizer_path}: a replay's prompts would not share "
                "blocks as the trace's do; use the reference tokenizer, or a tokenizer whose "
                "single-token words prompts.py finds"
            )
        return found

    def _seed(self, hash_id: int) -> int:
        """A seed of the run's and the id's own: no other prompt's words come from it."""
        key = f"trace-block:{self.seed}:{hash_id}".encode()
        return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")
