"""Prompt text of an exact token count for the reference tokenizer, deterministic for a seed.

Prompts are built from words that are one token each, both first and after a space, checked
against the tokenizer once per process, so a prompt of N words is N tokens and no per-request
encoding is needed. Bodies are cached (a 32K-token prompt is built once); a short per-request
lead makes each prompt unique from its first token, so only prompts meant to share a prefix do.
Without the tokenizer file the same words are used and counts are approximate (`exact` False).
Each text says what generated it (`block_ids.PromptText`): the seeds its words were drawn from,
which is what a prompt's block ids hash (workloads/block_ids.py).
"""

from __future__ import annotations

import hashlib
import random
import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

from workloads.block_ids import PromptText, Run

if TYPE_CHECKING:  # imported when a tokenizer file is there to load
    from tokenizers import Tokenizer

DEFAULT_TOKENIZER_PATH = (
    Path(__file__).resolve().parent.parent / "server" / "tokenizer" / "kvgate-bpe.json"
)
UNIQUE_LEAD_WORDS = 8
_CACHE_ENTRIES = 64
_MIN_WORDS = 16
_CHECK_SAMPLE = 600

_CANDIDATE_TEXT = """
the of and to in is that for it as was with be by on not he this are or his from at which
but have an they you were her she there would their we him been has when who will more no if
out so said what up its about into than them can only other new some could time these two may
then do first any my now such like our over man me even most made after also did many before
must through back years where much your way well down should because each just those people
how too little state good very make world still own see men work long get here between both
life being under never day same another know while last might us great old year off come
since against go came right used take three model server token request tenant priority cache
block memory pool queue stream latency throughput replica gateway scheduler prefill decode
batch interactive critical quota reserve release cancel evict preempt admit reject deadline
context prompt output input length limit watermark device kernel tensor layer head weight
value error data list string number report result answer question explain summarize write
code test function document paragraph sentence word letter chapter section table figure
"""
_CANDIDATE_WORDS = tuple(_CANDIDATE_TEXT.split())


class PromptGenerator:
    """Owns the verified single-token word list and an LRU cache of generated bodies.

    Invariant: when `exact`, `len(tokenizer(text(n, seed)))` is `n` for every n and seed.
    """

    def __init__(self, tokenizer_path: str | Path | None = DEFAULT_TOKENIZER_PATH) -> None:
        self.tokenizer_path = Path(tokenizer_path) if tokenizer_path else None
        self._tokenizer = _load_tokenizer(self.tokenizer_path)
        self.words, self.exact = self._choose_words()
        # Word i of a seed's text is the same whatever the text's length (`text`), so the seed
        # and the word list name every slice of it.
        vocabulary = hashlib.blake2b(" ".join(self.words).encode(), digest_size=4).hexdigest()
        self._run_key = f"s{vocabulary}:"
        self._cache: OrderedDict[tuple[int, int], PromptText] = OrderedDict()

    def count(self, text: str) -> int | None:
        """Tokens in `text` as the tokenizer counts them; None without a tokenizer."""
        if self._tokenizer is None:
            return None
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def text(self, n_tokens: int, seed: int) -> PromptText:
        """The same `n_tokens`-token text for the same seed (cached); a shorter text of a seed
        is the start of a longer one."""
        if n_tokens <= 0:
            return PromptText("", ())
        key = (n_tokens, seed)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        words = " ".join(random.Random(seed).choices(self.words, k=n_tokens))
        text = PromptText(words, (Run(f"{self._run_key}{seed}", n_tokens),))
        self._cache[key] = text
        if len(self._cache) > _CACHE_ENTRIES:
            self._cache.popitem(last=False)
        return text

    def unique_text(self, n_tokens: int, seed: int, nonce: int) -> PromptText:
        """`n_tokens` tokens: a lead of a few words drawn from `nonce`, then the cached body."""
        lead_n = min(UNIQUE_LEAD_WORDS, n_tokens)
        lead_seed = nonce * 1_000_003 + seed
        lead = " ".join(random.Random(lead_seed).choices(self.words, k=lead_n))
        runs = (Run(f"{self._run_key}{lead_seed}", lead_n),) if lead_n else ()
        body = self.text(n_tokens - lead_n, seed)
        return PromptText(f"{lead} {body}" if body else lead, runs + body.runs)

    def _choose_words(self) -> tuple[tuple[str, ...], bool]:
        if self._tokenizer is None:
            return tuple(_CANDIDATE_WORDS), False
        single = tuple(
            w for w in _CANDIDATE_WORDS if self.count(w) == 1 and self.count(" " + w) == 1
        )
        if len(single) < _MIN_WORDS:
            return tuple(_CANDIDATE_WORDS), False
        sample = random.Random(0).choices(single, k=_CHECK_SAMPLE)
        return single, self.count(" ".join(sample)) == _CHECK_SAMPLE


def _load_tokenizer(path: Path | None) -> Tokenizer | None:
    if path is None or not path.is_file():
        return None
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception for unreadable files
        raise ValueError(
            f"cannot load tokenizer {path}: {exc}; point `tokenizer_path` at a Hugging Face "
            "tokenizer.json, or at a missing path for approximate prompt sizes"
        ) from None


_GENERATORS: dict[str, PromptGenerator] = {}
_GENERATORS_LOCK = threading.Lock()


def generator_for(tokenizer_path: str | Path | None) -> PromptGenerator:
    """One shared generator (and cache) per tokenizer path in this process."""
    key = str(tokenizer_path)
    with _GENERATORS_LOCK:
        gen = _GENERATORS.get(key)
        if gen is None:
            gen = _GENERATORS[key] = PromptGenerator(tokenizer_path)
        return gen
