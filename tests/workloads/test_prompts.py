"""Prompt generation: exact token counts for the reference tokenizer, deterministic, cached."""

from __future__ import annotations

from pathlib import Path

import pytest

from workloads.prompts import DEFAULT_TOKENIZER_PATH, PromptGenerator, generator_for


@pytest.fixture(scope="module")
def generator() -> PromptGenerator:
    assert DEFAULT_TOKENIZER_PATH.is_file(), "the reference tokenizer moved"
    return generator_for(DEFAULT_TOKENIZER_PATH)


@pytest.mark.parametrize("n", [1, 2, 8, 9, 64, 1000, 32_000])
def test_unique_prompts_hit_the_target_exactly(generator: PromptGenerator, n: int) -> None:
    assert generator.exact
    assert generator.count(generator.unique_text(n, seed=1, nonce=n)) == n


def test_prompts_are_deterministic_per_seed_and_unique_per_nonce(
    generator: PromptGenerator,
) -> None:
    a = generator.unique_text(200, seed=5, nonce=1)
    assert a == PromptGenerator(DEFAULT_TOKENIZER_PATH).unique_text(200, seed=5, nonce=1)
    b = generator.unique_text(200, seed=5, nonce=2)
    assert a != b and a.split()[:8] != b.split()[:8]  # they differ from the first token
    assert a.split()[8:] == b.split()[8:]  # the cached body is shared
    assert generator.text(200, seed=5) != generator.text(200, seed=6)


def test_long_bodies_are_built_once(generator: PromptGenerator) -> None:
    assert generator.text(32_000, seed=9) is generator.text(32_000, seed=9)


def test_without_the_tokenizer_file_counts_are_approximate(tmp_path: Path) -> None:
    approx = PromptGenerator(tmp_path / "missing.json")
    assert not approx.exact and approx.count("a b") is None
    assert len(approx.unique_text(500, seed=1, nonce=3).split()) == 500


def test_a_broken_tokenizer_file_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="cannot load tokenizer"):
        PromptGenerator(bad)
