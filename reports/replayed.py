"""A replayed trace in one sentence, from meta.json's `replay`: what was planned and what
went out, how punctually, the prefix reuse the server saw beside the trace's own, and what
the load generator spent. `kvgate run` prints it when the load ends; summary.md and
report.html carry it under the verdict, where a release manager reads whether the replay
was the production traffic it claims to be.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _share(value: Any) -> str:
    return "-" if value is None else f"{value:.1%}"


def replay_sentence(meta: Mapping[str, Any]) -> str | None:
    """The sentence, None for a run that replayed no trace."""
    replay = meta.get("replay")
    if not isinstance(replay, dict):
        return None
    late = replay.get("schedule_error_ms") or {}
    timing = (
        f"schedule error p50 {late['p50']:.1f} ms, p99 {late['p99']:.1f} ms, max "
        f"{late['max']:.0f} ms (bound {replay.get('schedule_error_bound_ms'):g} ms at p99)"
        if late
        else "no request sent"
    )
    reuse = _share(replay.get("prefix_reuse_server")), _share(replay.get("prefix_reuse_trace"))
    said = (
        f"replay: {replay.get('sent')} of {replay.get('scheduled')} requests sent "
        f"({replay.get('unsent')} unsent, {replay.get('stragglers')} still running at the "
        f"end), {replay.get('clipped')} clipped, {replay.get('skipped')} skipped; {timing}; "
        f"prefix reuse server/trace {reuse[0]} / {reuse[1]}"
    )
    cpu = replay.get("load_generator_cpu_cores_mean"), replay.get("load_generator_cpu_cores_max")
    if cpu[0] is not None and cpu[1] is not None:
        said += f"; load generator {cpu[0]:.2f} cores on average, {cpu[1]:.2f} at most"
    return said
