"""Write a tiny, randomly initialised Llama causal LM and a local tokenizer to a directory.

For judging a real OpenAI-compatible server (e.g. `transformers serve`) on a CPU-only
machine without downloading anything: the weights are random (seeded, so every run writes
the same model) and the tokenizer wraps the repo's own byte-level BPE file
(`server/tokenizer/kvgate-bpe.json`, 4,096 tokens) with a chat template.

    /work/realstack/venv/bin/python tools/tiny_model.py /work/realstack/tiny-llama

Needs only the standard library, torch and transformers (run it with the venv that has
them, not the repo's `.venv`). The model never emits its end token on its own by default
(the `<|end|>` row of the output layer is zero and decoding is greedy), so every request
runs to its `max_tokens`, like vLLM's `ignore_eos`; `--sample` makes decoding sample
instead (then an early stop is possible, rarely).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

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
    return p.parse_args(argv)


def build(args: argparse.Namespace) -> dict:
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
        # A zero output row gives <|end|> logit 0 while the largest other logit is > 0,
        # so greedy decoding never ends a reply early.
        model.lm_head.weight[end_id].zero_()

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

    # Smoke check: reload, apply the template, greedy-generate a few tokens.
    tok2 = PreTrainedTokenizerFast.from_pretrained(out)
    ids = tok2.apply_chat_template(
        [{"role": "user", "content": "hello there"}], add_generation_prompt=True
    )
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    m2 = LlamaForCausalLM.from_pretrained(out)
    with torch.no_grad():
        res = m2.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)
    params = sum(p.numel() for p in model.parameters())
    return {
        "out_dir": str(out),
        "params": params,
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.max_position_embeddings,
        "eos_token_id": end_id,
        "prompt_ids": list(ids),
        "sample_generation_ids": res[0, len(ids) :].tolist(),
        "seed": args.seed,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    info = build(args)
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
