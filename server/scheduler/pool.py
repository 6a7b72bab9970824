"""The KV block pool: per-block reference counts, a prefix cache, and O(1) LRU reclaim.

Blocks are ids 0..n-1. A block is *in use* while its ref count is above zero. A block at ref
count zero is free; if it still holds a cached prefix it sits in the cold LRU (oldest first)
and is reclaimed, dropping its cache entry, only when no plain free block is left.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence as Seq

from server.scheduler.types import PrefixSpec


def prefix_block_keys(
    tenant: str, spec: PrefixSpec, prompt: Seq[int], block_tokens: int
) -> list[bytes]:
    """Chained cache keys of the prefix's full blocks, each covering every token before it.

    The namespace carries model, tokenizer, adapter and chat template; a private prefix also
    carries tenant and permission version, so it can only ever hit for that tenant.
    """
    scope: tuple[str, ...]
    if spec.public:
        scope = ("public", spec.model, spec.tokenizer, spec.adapter, spec.chat_template)
    else:
        scope = (
            "private",
            tenant,
            str(spec.permission_version),
            spec.model,
            spec.tokenizer,
            spec.adapter,
            spec.chat_template,
        )
    key = hashlib.sha256("\x1f".join(scope).encode()).digest()
    keys = []
    for i in range(min(spec.length, len(prompt)) // block_tokens):
        chunk = prompt[i * block_tokens : (i + 1) * block_tokens]
        key = hashlib.sha256(key + ",".join(map(str, chunk)).encode()).digest()
        keys.append(key)
    return keys


class BlockPool:
    """Owns every block's ref count and the prefix cache.

    Invariants: 0 <= ref count; a block is in exactly one of {in use, plain free, cold LRU};
    a block carrying a cache key is reachable from the cache under that key; a cached block is
    freed (its cache entry dropped) only at ref count zero.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"a block pool needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self._ref = [0] * num_blocks
        self._key: list[bytes | None] = [None] * num_blocks
        self._plain: list[int] = list(range(num_blocks - 1, -1, -1))
        self._cold: OrderedDict[int, None] = OrderedDict()  # LRU first
        self._cache: dict[bytes, int] = {}
        self.used = 0
        self.cold_evictions = 0
        self.queries = 0
        self.hits = 0

    @property
    def free(self) -> int:
        """Blocks allocatable now (plain free plus cold cached)."""
        return len(self._plain) + len(self._cold)

    @property
    def cold(self) -> int:
        return len(self._cold)

    def ref_count(self, block: int) -> int:
        return self._ref[block]

    def allocate(self) -> int:
        """One block at ref count 1; reclaims the least recently used cold block if needed."""
        if self._plain:
            block = self._plain.pop()
        else:
            block, _ = self._cold.popitem(last=False)
            key = self._key[block]
            assert key is not None, "a cold block must carry a cache key"
            del self._cache[key]
            self._key[block] = None
            self.cold_evictions += 1
        self._ref[block] = 1
        self.used += 1
        return block

    def release(self, blocks: Seq[int]) -> int:
        """Drop one reference from each block; returns how many became free."""
        freed = 0
        for block in blocks:
            ref = self._ref[block] - 1
            assert ref >= 0, f"block {block} released more often than referenced"
            self._ref[block] = ref
            if ref == 0:
                freed += 1
                if self._key[block] is None:
                    self._plain.append(block)
                else:
                    self._cold[block] = None
        self.used -= freed
        return freed

    def peek(self, keys: Seq[bytes]) -> tuple[int, int]:
        """(blocks that would hit, of which already in use) without taking references."""
        hit = live = 0
        for key in keys:
            block = self._cache.get(key)
            if block is None:
                break
            hit += 1
            live += self._ref[block] > 0
        return hit, live

    def acquire_prefix(self, keys: Seq[bytes]) -> list[int]:
        """Take a reference on the longest cached run of `keys`; returns those blocks."""
        self.queries += 1
        blocks = []
        for key in keys:
            block = self._cache.get(key)
            if block is None:
                break
            if self._ref[block] == 0:
                del self._cold[block]
                self.used += 1
            self._ref[block] += 1
            blocks.append(block)
        if blocks:
            self.hits += 1
        return blocks

    def register(self, block: int, key: bytes) -> None:
        """Publish a computed, referenced block under `key` (first writer wins; no dedupe,
        so block tables stay append-only)."""
        assert self._ref[block] > 0, "only a referenced block can be published"
        if key not in self._cache and self._key[block] is None:
            self._cache[key] = block
            self._key[block] = key

    def check(self) -> None:
        """Full consistency check (tests only; O(blocks))."""
        assert all(r >= 0 for r in self._ref)
        in_use = sum(1 for r in self._ref if r > 0)
        assert in_use == self.used <= self.num_blocks
        assert in_use + len(self._plain) + len(self._cold) == self.num_blocks
        assert all(self._ref[b] == 0 and self._key[b] is not None for b in self._cold)
        assert all(self._ref[b] == 0 and self._key[b] is None for b in self._plain)
        assert all(self._key[b] == k for k, b in self._cache.items())
