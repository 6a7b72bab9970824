"""A trace's window becomes a replay's schedule (workloads/sources/trace.py): scaled in time
and tokens with its prefix structure kept, limited with every clip and skip counted, and
each request matched to the first rule that fits."""

from __future__ import annotations

from contract.trace import Trace, TraceFormat, TraceRequest
from workloads.sources import TRACE_FORMATS
from workloads.sources.trace import OverMax, Rule, Scaling, build_schedule

ANYONE = Rule("short_qa", "acme", "interactive", "kvg-acme-key")


def trace(*requests: TraceRequest, block_tokens: int | None = 512) -> Trace:
    return Trace(tuple(requests), TraceFormat.MOONCAKE, block_tokens, "test")


def test_both_public_formats_are_registered() -> None:
    assert {"mooncake", "azure"} <= set(TRACE_FORMATS)


def test_time_and_tokens_scale_and_blocks_keep_their_count() -> None:
    t = trace(
        TraceRequest(0.0, 1000, 100, (0, 1)),
        TraceRequest(2.0, 1536, 10, (0, 1, 2)),
    )
    replay = build_schedule(t, Scaling(time_scale=0.5, token_scale=0.25), [ANYONE])
    assert replay.block_tokens == 128
    first, second = replay.requests
    assert (first.at_s, second.at_s) == (0.0, 1.0)
    # 512 + 488 tokens: one full block of 128, then the partial one scaled (122)
    assert (first.input_tokens, first.output_tokens) == (128 + 122, 25)
    assert (second.input_tokens, second.output_tokens) == (3 * 128, 2)
    assert second.hash_ids == (0, 1, 2)


def test_the_window_starts_at_its_first_request() -> None:
    t = trace(*(TraceRequest(float(s), 10, 1, (s,)) for s in range(10)))
    replay = build_schedule(t, Scaling(start_s=2.5, duration_s=4.0), [ANYONE])
    assert [r.index for r in replay.requests] == [3, 4, 5, 6]
    assert [r.at_s for r in replay.requests] == [0.0, 1.0, 2.0, 3.0]
    assert replay.in_window == 4 and replay.span_s == 3.0


def test_over_the_limit_requests_are_clipped_to_their_leading_blocks_and_counted() -> None:
    t = trace(TraceRequest(0.0, 2000, 5, (0, 1, 2, 3)), TraceRequest(1.0, 100, 5, (0,)))
    replay = build_schedule(t, Scaling(max_input_tokens=1024), [ANYONE])
    clipped = replay.requests[0]
    assert (clipped.input_tokens, clipped.hash_ids, clipped.clipped) == (1024, (0, 1), True)
    assert (replay.clipped, replay.skipped) == (1, 0)


def test_skipping_leaves_them_out_and_counts_them() -> None:
    t = trace(TraceRequest(0.0, 2000, 5, (0, 1, 2, 3)), TraceRequest(1.0, 100, 5, (0,)))
    replay = build_schedule(t, Scaling(max_input_tokens=1024, over_max=OverMax.SKIP), [ANYONE])
    assert [r.index for r in replay.requests] == [1]
    assert (replay.clipped, replay.skipped) == (0, 1)
    assert replay.requests[0].at_s == 0.0


def test_the_first_matching_rule_decides_and_sessions_stay_together() -> None:
    long = Rule("long_context", "globex", "batch", "kvg-globex-key", min_input_tokens=4096)
    some = Rule("short_qa", "initech", "interactive", "k", sessions=(0.0, 0.5))
    requests = [TraceRequest(float(i), 100, 5, (i % 20, 100 + i)) for i in range(200)]
    requests.append(TraceRequest(300.0, 5000, 5, tuple(range(1000, 1010))))
    replay = build_schedule(trace(*requests), Scaling(), [long, some, ANYONE])
    assert replay.requests[-1].rule == 0
    by_session: dict[int, set[int]] = {}
    for r in replay.requests[:-1]:
        by_session.setdefault(r.hash_ids[0], set()).add(r.rule)
    assert all(len(rules) == 1 for rules in by_session.values())  # a session is one caller
    assert {next(iter(rules)) for rules in by_session.values()} == {1, 2}  # both get some


def test_requests_no_rule_matches_are_counted_not_sent() -> None:
    only_long = Rule("long_context", "globex", "batch", "k", min_input_tokens=4096)
    replay = build_schedule(trace(TraceRequest(0.0, 100, 5, (0,))), Scaling(), [only_long])
    assert replay.requests == () and replay.unmatched == 1


def test_the_prefix_reuse_the_trace_implies_counts_tokens_in_blocks_seen_before() -> None:
    t = trace(
        TraceRequest(0.0, 1024, 1, (0, 1)),
        TraceRequest(1.0, 1024 + 100, 1, (0, 1, 2)),  # 1024 of 1124 seen
        TraceRequest(2.0, 700, 1, (0, 3)),  # 512 of 700 seen
    )
    replay = build_schedule(t, Scaling(), [ANYONE])
    assert replay.prefix_reuse() == (1024 + 512) / (1024 + 1124 + 700)


def test_a_trace_without_blocks_scales_its_lengths_only() -> None:
    t = Trace((TraceRequest(0.0, 1000, 100),), TraceFormat.AZURE, None, "azure")
    replay = build_schedule(t, Scaling(token_scale=0.5), [ANYONE])
    assert replay.block_tokens is None and replay.prefix_reuse() is None
    assert (replay.requests[0].input_tokens, replay.requests[0].hash_ids) == (500, ())
