"""The `sim` engine: a virtual GPU's memory (weights, runtime, activations, KV, fragmentation)
and a cost model that says how long a scheduler step takes on a named SKU.

Memory is checked every step; going over capacity raises `CudaOutOfMemory`, whose message
reads like PyTorch's, and the replica dies on it the way a real one does.
"""

from __future__ import annotations

from dataclasses import dataclass

from server.engine.gpus import GpuSku, ModelCompute
from server.scheduler import ModelProfile

GIB = float(1 << 30)
MIB = float(1 << 20)


class CudaOutOfMemory(RuntimeError):
    """The virtual GPU went over capacity; `str()` is the line a real replica would log."""


@dataclass(frozen=True, slots=True)
class StepWork:
    """What one step asks of the GPU, in the units the cost model and memory need."""

    prefill_tokens: int
    decode_seqs: int
    decode_context_tokens: int  # sum over decoding sequences of their context length
    sampled_seqs: int  # sequences that sample a token this step (logits buffers)


class CostModel:
    """Step time for (SKU, model): prefill at a token rate; a decode step costs a fixed part
    (read the weights once, launch overhead) plus per-sequence and per-context-token terms
    (each context token's KV is read once per step)."""

    def __init__(self, sku: GpuSku, profile: ModelProfile, kv_bytes_per_token: float) -> None:
        params = profile.weights_bytes / profile.dtype_bytes
        self.prefill_tokens_per_s = sku.prefill_flops / (2.0 * params)
        self.fixed_s = profile.weights_bytes / sku.hbm_bytes_per_s + sku.launch_overhead_s
        self.per_seq_s = sku.per_seq_s
        self.per_context_token_s = kv_bytes_per_token / sku.hbm_bytes_per_s

    def step_seconds(self, work: StepWork) -> float:
        if work.prefill_tokens == 0 and work.decode_seqs == 0:
            return 0.0
        return (
            self.fixed_s
            + work.prefill_tokens / self.prefill_tokens_per_s
            + work.decode_seqs * self.per_seq_s
            + work.decode_context_tokens * self.per_context_token_s
        )

    def prefill_seconds(self, tokens: int) -> float:
        """A prompt prefilled alone, in one step (what the 3 s calibration refers to)."""
        return self.step_seconds(StepWork(tokens, 0, 0, 1))


class VirtualGpu:
    """Owns the device's memory accounting. Invariant: used_bytes <= total_bytes after every
    successful `run_step`; a step that would break it raises CudaOutOfMemory instead."""

    CATEGORIES = ("weights", "runtime", "activations", "kv_cache", "kv_fragmentation")

    def __init__(
        self,
        sku: GpuSku,
        profile: ModelProfile,
        compute: ModelCompute,
        kv_block_bytes: int,
    ) -> None:
        self.sku = sku
        self.total_bytes = sku.total_bytes
        self._compute = compute
        self._kv_block_bytes = kv_block_bytes
        self._used = dict.fromkeys(self.CATEGORIES, 0)
        self._used["weights"] = profile.weights_bytes
        self._used["runtime"] = sku.runtime_bytes
        base = profile.weights_bytes + sku.runtime_bytes
        if base > self.total_bytes:
            raise ValueError(
                f"model {profile.name} needs {base / GIB:.1f} GiB for weights and runtime, more "
                f"than {sku.name}'s {self.total_bytes / GIB:.1f} GiB; pick a bigger --gpu or a "
                f"smaller --model"
            )

    @property
    def used_bytes(self) -> int:
        return sum(self._used.values())

    def by_category(self) -> dict[str, int]:
        return dict(self._used)

    def free_after_weights(self) -> int:
        return self.total_bytes - self._used["weights"]

    def kv_bytes(self, blocks: int) -> int:
        return blocks * self._kv_block_bytes

    def run_step(self, work: StepWork, kv_blocks: int, fragmentation: float) -> None:
        """Account one step's memory: KV for `kv_blocks` allocated blocks (a `fragmentation`
        share of them unused) and the step's activation workspace."""
        activations = (
            work.prefill_tokens + work.decode_seqs
        ) * self._compute.activation_bytes_per_token
        activations += work.sampled_seqs * self._compute.logits_bytes_per_seq
        kv_total = kv_blocks * self._kv_block_bytes
        wasted = int(kv_total * min(max(fragmentation, 0.0), 1.0))
        before = self.used_bytes
        self._used["activations"] = activations
        self._used["kv_cache"] = kv_total - wasted
        self._used["kv_fragmentation"] = wasted
        used = self.used_bytes
        if used > self.total_bytes:
            free = max(self.total_bytes - before, 0)
            raise CudaOutOfMemory(
                f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                f"{(used - before) / GIB:.2f} GiB. GPU 0 has a total capacity of "
                f"{self.total_bytes / GIB:.2f} GiB of which {free / MIB:.2f} MiB is free. "
                f"Of the allocated memory {kv_total / GIB:.2f} GiB is KV cache "
                f"({kv_blocks} blocks) and {activations / GIB:.2f} GiB activations."
            )
