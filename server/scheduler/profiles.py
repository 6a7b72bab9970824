"""Model profiles: the shape facts that turn a token count into KV-cache bytes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """Architecture numbers of one model; KV bytes per token follow from them alone."""

    name: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    max_context: int
    weights_bytes: int

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V, for every layer and KV head, at the cache dtype."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


# Context limits follow the Llama-3.1 generation (128K) and Qwen2.5's native 32K window;
# weights are parameters x 2 bytes (bf16).
PROFILES: dict[str, ModelProfile] = {
    p.name: p
    for p in (
        ModelProfile("llama-3-8b", 32, 8, 128, 2, 131072, 16_060_522_496),
        ModelProfile("llama-3-70b", 80, 8, 128, 2, 131072, 141_107_412_992),
        ModelProfile("qwen2.5-7b", 28, 4, 128, 2, 32768, 15_231_233_024),
    )
}


def get_profile(name: str) -> ModelProfile:
    """The profile called `name`; a KeyError that lists the known names otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise KeyError(f"unknown model profile {name!r}; known profiles: {known}") from None
