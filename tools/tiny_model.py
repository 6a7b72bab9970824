"""Write a tiny, randomly initialised Llama causal LM and a local tokenizer to a directory.

For judging a real OpenAI-compatible server (`transformers serve`, or vLLM's CPU build) on
a CPU-only machine without downloading anything: the weights are random (seeded, so every
run writes the same files) and the tokenizer wraps the repo's own byte-level BPE file
(`server/tokenizer/kvgate-bpe.json`, 4,096 tokens) with a chat template, so the server's
token counts are kvgate's.

    VENV/bin/python tools/tiny_model.py OUT_DIR    # `make vllm` does this for vLLM's CPU build

Needs only the standard library, torch and transformers (run it with the venv that has
them, not the repo's `.venv`). The defaults suit vLLM's CPU attention (head dim 64,
float32).

The model can never emit a banned token: the special tokens (`<|end|>` among them, so every
reply runs to its `max_tokens`, like vLLM's `ignore_eos`), the byte fragments that are not
valid UTF-8 on their own (they would stream as empty or U+FFFD content chunks) and the
control characters other than tab, newline and carriage return. Channel 0 of the residual
stream is a bias unit: every embedding holds a constant there and no layer writes to it, so
after the final norm it is positive. A banned token's output row is minus a large weight on
that channel and zero elsewhere, so its logit is always negative; one pair of allowed
tokens has opposite rows, so the best allowed logit is never below zero. Greedy decoding
(`generation_config.json` has temperature 0, which vLLM takes as its default) therefore
never picks a banned token, and sampling (`--sample`) practically never does.
`--allow-all-tokens` turns the bans off but for `<|end|>`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

TOKENIZER_JSON = Path(__file__).resolve().parent.parent / "server" / "tokenizer" / "kvgate-bpe.json"

# Special tokens of kvgate-bpe.json (ids 0..4).
SYSTEM, USER, ASSISTANT, TOOL, END = (
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|tool|>",
    "<|end|>",
)

# Each message: <|role|>content<|end|>; the generation prompt opens an assistant turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['content'] is string %}{% set text = message['content'] %}"
    "{% else %}{% set text = message['content'] | map(attribute='text') | join(' ') %}{% endif %}"
    "{{ '<|' + message['role'] + '|>' + text + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

BIAS_CHANNEL = 0  # residual-stream channel held constant (the bias unit)
BAN_WEIGHT = 1000.0  # a banned token's logit is -BAN_WEIGHT x (bias channel after the norm)
ALLOWED_CONTROLS = frozenset("\t\n\r")

# Smoke-check prompts: ASCII, accented and CJK text, digits, code.
CHECK_PROMPTS = (
    "hello there",
    "Summarise the quarterly KV-cache report: pool 80 GiB, 12 tenants, p95 TTFT 412 ms.",
    "Café naïve résumé — 東京 の 天気 は? def f(x): return {'k': [1, 2, 3]}",
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "out_dir", type=Path, help="directory to write (created; files in it are overwritten)"
    )
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--hidden", type=int, default=128, help="hidden size (default 128)")
    p.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    p.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    p.add_argument("--kv-heads", type=int, default=2, help="key/value heads (default 2, GQA)")
    p.add_argument(
        "--head-dim",
        type=int,
        default=64,
        help="size of one attention head (default 64, which vLLM's CPU attention needs; "
        "it may differ from hidden / heads)",
    )
    p.add_argument("--intermediate", type=int, default=256, help="MLP size (default 256)")
    p.add_argument(
        "--max-positions",
        type=int,
        default=32768,
        help="max_position_embeddings, the context the model claims (default 32768)",
    )
    p.add_argument("--tokenizer-json", type=Path, default=TOKENIZER_JSON)
    p.add_argument(
        "--sample", action="store_true", help="sample (temperature 1) instead of greedy decoding"
    )
    p.add_argument(
        "--allow-all-tokens",
        action="store_true",
        help="ban only <|end|> (byte fragments and control characters may then be emitted)",
    )
    return p.parse_args(argv)


def banned_token_ids(raw: Any, allow_all: bool) -> list[int]:
    """Ids the model must never emit: special tokens, lone invalid UTF-8, control chars."""
    end_id = raw.token_to_id(END)
    if allow_all:
        return [end_id]
    banned = []
    for i in range(raw.get_vocab_size()):
        text = raw.decode([i], skip_special_tokens=True)
        if (
            not text
            or "\ufffd" in text
            or any(ord(c) < 32 and c not in ALLOWED_CONTROLS for c in text)
        ):
            banned.append(i)
    if end_id not in banned:
        raise SystemExit(f"tiny_model: {END} does not decode to an empty string")
    return banned


def build(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from tokenizers import Tokenizer
    from transformers import (
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
    )

    torch.manual_seed(args.seed)
    out: Path = args.out_dir
    out.mkdir(parents=True, exist_ok=True)

    raw = Tokenizer.from_file(str(args.tokenizer_json))
    vocab = raw.get_vocab()
    for tok in (SYSTEM, USER, ASSISTANT, TOOL, END):
        if tok not in vocab:
            raise SystemExit(f"tiny_model: {args.tokenizer_json} lacks special token {tok}")
    end_id = vocab[END]
    banned = banned_token_ids(raw, args.allow_all_tokens)
    banned_set = set(banned)
    allowed = [i for i in range(raw.get_vocab_size()) if i not in banned_set]

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token=None,
        eos_token=END,
        pad_token=END,
        additional_special_tokens=[SYSTEM, USER, ASSISTANT, TOOL],
        model_max_length=args.max_positions,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE

    config = LlamaConfig(
        vocab_size=raw.get_vocab_size(),
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        max_position_embeddings=args.max_positions,
        bos_token_id=None,
        eos_token_id=end_id,
        pad_token_id=end_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.eval()
    with torch.no_grad():
        # The bias unit: a constant channel in every embedding that no layer writes to.
        model.model.embed_tokens.weight[:, BIAS_CHANNEL] = config.initializer_range
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[BIAS_CHANNEL].zero_()
            layer.mlp.down_proj.weight[BIAS_CHANNEL].zero_()
        head = model.lm_head.weight
        head[:, BIAS_CHANNEL] = 0.0
        head[banned] = 0.0
        head[banned, BIAS_CHANNEL] = -BAN_WEIGHT
        # Opposite rows: max(w.h, -w.h) >= 0, so some allowed token beats every banned one.
        head[allowed[1]] = -head[allowed[0]]

    gen = GenerationConfig(
        eos_token_id=end_id,
        pad_token_id=end_id,
        do_sample=bool(args.sample),
        temperature=1.0 if args.sample else None,
        top_p=None,
        top_k=None,
        max_new_tokens=1024,
    )
    model.generation_config = gen

    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    if not args.sample:
        # vLLM takes its default sampling parameters from generation_config.json, and
        # temperature 0 is greedy there. transformers refuses to save temperature 0 beside
        # do_sample false (it loads it, with a warning), so it is written here.
        gen_path = out / "generation_config.json"
        gen_json = json.loads(gen_path.read_text())
        gen_json["temperature"] = 0.0
        gen_path.write_text(json.dumps(gen_json, indent=2, sort_keys=True) + "\n")

    # Smoke check: reload, apply the template, greedy-generate, and measure how far the
    # banned tokens stay below the best allowed one.
    tok2 = PreTrainedTokenizerFast.from_pretrained(out)
    m2 = LlamaForCausalLM.from_pretrained(out)
    margin = float("inf")
    first_ids: list[int] = []
    first_gen: list[int] = []
    for n, prompt in enumerate(CHECK_PROMPTS):
        ids = tok2.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True
        )
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        with torch.no_grad():
            res = m2.generate(
                torch.tensor([ids]),
                max_new_tokens=64,
                do_sample=False,
                temperature=None,
                eos_token_id=None,
                output_logits=True,
                return_dict_in_generate=True,
            )
        gen_ids = res.sequences[0, len(ids) :].tolist()
        if banned_set.intersection(gen_ids):
            raise SystemExit(f"tiny_model: greedy decoding emitted a banned token: {gen_ids}")
        for step in res.logits:
            row = step[0]
            margin = min(margin, float(row[allowed].max() - row[banned].max()))
        if n == 0:
            first_ids, first_gen = list(ids), gen_ids
    if margin <= 0:
        raise SystemExit(f"tiny_model: a banned token reached the top logit (margin {margin})")
    params = sum(p.numel() for p in model.parameters())
    return {
        "out_dir": str(out),
        "params": params,
        "vocab_size": config.vocab_size,
        "head_dim": args.head_dim,
        "max_position_embeddings": config.max_position_embeddings,
        "eos_token_id": end_id,
        "banned_tokens": len(banned),
        "min_logit_margin": round(margin, 3),
        "prompt_ids": first_ids,
        "sample_generation_ids": first_gen[:16],
        "sample_generation_text": tok2.decode(first_gen[:16]),
        "seed": args.seed,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    info = build(args)
    print(json.dumps(info, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
