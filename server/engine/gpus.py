"""Named virtual GPUs (SKUs) and the per-model constants the simulator's cost model needs.

Numbers are public datasheet figures turned into effective rates: memory as nvidia-smi
reports it, HBM bandwidth for decode (weight and KV reads), and an effective prefill FLOP
rate calibrated so a 32K-token Llama-3-8B prefill on an H100-80GB takes about 3 s.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class GpuSku:
    """One GPU model: capacity and the effective rates the cost model uses."""

    name: str
    total_bytes: int
    hbm_bytes_per_s: float  # decode reads weights and KV at this rate
    prefill_flops: float  # effective dense bf16 FLOP/s during prefill (not the peak)
    launch_overhead_s: float  # per decode step: kernel launches, sampling, scheduling glue
    per_seq_s: float  # per sequence in a decode step (sampling, metadata)
    runtime_bytes: int  # CUDA context, cuBLAS/NCCL workspaces: present whenever the model is


GPUS: dict[str, GpuSku] = {
    g.name: g
    for g in (
        GpuSku("h100-80gb", 81559 * MIB, 3.35e12, 1.75e14, 1.5e-3, 25e-6, 1024 * MIB),
        GpuSku("h200-141gb", 143771 * MIB, 4.8e12, 1.85e14, 1.5e-3, 25e-6, 1024 * MIB),
        GpuSku("a100-80gb", 81920 * MIB, 2.0e12, 1.0e14, 2.0e-3, 30e-6, 1024 * MIB),
    )
}


@dataclass(frozen=True, slots=True)
class ModelCompute:
    """Per-model activation sizes (bf16): per batched token, and logits per sampled sequence."""

    activation_bytes_per_token: int  # peak intermediates of one token through a layer's MLP
    logits_bytes_per_seq: int  # vocab x fp32 for the one position each sequence samples


# (hidden x 4 + intermediate x 3) x 2 bytes; vocab x 4 bytes.
MODEL_COMPUTE: dict[str, ModelCompute] = {
    "llama-3-8b": ModelCompute((4096 * 4 + 14336 * 3) * 2, 128256 * 4),
    "llama-3-70b": ModelCompute((8192 * 4 + 28672 * 3) * 2, 128256 * 4),
    "qwen2.5-7b": ModelCompute((3584 * 4 + 18944 * 3) * 2, 152064 * 4),
}


def get_gpu(name: str) -> GpuSku:
    """The SKU called `name`; a KeyError naming the known SKUs otherwise."""
    try:
        return GPUS[name]
    except KeyError:
        raise KeyError(f"unknown GPU {name!r}; known GPUs: {', '.join(sorted(GPUS))}") from None


def get_model_compute(model: str) -> ModelCompute:
    try:
        return MODEL_COMPUTE[model]
    except KeyError:
        known = ", ".join(sorted(MODEL_COMPUTE))
        raise KeyError(f"no compute constants for model {model!r}; known: {known}") from None
