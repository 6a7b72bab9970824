"""Tokenization for the reference server: the prompt template and the tokenizer wrapper.

`DEFAULT_TOKENIZER_PATH` (server/tokenizer/kvgate-bpe.json) is a stable, documented path: the
workloads package loads it with `tokenizers.Tokenizer.from_file` to count tokens exactly as
the server does, without importing `server`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer

DEFAULT_TOKENIZER_PATH = Path(__file__).with_name("kvgate-bpe.json")

# Words the simulator "generates"; each one is a single token of the default tokenizer when
# preceded by a space, and any tokenizer can encode them.
_OUTPUT_WORDS = [
    "the",
    "model",
    "server",
    "token",
    "cache",
    "block",
    "memory",
    "pool",
    "queue",
    "stream",
    "latency",
    "replica",
    "gateway",
    "scheduler",
    "prefill",
    "decode",
    "batch",
    "context",
    "prompt",
    "output",
    "request",
    "tenant",
    "priority",
    "quota",
    "release",
    "cancel",
    "admit",
    "deadline",
    "report",
    "gate",
    "result",
    "value",
    "data",
    "answer",
    "question",
]


def render_chat(messages: Sequence[tuple[str, str]]) -> str:
    """The chat template: `<|role|>\\n{content}<|end|>\\n` per message, then `<|assistant|>\\n`."""
    parts = [f"<|{role}|>\n{content}<|end|>\n" for role, content in messages]
    parts.append("<|assistant|>\n")
    return "".join(parts)


class TextTokenizer:
    """Wraps a `tokenizers.Tokenizer` loaded from a tokenizer.json.

    Owns the output vocabulary the simulator draws from: `output_ids` and, for each, its text
    already escaped for a JSON string (`output_json`), so streaming never re-escapes per token.
    """

    def __init__(self, path: str | Path = DEFAULT_TOKENIZER_PATH) -> None:
        self.path = Path(path)
        try:
            self._tok = Tokenizer.from_file(str(self.path))
        except Exception as exc:  # tokenizers raises a plain Exception on bad files
            raise ValueError(
                f"cannot load tokenizer {self.path}: {exc}; pass --tokenizer with a "
                f"tokenizer.json file (Hugging Face format)"
            ) from None
        self.name = self.path.name
        self.vocab_size = self._tok.get_vocab_size()
        # No token covers more characters of text than its longest vocabulary entry has (a
        # byte-level entry spells one byte per character), so a text of C characters is at
        # least C / max_token_chars tokens: a bound that costs nothing to check.
        self.max_token_chars = max(1, max(len(k) for k in self._tok.get_vocab(True)))
        ids: list[int] = []
        texts: list[str] = []
        for word in _OUTPUT_WORDS:
            enc = self._tok.encode(" " + word, add_special_tokens=False).ids
            if enc:
                ids.append(enc[0])
                texts.append(self._tok.decode([enc[0]]))
        if not ids:
            raise ValueError(f"tokenizer {self.path} encodes none of the output words")
        self.output_ids: tuple[int, ...] = tuple(ids)
        self.output_json: tuple[bytes, ...] = tuple(json.dumps(t)[1:-1].encode() for t in texts)
        self.output_text: tuple[str, ...] = tuple(texts)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_nogil(self, text: str) -> list[int]:
        """Same ids as `encode`, but the Rust side releases the GIL (encode_batch does, encode
        does not), so a worker thread can tokenize a long prompt without stalling the loop."""
        return self._tok.encode_batch([text], add_special_tokens=False)[0].ids

    def min_tokens(self, chars: int) -> int:
        """A lower bound on the tokens of any text of `chars` characters (see __init__)."""
        return -(-chars // self.max_token_chars)

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)
