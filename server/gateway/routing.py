"""Choosing a replica: least committed KV (the ledger's tokens per replica), unless a replica
already holds this request's shared prefix and is not much busier than the least loaded."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

AFFINITY_ENTRIES = 4096  # prefixes remembered (LRU)
AFFINITY_SLACK_TOKENS = 65536  # prefer the prefix's replica unless it is this much busier


def prefix_key(tenant: str, public: bool, tokens: Sequence[int]) -> str:
    """Same key space as the replicas' prefix cache: public prefixes are shared by tenants."""
    owner = "public" if public else f"tenant:{tenant}"
    digest = hashlib.blake2b(repr(tuple(tokens)).encode(), digest_size=16).hexdigest()
    return f"{owner}:{digest}"


class Router:
    """Owns the prefix-affinity map (prefix key -> replica id, LRU-bounded)."""

    def __init__(self) -> None:
        self._affinity: OrderedDict[str, str] = OrderedDict()

    def pick(
        self, candidates: Sequence[str], committed: dict[str, int], prefix: str | None
    ) -> str | None:
        """A replica id from `candidates` (running replicas), or None when there are none."""
        if not candidates:
            return None
        least = min(candidates, key=lambda r: (committed.get(r, 0), r))
        if prefix is None:
            return least
        home = self._affinity.get(prefix)
        if home is not None and home in candidates:
            busier_by = committed.get(home, 0) - committed.get(least, 0)
            if busier_by <= AFFINITY_SLACK_TOKENS:
                self._affinity.move_to_end(prefix)
                return home
        self._affinity[prefix] = least
        self._affinity.move_to_end(prefix)
        while len(self._affinity) > AFFINITY_ENTRIES:
            self._affinity.popitem(last=False)
        return least
