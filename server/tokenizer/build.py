"""Builds `kvgate-bpe.json`, the small byte-level BPE tokenizer the reference server uses.

Deterministic: the training corpus comes from a fixed word list and a seeded PRNG, so running
`python -m server.tokenizer.build` reproduces the committed file. The output stays well under
1 MB (4,096-token vocabulary).
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

VOCAB_SIZE = 4096
SPECIAL_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>")
OUTPUT = Path(__file__).with_name("kvgate-bpe.json")

# Common English, code and log vocabulary: enough variety for merges that look like a real
# tokenizer's (whole common words become single tokens, rare ones split into pieces).
WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "they",
    "you",
    "were",
    "her",
    "she",
    "there",
    "would",
    "their",
    "we",
    "him",
    "been",
    "has",
    "when",
    "who",
    "will",
    "more",
    "no",
    "if",
    "out",
    "so",
    "said",
    "what",
    "up",
    "its",
    "about",
    "into",
    "than",
    "them",
    "can",
    "only",
    "other",
    "new",
    "some",
    "could",
    "time",
    "these",
    "two",
    "may",
    "then",
    "do",
    "first",
    "any",
    "my",
    "now",
    "such",
    "like",
    "our",
    "over",
    "man",
    "me",
    "even",
    "most",
    "made",
    "after",
    "also",
    "did",
    "many",
    "before",
    "must",
    "through",
    "back",
    "years",
    "where",
    "much",
    "your",
    "way",
    "well",
    "down",
    "should",
    "because",
    "each",
    "just",
    "those",
    "people",
    "how",
    "too",
    "little",
    "state",
    "good",
    "very",
    "make",
    "world",
    "still",
    "own",
    "see",
    "men",
    "work",
    "long",
    "get",
    "here",
    "between",
    "both",
    "life",
    "being",
    "under",
    "never",
    "day",
    "same",
    "another",
    "know",
    "while",
    "last",
    "might",
    "us",
    "great",
    "old",
    "year",
    "off",
    "come",
    "since",
    "against",
    "go",
    "came",
    "right",
    "used",
    "take",
    "three",
    "model",
    "server",
    "token",
    "request",
    "tenant",
    "priority",
    "cache",
    "block",
    "memory",
    "pool",
    "queue",
    "stream",
    "latency",
    "throughput",
    "replica",
    "gateway",
    "scheduler",
    "prefill",
    "decode",
    "batch",
    "interactive",
    "critical",
    "quota",
    "reserve",
    "release",
    "cancel",
    "evict",
    "preempt",
    "admit",
    "reject",
    "deadline",
    "context",
    "prompt",
    "output",
    "input",
    "length",
    "limit",
    "watermark",
    "gpu",
    "device",
    "kernel",
    "tensor",
    "layer",
    "head",
    "weight",
    "python",
    "def",
    "return",
    "class",
    "import",
    "self",
    "none",
    "true",
    "false",
    "async",
    "await",
    "yield",
    "lambda",
    "print",
    "value",
    "error",
    "json",
    "http",
    "https",
    "api",
    "key",
    "data",
    "list",
    "dict",
    "string",
    "number",
    "float",
    "integer",
    "bytes",
    "response",
    "status",
    "report",
    "gate",
    "verdict",
    "pass",
    "fail",
    "invalid",
    "marginal",
    "rollback",
    "baseline",
    "candidate",
    "config",
    "digest",
    "hello",
    "please",
    "thank",
    "question",
    "answer",
    "explain",
    "summarize",
    "translate",
    "write",
    "code",
    "test",
    "function",
    "document",
    "paragraph",
    "sentence",
    "word",
    "letter",
    "chapter",
    "section",
    "table",
    "figure",
    "result",
    "method",
    "analysis",
]
PUNCT = [*".,;:!?()[]{}\"'-_/=+*<>#@&%$", "\n", "\n\n", "  "]


def corpus(lines: int, seed: int = 20240601) -> Iterator[str]:
    """`lines` pseudo-sentences over WORDS and PUNCT, reproducible for a given seed."""
    rng = random.Random(seed)
    for _ in range(lines):
        n = rng.randint(4, 24)
        parts = []
        for _ in range(n):
            word = rng.choice(WORDS)
            roll = rng.random()
            if roll < 0.08:
                word = word.capitalize()
            elif roll < 0.11:
                word = str(rng.randint(0, 99999))
            parts.append(word)
            if rng.random() < 0.12:
                parts.append(rng.choice(PUNCT))
        yield " ".join(parts)


def build(lines: int = 40000) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(lines), trainer=trainer)
    return tok


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=OUTPUT, help="where to write tokenizer.json")
    args = parser.parse_args(argv)
    build().save(str(args.out), pretty=False)
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
