"""Configuration: seed defaults, model profiles, digest, YAML loading and refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from contract.seed import SEED
from server.scheduler import (
    PROFILES,
    SEED_CONFIG_PATH,
    ConfigError,
    Priority,
    SchedulerConfig,
    TenantQuota,
    get_profile,
)


def test_the_seeds_numbers_are_the_design_tables() -> None:
    assert (SEED.kv_pool_gib, SEED.block_tokens) == (52, 16)
    assert (SEED.admission_watermark, SEED.batch_prefill_pause_watermark, SEED.hard_watermark) == (
        0.82,
        0.88,
        0.92,
    )
    assert (SEED.interactive_reserve, SEED.tenant_max_share) == (0.25, 0.15)
    assert (SEED.queue_deadline_ms, SEED.max_new_tokens_default) == (8000, 1024)


def test_the_config_defaults_are_the_seeds_numbers() -> None:
    defaults = SchedulerConfig()
    for key, value in SEED.as_config().items():
        assert getattr(defaults, key) == value, key


@pytest.mark.parametrize(
    ("name", "kib"), [("llama-3-8b", 128), ("llama-3-70b", 320), ("qwen2.5-7b", 56)]
)
def test_profile_kv_bytes_per_token(name: str, kib: int) -> None:
    assert PROFILES[name].kv_bytes_per_token == kib * 1024


def test_unknown_profile_lists_known_ones() -> None:
    with pytest.raises(KeyError, match="llama-3-8b"):
        get_profile("gpt-5")


def test_bytes_per_token_applies_overhead_and_safety_and_rounds_up() -> None:
    c = SchedulerConfig(overhead_factor=1.05, safety_factor=1.10)
    assert c.bytes_per_token == 151389  # 131072 * 1.155 = 151388.16, rounded up
    exact = SchedulerConfig(overhead_factor=1.0, safety_factor=1.0)
    assert exact.bytes_per_token == 131072
    assert exact.pool_blocks() == 52 * 2**30 // (16 * 131072)


def test_blocks_round_up() -> None:
    c = SchedulerConfig()
    assert (c.blocks_for(1), c.blocks_for(16), c.blocks_for(17)) == (1, 1, 2)


def test_digest_is_canonical_and_sensitive() -> None:
    a = SchedulerConfig()
    assert a.digest() == SchedulerConfig().digest()
    assert len(a.digest()) == 64
    assert a.digest() != SchedulerConfig(hard_watermark=0.93).digest()
    assert a.digest() != SchedulerConfig(gpu_sku="h200-141gb").digest()


def test_the_example_config_file_is_the_seeds() -> None:
    """The one place seed.yaml is held to the code: it shows every key, each at its default
    (the seed's numbers for the seed's keys), and binds the config to the simulator."""
    written = yaml.safe_load(SEED_CONFIG_PATH.read_text())
    binding = {"model_digest", "runtime_version", "gpu_sku"}
    assert set(written) == set(SchedulerConfig.model_fields)
    seed = SchedulerConfig.from_yaml(SEED_CONFIG_PATH)
    defaults = SchedulerConfig()
    for key in SchedulerConfig.model_fields:
        if key not in binding:
            assert getattr(seed, key) == getattr(defaults, key), key
    assert all(getattr(seed, k) != "unbound" for k in binding)


def test_refuses_watermarks_out_of_order(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("admission_watermark: 0.9\nbatch_prefill_pause_watermark: 0.88\n")
    with pytest.raises(ConfigError) as err:
        SchedulerConfig.from_yaml(path)
    msg = str(err.value)
    assert "admission_watermark (0.9)" in msg
    assert "batch_prefill_pause_watermark (0.88)" in msg
    assert str(path) in msg


def test_refuses_gap_smaller_than_one_step_growth() -> None:
    # 8192 tokens per step = 512 blocks of 23050: 0.0222 of the pool; 0.92 - 0.91 = 0.01.
    with pytest.raises(ConfigError) as err:
        SchedulerConfig(batch_prefill_pause_watermark=0.91)
    msg = str(err.value)
    assert "batch_prefill_pause_watermark (0.91)" in msg and "hard_watermark (0.92)" in msg
    assert "0.0100 apart" in msg and "0.0222" in msg
    assert "step_token_budget 8192" in msg and "512 of 23050 blocks" in msg


def test_gap_rule_depends_on_step_budget() -> None:
    SchedulerConfig(batch_prefill_pause_watermark=0.91, step_token_budget=2048)
    with pytest.raises(ConfigError, match="hard_watermark"):
        SchedulerConfig(hard_watermark=0.99)


def test_refuses_unknown_key_and_bad_values(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="kv_pool_gb: unknown key; allowed keys: kv_pool_gib"):
        SchedulerConfig(kv_pool_gb=52)
    with pytest.raises(ConfigError, match=r"block_tokens: .*\(got 0\)"):
        SchedulerConfig(block_tokens=0)
    with pytest.raises(ConfigError, match="model 'gpt-5' has no profile"):
        SchedulerConfig(model="gpt-5")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must be a YAML mapping"):
        SchedulerConfig.from_yaml(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        SchedulerConfig.from_yaml(tmp_path / "missing.yaml")


def test_tenant_quota_refuses_soft_above_hard() -> None:
    with pytest.raises(ValueError, match="soft_reserved_tokens"):
        TenantQuota(
            name="a",
            hard_reserved_tokens=10,
            soft_reserved_tokens=20,
            max_active_seqs=1,
            max_context_tokens=10,
            max_gpu_seconds=1,
            budgets={Priority.BATCH: 10},
        )
