"""A prompt's block ids: equal exactly as far as the prompts are equal, one per block of the
tokens aimed at, on every request kvgate's traffic classes send."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import pytest

from contract import RequestRecord
from tests.workloads.fakes import FakeServer, fake_server
from tests.workloads.test_users import make_user, run_task, sent
from workloads.block_ids import BLOCK_TOKENS, PromptText, literal, prompt_block_ids
from workloads.prompts import DEFAULT_TOKENIZER_PATH, generator_for
from workloads.users import USER_CLASSES


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with fake_server(tokens=5) as srv:
        yield srv


def blocks(record: RequestRecord) -> list[str]:
    assert record.prompt_blocks is not None, f"{record.traffic_class} sent no block ids"
    return record.prompt_blocks.split(" ")


def tokens(body: dict[str, Any]) -> list[str]:
    """The prompt's tokens as the workload meant them: each message's start, then its words."""
    out: list[str] = []
    for message in body["messages"]:
        out.append(f"<{message['role']}>")
        out.extend(message["content"].split())
    return out


def common_prefix_tokens(a: list[str], b: list[str]) -> int:
    """Tokens the two prompts share from their start (message starts are no tokens)."""
    shared = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        shared += not x.startswith("<")
    return shared


@pytest.mark.parametrize("name", sorted(USER_CLASSES))
def test_every_class_records_one_block_id_per_block_of_its_prompt(
    server: FakeServer, name: str
) -> None:
    user, records = make_user(name, server.url, prompt_tokens=600, burst_size=2, max_tokens=8)
    run_task(user)
    run_task(user)
    assert records
    for record in records:
        ids = blocks(record)
        assert len(ids) == math.ceil(record.target_prompt_tokens / BLOCK_TOKENS), record
        assert all(len(i) == 16 and int(i, 16) >= 0 for i in ids)


def test_shared_prefix_requests_share_exactly_the_blocks_their_prompts_share(
    server: FakeServer,
) -> None:
    # One public system prompt of 1,100 tokens: two full blocks of it, then the question.
    user, records = make_user(
        "shared_prefix",
        server.url,
        prefix_tokens=1100,
        public_share=1.0,
        public_prefixes=1,
    )
    run_task(user)
    run_task(user)
    (_, first), (_, second) = sent(server)
    shared = common_prefix_tokens(tokens(first), tokens(second))
    assert shared >= 1100  # the same system prompt, then each its own question
    full = shared // BLOCK_TOKENS
    a, b = blocks(records[0]), blocks(records[1])
    assert len(a) == len(b) == math.ceil((1100 + 16) / BLOCK_TOKENS)
    assert a[:full] == b[:full]
    assert all(x != y for x, y in zip(a[full:], b[full:], strict=True))


def test_unrelated_requests_share_no_block(server: FakeServer) -> None:
    user, records = make_user("shared_prefix", server.url, prefix_tokens=1100, public_share=0.0)
    run_task(user)
    other, others = make_user("long_context", server.url, prompt_tokens=1100)
    run_task(other)
    run_task(other)
    ids = [set(blocks(r)) for r in [*records, *others]]
    assert sum(len(s) for s in ids) == len(set().union(*ids))


def test_a_later_turn_shares_the_full_blocks_of_the_turns_before(server: FakeServer) -> None:
    user, records = make_user("multi_turn", server.url, prompt_tokens=600, turns=2)
    run_task(user)
    run_task(user)
    first, second = blocks(records[0]), blocks(records[1])
    assert len(first) == 2 and len(second) == math.ceil((600 + 6 + 600) / BLOCK_TOKENS)
    assert second[0] == first[0]  # the first turn's full block
    assert second[1] != first[1]  # its partial block, now filled with more


def test_block_ids_follow_the_text_not_the_call_that_made_it() -> None:
    prompts = generator_for(DEFAULT_TOKENIZER_PATH)
    long, short = prompts.text(1500, seed=3), prompts.text(1024, seed=3)
    assert long.startswith(short + " ")  # a seed's shorter text starts its longer one
    a = prompt_block_ids([{"role": "user", "content": long}], 1500)
    b = prompt_block_ids([{"role": "user", "content": short}], 1024)
    assert a[:2] == b  # two full blocks of the same words
    # The same words in another role, or under another seed, are other blocks.
    assert prompt_block_ids([{"role": "system", "content": short}], 1024)[0] != b[0]
    assert prompt_block_ids([{"role": "user", "content": prompts.text(1024, 4)}], 1024)[0] != b[0]


def test_plain_text_counts_its_words_and_a_literal_its_stated_tokens() -> None:
    plain = prompt_block_ids([{"role": "user", "content": "a b c"}], 3, block_tokens=2)
    assert len(plain) == 2
    assert plain == prompt_block_ids([{"role": "user", "content": "a b c"}], 3, block_tokens=2)
    reply = literal("anything at all", 5)
    assert isinstance(reply, PromptText) and json.dumps(reply) == '"anything at all"'
    assert len(prompt_block_ids([{"role": "assistant", "content": reply}], 5, 2)) == 3


def test_tokens_the_messages_do_not_describe_are_never_shared() -> None:
    messages = [{"role": "user", "content": "a b c d"}]
    short = prompt_block_ids(messages, 6, block_tokens=2)  # two tokens more than described
    again = prompt_block_ids(messages, 6, block_tokens=2)
    assert len(short) == 3 and short[:2] == again[:2] and short[2] != again[2]
    cut = prompt_block_ids(messages, 3, block_tokens=2)  # fewer: the prompt is cut
    assert len(cut) == 2 and cut[0] == short[0]
    assert prompt_block_ids(messages, 0) == ()
