"""Block text (workloads/blocks.py): each trace block id is its own words, a block is
exactly its size in the reference tokenizer's tokens, and prompts share text exactly as far
as their block ids agree."""

from __future__ import annotations

import pytest

from workloads.blocks import BlockText, BlockTextError
from workloads.prompts import PromptGenerator, generator_for


@pytest.fixture(scope="module")
def generator() -> PromptGenerator:
    return generator_for(PromptGenerator().tokenizer_path)


def test_blocks_tokenize_to_their_size_anywhere_in_a_prompt(generator: PromptGenerator) -> None:
    blocks = BlockText(generator, 16, seed=1)
    assert generator.exact
    found = blocks.check([7, 3, 9, 7])
    assert found.exact and found.counted == 64
    assert generator.count(blocks.prompt([5, 6, 8], 40)) == 40  # the last block cut to 8


def test_equal_ids_give_equal_prefixes_and_different_ids_differ(
    generator: PromptGenerator,
) -> None:
    blocks = BlockText(generator, 16, seed=1)
    a, b = blocks.prompt([0, 1, 2], 48), blocks.prompt([0, 1, 3], 48)
    words_a, words_b = a.split(" "), b.split(" ")
    assert words_a[:32] == words_b[:32] and words_a[32:] != words_b[32:]
    assert blocks.prompt([0, 1, 2], 40) == " ".join(words_a[:40])  # a partial block is a prefix
    other_run = BlockText(generator, 16, seed=2)
    assert other_run.prompt([0], 16) != blocks.prompt([0], 16)


def test_a_prompt_longer_than_its_blocks_is_refused(generator: PromptGenerator) -> None:
    with pytest.raises(ValueError, match="2 blocks of 16 tokens cannot hold 33 tokens"):
        BlockText(generator, 16, seed=1).prompt([0, 1], 33)


def test_text_that_does_not_come_to_its_size_is_refused() -> None:
    approximate = generator_for(None)  # no tokenizer: counts are unknown, not refused
    assert BlockText(approximate, 16, seed=1).check([0, 1]).exact is None

    class Miscounting(PromptGenerator):
        def count(self, text: str) -> int | None:
            return len(text.split(" ")) + 1

    with pytest.raises(BlockTextError, match="2 blocks of 16 tokens tokenize to 33 tokens"):
        BlockText(Miscounting(), 16, seed=1).check([0, 1])
