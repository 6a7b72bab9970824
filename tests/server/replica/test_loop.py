"""The step loop in-process: streams run to completion, cancels release at once, and a
stream the scheduler dropped is not left hanging."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from server.engine.sim import StepWork
from server.replica import mutants
from server.replica.__main__ import parse_args
from server.replica.loop import IDLE_WORK
from server.replica.runtime import ReplicaRuntime
from server.replica.streams import Stream, StreamSpec
from server.scheduler import Decision, Priority, SchedulerConfig, SeqRequest, SeqState
from tests.server.replica.test_streams import FakeTransport
from tests.waiting import wait_until_async


def _runtime(tmp_path: Path, *flags: str) -> ReplicaRuntime:
    args = parse_args(["--state-dir", str(tmp_path), "--time-scale", "0.01", *flags])
    return ReplicaRuntime(args)


def _submit(rt: ReplicaRuntime, rid: str, max_tokens: int) -> tuple[Stream, FakeTransport]:
    spec = StreamSpec(
        rid, "acme", Priority.INTERACTIVE, "chat", rt.model_name, True, False, False, 20, True
    )
    stream = Stream(spec, rt.tokenizer.output_json)
    req = SeqRequest(rid, "acme", Priority.INTERACTIVE, tuple(range(100, 120)), max_tokens)
    assert rt.loop.submit(stream, req).outcome is Decision.ADMIT
    transport = FakeTransport()
    stream.attach(transport)
    return stream, transport


def test_streams_run_to_completion(tmp_path: Path) -> None:
    async def go() -> None:
        rt = _runtime(tmp_path)
        rt.loop.start()
        streams = [_submit(rt, f"r{i}", 5 + i) for i in range(3)]
        await asyncio.wait_for(asyncio.gather(*(s.wait_done() for s, _ in streams)), 10)
        await rt.loop.stop()
        for i, (s, t) in enumerate(streams):
            assert s.emitted == 5 + i and t.data.count(b'"delta":{"content"') == 5 + i
            assert t.data.endswith(b"data: [DONE]\n\n\r\n")
        assert rt.loop.streams == {} and rt.loop.tenant_reserved == {}
        assert rt.loop.stats.token_events == 18 and rt.loop.stats.steps > 0
        kinds = [e for _, e in _events(rt)]
        assert kinds.count("finished") == 3 and kinds.count("released") == 3

    asyncio.run(go())


def test_cancel_releases_now_and_sweep_cuts_dropped(tmp_path: Path) -> None:
    async def go() -> None:
        rt = _runtime(tmp_path)
        kept, _ = _submit(rt, "keep", 50)
        gone, _ = _submit(rt, "gone", 50)
        rt.loop.cancel(gone)
        assert gone.aborted and "gone" not in rt.loop.streams
        assert ("gone", "released") in _events(rt)
        # Admitted at submit (no queueing): the sweep must know it started and cut it. A
        # stream taken for queued got a refusal its handler, already streaming, never read.
        assert kept.admitted.done()
        rt.scheduler.cancel("keep")  # the scheduler lets go behind the loop's back
        rt.loop._sweep()
        assert kept.aborted and rt.loop.streams == {}
        await asyncio.wait_for(kept.wait_done(), 10)  # its handler wakes and cuts the body

    asyncio.run(go())


@pytest.mark.parametrize("mutant", [None, "slow_release"])
def test_only_slow_release_frees_a_cancelled_request_late(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mutant: str | None
) -> None:
    monkeypatch.setattr(mutants, "SLOW_RELEASE_S", 0.2)
    released: list[float] = []

    async def go() -> None:
        rt = _runtime(tmp_path, *(["--mutant", mutant] if mutant else []))
        rt.loop._on_release = released.append
        gone, _ = _submit(rt, "gone", 50)
        rt.loop.cancel(gone)
        assert gone.aborted and "gone" not in rt.loop.streams  # the stream ends at once
        if mutant is None:
            assert ("gone", "released") in _events(rt) and len(released) == 1
            return
        # Its blocks are still held, and the release-latency histogram never hears of it.
        assert ("gone", "released") not in _events(rt) and released == []
        assert rt.scheduler.state("gone") is SeqState.RUNNING
        await wait_until_async(lambda: ("gone", "released") in _events(rt), what="release")
        assert rt.scheduler.state("gone") is SeqState.FINISHED and released == []

    asyncio.run(go())


def _events(rt: ReplicaRuntime) -> list[tuple[str, str]]:
    body, _ = rt.events.read_after(-1)
    rows = [json.loads(line) for line in body.splitlines()]
    return [(r["request_id"], r["event"]) for r in rows]


def test_kv_actual_factor_scales_what_the_gpu_charges(tmp_path: Path) -> None:
    async def go() -> tuple[int, int]:
        plain = _runtime(tmp_path / "a")
        args = parse_args(["--state-dir", str(tmp_path / "b"), "--kv-actual-factor", "1.5"])
        biased = ReplicaRuntime(args)
        return plain.gpu.kv_bytes(100), biased.gpu.kv_bytes(100)

    plain, biased = asyncio.run(go())
    assert plain == 100 * _runtime_block_bytes()
    assert biased == pytest.approx(1.5 * plain, rel=1e-4)


def _runtime_block_bytes() -> int:
    return SchedulerConfig().block_bytes


def test_idle_gpu_holds_no_activations(tmp_path: Path) -> None:
    """After load the virtual GPU goes back to weights + runtime: the last busy step's
    workspace must not linger as memory that never came back."""

    async def go() -> None:
        rt = _runtime(tmp_path)
        idle = rt.loop.gpu.used_bytes
        steps: list[StepWork] = []
        run_step = rt.loop.gpu.run_step

        def recording_run_step(work: StepWork, kv_blocks: int, fragmentation: float) -> None:
            steps.append(work)
            run_step(work, kv_blocks, fragmentation)

        rt.loop.gpu.run_step = recording_run_step  # type: ignore[method-assign]  # a spy
        rt.loop.start()
        streams = [_submit(rt, f"m{i}", 8) for i in range(4)]
        await asyncio.wait_for(asyncio.gather(*(s.wait_done() for s, _ in streams)), 10)
        busy_peak_seen = rt.loop.gpu.by_category()
        done_at = len(steps)
        await wait_until_async(
            lambda: IDLE_WORK in steps[done_at:], what="an idle tick after the last stream"
        )
        after = rt.loop.gpu.by_category()
        await rt.loop.stop()
        assert busy_peak_seen["weights"] == after["weights"]
        assert after["activations"] == 0 and after["kv_cache"] == 0
        assert rt.loop.gpu.used_bytes == idle

    asyncio.run(go())
