"""A trace turned into a replay's schedule: which requests go out, when, how long, as whom.

`build_schedule` takes a window of the trace, scales its clock (`time_scale`) and its token
counts (`token_scale`), applies the input limit (clip or skip, counted), and gives every
request the first rule that matches it (traffic class, tenant, priority). Scaling keeps the
prefix structure: every block shrinks alike, so the scaled trace still has one block size
and its requests share exactly the blocks they shared before.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from contract.trace import Trace, TraceRequest

_SESSION_SPACE = float(2**64)


class OverMax(StrEnum):
    """What a request whose input passes `max_input_tokens` becomes."""

    CLIP = "clip"  # its input is cut to the limit (its leading blocks kept)
    SKIP = "skip"  # it is not sent


@dataclass(frozen=True, slots=True)
class Rule:
    """Who sends the requests it matches. It matches when every condition given holds:
    the input (after scaling) within [min_input_tokens, max_input_tokens], and the request's
    session (its first `session_blocks` block ids, hashed onto [0, 1)) within `sessions`."""

    traffic_class: str
    tenant: str
    priority: str
    api_key: str
    api_key_name: str | None = None
    public_prefix: bool = False
    min_input_tokens: int | None = None
    max_input_tokens: int | None = None
    sessions: tuple[float, float] | None = None

    def matches(self, input_tokens: int, session: float) -> bool:
        if self.min_input_tokens is not None and input_tokens < self.min_input_tokens:
            return False
        if self.max_input_tokens is not None and input_tokens > self.max_input_tokens:
            return False
        return self.sessions is None or self.sessions[0] <= session < self.sessions[1]


@dataclass(frozen=True, slots=True)
class ScheduledRequest:
    """One request of the replay: sent `at_s` seconds after the replay's start."""

    index: int  # its line in the trace, from 0
    at_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]  # the blocks its (scaled, clipped) input covers
    rule: int  # the index of the rule it matched
    clipped: bool = False


@dataclass(frozen=True, slots=True)
class Schedule:
    """A replay's requests in send order, and what the window, the scaling and the input
    limit did. `block_tokens` is the scaled block size (None: the trace has no blocks)."""

    requests: tuple[ScheduledRequest, ...]
    block_tokens: int | None
    in_window: int  # the trace's requests in the window, before the limit
    clipped: int
    skipped: int
    unmatched: int  # requests no rule matched: not sent

    @property
    def span_s(self) -> float:
        """Seconds from the replay's start to its last send."""
        return self.requests[-1].at_s if self.requests else 0.0

    def prefix_reuse(self) -> float | None:
        """The share of the prompt tokens sent that lie in a block an earlier request of the
        replay had sent: the prefix-cache hits an unbounded cache, shared by all, would see.
        None without blocks."""
        if self.block_tokens is None or not self.requests:
            return None
        seen: set[int] = set()
        reused = total = 0
        for r in self.requests:
            total += r.input_tokens
            for i, block in enumerate(r.hash_ids):
                if block in seen:
                    reused += min(self.block_tokens, r.input_tokens - i * self.block_tokens)
            seen.update(r.hash_ids)
        return reused / total if total else None


@dataclass(frozen=True, slots=True)
class Scaling:
    """How a trace's window becomes a replay (what a plan's `traffic.trace` sets)."""

    start_s: float = 0.0  # the window's start, in trace seconds
    duration_s: float | None = None  # the window's length in trace seconds; None: to the end
    time_scale: float = 1.0  # replay seconds per trace second (0.5: twice as fast)
    token_scale: float = 1.0  # replay tokens per trace token, input and output
    max_input_tokens: int | None = None  # after scaling; None: no limit
    over_max: OverMax = OverMax.CLIP
    session_blocks: int = 1  # leading block ids that name a request's session


def build_schedule(trace: Trace, scaling: Scaling, rules: Sequence[Rule]) -> Schedule:
    """The replay of `trace`'s window under `scaling`, each request matched to `rules`
    (the first that matches; a request none matches is counted and not sent)."""
    end = math.inf if scaling.duration_s is None else scaling.start_s + scaling.duration_s
    block = _scaled_block(trace.block_tokens, scaling.token_scale)
    kept: list[ScheduledRequest] = []
    in_window = clipped = skipped = unmatched = 0
    for index, request in enumerate(trace.requests):
        if not scaling.start_s <= request.t_s < end:
            continue
        in_window += 1
        tokens = _scaled_input(request, trace.block_tokens, block, scaling.token_scale)
        ids = request.hash_ids
        limit = scaling.max_input_tokens
        over = limit is not None and tokens > limit
        if over and scaling.over_max is OverMax.SKIP:
            skipped += 1
            continue
        if over:
            assert limit is not None
            tokens = limit
            ids = ids[: math.ceil(limit / block)] if block else ids
            clipped += 1
        session = _session(ids[: scaling.session_blocks] if ids else (index,))
        rule = next((i for i, r in enumerate(rules) if r.matches(tokens, session)), None)
        if rule is None:
            unmatched += 1
            continue
        output = max(1, round(request.output_tokens * scaling.token_scale))
        at_s = (request.t_s - scaling.start_s) * scaling.time_scale
        kept.append(ScheduledRequest(index, at_s, tokens, output, ids, rule, over))
    if kept:
        origin = kept[0].at_s  # the replay starts with its window's first request
        kept = [_shifted(r, origin) for r in kept]
    return Schedule(tuple(kept), block, in_window, clipped, skipped, unmatched)


def _scaled_block(block_tokens: int | None, token_scale: float) -> int | None:
    return None if block_tokens is None else max(1, round(block_tokens * token_scale))


def _scaled_input(
    request: TraceRequest, block_tokens: int | None, block: int | None, token_scale: float
) -> int:
    """The input scaled so that it still fills exactly as many blocks as before: every full
    block becomes `block` tokens, the last (partial) one its own length scaled."""
    if block is None or block_tokens is None or not request.hash_ids:
        return max(1, round(request.input_tokens * token_scale))
    full = len(request.hash_ids) - 1
    last = request.input_tokens - full * block_tokens
    return full * block + min(block, max(1, round(last * token_scale)))


def _session(ids: Sequence[int]) -> float:
    """A session's place on [0, 1): the same for the same leading ids, spread evenly."""
    digest = hashlib.blake2b(repr(tuple(ids)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / _SESSION_SPACE


def _shifted(r: ScheduledRequest, origin: float) -> ScheduledRequest:
    return ScheduledRequest(
        r.index, r.at_s - origin, r.input_tokens, r.output_tokens, r.hash_ids, r.rule, r.clipped
    )
