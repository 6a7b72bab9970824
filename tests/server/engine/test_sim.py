"""The sim engine: cost model calibration and the virtual GPU's memory accounting."""

from __future__ import annotations

import pytest

from server.engine.gpus import GPUS, get_gpu, get_model_compute
from server.engine.sim import CostModel, CudaOutOfMemory, StepWork, VirtualGpu
from server.scheduler import PROFILES, SchedulerConfig

LLAMA8 = PROFILES["llama-3-8b"]
BLOCK_BYTES = SchedulerConfig().block_bytes


def test_32k_prefill_on_h100_is_near_3_seconds() -> None:
    cost = CostModel(get_gpu("h100-80gb"), LLAMA8, LLAMA8.kv_bytes_per_token)
    assert 2.7 <= cost.prefill_seconds(32768) <= 3.3


def test_h200_is_faster_and_bigger_than_h100() -> None:
    h100, h200 = get_gpu("h100-80gb"), get_gpu("h200-141gb")
    work = StepWork(
        prefill_tokens=0, decode_seqs=64, decode_context_tokens=64 * 2048, sampled_seqs=64
    )
    c100 = CostModel(h100, LLAMA8, LLAMA8.kv_bytes_per_token)
    c200 = CostModel(h200, LLAMA8, LLAMA8.kv_bytes_per_token)
    assert c200.step_seconds(work) < c100.step_seconds(work)
    assert h200.total_bytes > 1.7 * h100.total_bytes


def test_decode_step_grows_with_sequences_and_context() -> None:
    cost = CostModel(get_gpu("h100-80gb"), LLAMA8, LLAMA8.kv_bytes_per_token)
    base = cost.step_seconds(StepWork(0, 1, 100, 1))
    more_seqs = cost.step_seconds(StepWork(0, 100, 100, 100))
    more_ctx = cost.step_seconds(StepWork(0, 1, 1_000_000, 1))
    assert base > 0.004  # reading 16 GB of weights at 3.35 TB/s is the floor
    assert more_seqs > base and more_ctx > base
    assert cost.step_seconds(StepWork(0, 0, 0, 0)) == 0.0


def _gpu() -> VirtualGpu:
    return VirtualGpu(get_gpu("h100-80gb"), LLAMA8, get_model_compute("llama-3-8b"), BLOCK_BYTES)


def test_memory_categories_add_up() -> None:
    gpu = _gpu()
    gpu.run_step(StepWork(8192, 0, 0, 1), kv_blocks=1000, fragmentation=0.25)
    cats = gpu.by_category()
    assert set(cats) == set(VirtualGpu.CATEGORIES)
    assert cats["weights"] == LLAMA8.weights_bytes
    assert cats["kv_cache"] + cats["kv_fragmentation"] == 1000 * BLOCK_BYTES
    assert cats["kv_fragmentation"] == pytest.approx(0.25 * 1000 * BLOCK_BYTES, rel=1e-6)
    assert cats["activations"] > 0
    assert gpu.used_bytes == sum(cats.values()) <= gpu.total_bytes


def test_seed_pool_fits_and_all_free_memory_does_not() -> None:
    gpu = _gpu()
    seed_blocks = SchedulerConfig().pool_blocks()
    gpu.run_step(StepWork(8192, 256, 256 * 4096, 256), seed_blocks, 0.0)  # full seed pool: ok
    naive_blocks = gpu.free_after_weights() // BLOCK_BYTES
    with pytest.raises(CudaOutOfMemory, match="CUDA out of memory"):
        gpu.run_step(StepWork(0, 1, 1, 1), naive_blocks, 0.0)


def test_model_too_big_for_gpu_is_refused() -> None:
    with pytest.raises(ValueError, match="pick a bigger --gpu"):
        VirtualGpu(
            get_gpu("h100-80gb"),
            PROFILES["llama-3-70b"],
            get_model_compute("llama-3-70b"),
            BLOCK_BYTES,
        )


def test_unknown_names_list_the_known_ones() -> None:
    with pytest.raises(KeyError, match="h100-80gb"):
        get_gpu("tpu-v9")
    assert {"h100-80gb", "h200-141gb"} <= set(GPUS)
