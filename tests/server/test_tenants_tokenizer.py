"""The shipped tenants file and tokenizer: exactly what server/README.md promises."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from server.protocol import ApiError
from server.scheduler import ConfigError, Priority
from server.tenants import DEFAULT_TENANTS_PATH, load_tenants
from server.tokenizer import DEFAULT_TOKENIZER_PATH, TextTokenizer, render_chat
from server.tokenizer.build import build
from tests.server.procs import ROOT

INTER, BATCH, CRIT = Priority.INTERACTIVE, Priority.BATCH, Priority.CRITICAL
README_KEYS = {
    "kvg-sys-key": ("system", (CRIT, INTER)),
    "kvg-acme-key": ("acme", (INTER, BATCH)),
    "kvg-globex-key": ("globex", (INTER, BATCH)),
    "kvg-initech-key": ("initech", (INTER, BATCH)),
    "kvg-batch-key": ("batchco", (BATCH,)),
    "kvg-nightly-key": ("nightly", (BATCH,)),
}
# Tenants whose quota budgets classes their key may not use: only the key's priorities keep
# them off those (what the security probe's escalations test).
WIDER_BUDGETS = {"nightly": {CRIT, INTER, BATCH}}


def test_demo_tenants_match_the_readme() -> None:
    book = load_tenants(DEFAULT_TENANTS_PATH)
    assert set(book.quotas) == {"system", "acme", "globex", "initech", "batchco", "nightly"}
    for key, (tenant, prios) in README_KEYS.items():
        assert book.authenticate(f"Bearer {key}", None).tenant == tenant
        assert book.authenticate(f"Bearer {key}", None).priority == prios[0]
        for p in Priority:
            if p in prios:
                assert book.authenticate(f"Bearer {key}", p.value).priority == p
            else:
                with pytest.raises(ApiError) as exc:
                    book.authenticate(f"Bearer {key}", p.value)
                assert exc.value.status == 403
        assert set(book.quotas[tenant].budgets) == WIDER_BUDGETS.get(tenant, set(prios))
    assert book.is_admin("Bearer kvg-admin-key") and not book.is_admin("Bearer kvg-acme-key")
    with pytest.raises(ApiError) as exc:
        book.authenticate("Bearer kvg-admin-key", None)
    assert exc.value.status == 401


def test_bad_tenants_file_names_the_problem(tmp_path: Path) -> None:
    bad = tmp_path / "t.yaml"
    bad.write_text("tenants:\n  a:\n    keys: [k]\n    priorities: [urgent]\n    quota: {}\n")
    with pytest.raises(ConfigError, match=r"tenants\.a\.priorities"):
        load_tenants(bad)


def test_tokenizer_is_small_stable_and_reproducible(tmp_path: Path) -> None:
    assert DEFAULT_TOKENIZER_PATH == ROOT / "server" / "tokenizer" / "kvgate-bpe.json"
    assert DEFAULT_TOKENIZER_PATH.stat().st_size < 1_000_000
    rebuilt = tmp_path / "t.json"
    build().save(str(rebuilt), pretty=False)
    assert rebuilt.read_bytes() == DEFAULT_TOKENIZER_PATH.read_bytes()


def test_workloads_can_count_tokens_like_the_server() -> None:
    raw = Tokenizer.from_file(str(DEFAULT_TOKENIZER_PATH))
    tok = TextTokenizer()
    text = render_chat([("system", "be brief"), ("user", "hello world")])
    assert text == "<|system|>\nbe brief<|end|>\n<|user|>\nhello world<|end|>\n<|assistant|>\n"
    assert len(raw.encode(text, add_special_tokens=False).ids) == tok.count(text)
    assert tok.encode_nogil(text * 50) == tok.encode(text * 50)
    assert tok.encode("<|user|>")[0] == raw.token_to_id("<|user|>")
    assert all(len(t) > 1 for t in tok.output_text)


def test_any_tokenizer_json_can_be_used(tmp_path: Path) -> None:
    other = tmp_path / "tokenizer.json"
    build(lines=2000).save(str(other))
    tok = TextTokenizer(other)
    assert tok.name == "tokenizer.json" and tok.count("hello world") > 0
    with pytest.raises(ValueError, match="--tokenizer"):
        TextTokenizer(tmp_path / "missing.json")
