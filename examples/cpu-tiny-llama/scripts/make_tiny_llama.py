#!/usr/bin/env python3
"""Write a tiny Llama-architecture checkpoint for the CPU engine (a second model family).

    python scripts/make_tiny_llama.py OUT_DIR [--seed 0]

No hub download: a LlamaForCausalLM config, a byte-level BPE tokenizer trained on the
fixed corpus below with Llama 3's special tokens, a Llama-3.1-style chat template (tools
as JSON, calls as {"name": ..., "parameters": ...}: what the llama3_json tool parser
reads) and random bf16 weights from a fixed seed. The same seed gives the same bytes in
every file. Needs numpy, safetensors and tokenizers; not torch.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
from safetensors import TensorSpec, serialize_file
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

# one thread keeps the BPE trainer's tie-breaking order fixed
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# head_dim 32 (hidden / heads) is the CPU attention backend's minimum
HIDDEN = 128
LAYERS = 2
HEADS = 4
KV_HEADS = 2
INTERMEDIATE = 256
MAX_POSITIONS = 1024
BPE_VOCAB = 1536

# Llama 3's special tokens; <|python_tag|> must exist: the llama3_json parser looks it up
SPECIAL = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
           "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>")
SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
         r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Written for this project, in the shape of Llama 3.1's template: a system turn (with the
# tools as JSON schemas when given), user/assistant turns, tool calls as JSON objects and
# tool results in `ipython` turns.
CHAT_TEMPLATE = r"""
{{- bos_token -}}
{%- if tools -%}
{{- '<|start_header_id|>system<|end_header_id|>\n\nYou may call a function. Answer with '
    'a JSON object {"name": function name, "parameters": arguments}. Functions:\n' -}}
{%- for tool in tools -%}{{- (tool | tojson) ~ '\n' -}}{%- endfor -%}
{{- '<|eot_id|>' -}}
{%- endif -%}
{%- for m in messages -%}
{%- if m.role == 'tool' -%}
{{- '<|start_header_id|>ipython<|end_header_id|>\n\n' ~ m.content ~ '<|eot_id|>' -}}
{%- else -%}
{{- '<|start_header_id|>' ~ m.role ~ '<|end_header_id|>\n\n' -}}
{%- if m.content is string -%}{{- m.content -}}{%- endif -%}
{%- for call in m.tool_calls or [] -%}
{%- set f = call.function if call.function is defined else call -%}
{%- set args = f.arguments if f.arguments is string else f.arguments | tojson -%}
{{- '{"name": ' ~ (f.name | tojson) ~ ', "parameters": ' ~ args ~ '}' -}}
{%- endfor -%}
{{- '<|eot_id|>' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
{%- endif -%}
"""


def corpus() -> list[str]:
    """A fixed training text: prose, numbers, code, JSON calls and chat markup."""
    prose = [
        "The quick brown fox jumps over the lazy dog while the cat sleeps by the fire.",
        "A small model can still exercise every path of a serving stack end to end.",
        "The weather today is sunny with a light breeze from the west and clear skies.",
        "What is the capital of France? The capital of France is Paris, on the Seine.",
        "Hello! How can I help you today? I can answer questions, write code and plan.",
        "Name three colours: red, green and blue. Count to five: one, two, three, four, five.",
        "Write one sentence about the sea: the sea is wide, deep and always moving.",
    ]
    words = ["alpha", "beta", "gamma", "delta", "llama", "server", "token", "layer",
             "image", "model", "cache", "request", "answer", "number", "weather", "city"]
    lines = list(prose)
    for i, a in enumerate(words):
        for j, b in enumerate(words):
            lines.append(f"The {a} {['reads', 'writes', 'checks', 'returns'][(i + j) % 4]} "
                         f"the {b} {['now', 'again', 'twice', 'later'][(i * j) % 4]}.")
    lines += [f"{n} + {n + 2} = {2 * n + 2}" for n in range(0, 300, 11)]
    lines += [json.dumps({"name": name, "parameters": {"city": city}})
              for name in ("get_weather", "get_time") for city in ("Paris", "Lima", "Oslo")]
    lines += ["def add(a, b):\n    return a + b\n", "for i in range(10):\n    print(i)\n"]
    lines += ["<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
              "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"]
    return lines


def build_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB - len(SPECIAL), min_frequency=1,
                                  show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[])
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    return tok


def config(vocab: int, ids: dict[str, int]) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HIDDEN // HEADS,
        "hidden_act": "silu",
        "vocab_size": vocab,
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": ids["<|begin_of_text|>"],
        "eos_token_id": [ids["<|end_of_text|>"], ids["<|eot_id|>"], ids["<|eom_id|>"]],
        "torch_dtype": "bfloat16",
    }


def tokenizer_config(ids: dict[str, int]) -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": {
            str(ids[t]): {"content": t, "lstrip": False, "normalized": False,
                          "rstrip": False, "single_word": False, "special": True}
            for t in SPECIAL},
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
        "pad_token": "<|end_of_text|>",
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITIONS,
        "chat_template": CHAT_TEMPLATE,
    }


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounding to nearest even."""
    bits = np.ascontiguousarray(x, dtype="<f4").view("<u4")
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (rounded >> np.uint32(16)).astype("<u2")


def weights(vocab: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def normal(*shape: int) -> np.ndarray:
        return to_bf16(rng.normal(0.0, 0.02, size=shape).astype(np.float32))

    def ones(n: int) -> np.ndarray:
        return to_bf16(np.ones(n, dtype=np.float32))

    head = HIDDEN // HEADS
    q, kv = HEADS * head, KV_HEADS * head
    out = {"model.embed_tokens.weight": normal(vocab, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out |= {
            p + "input_layernorm.weight": ones(HIDDEN),
            p + "self_attn.q_proj.weight": normal(q, HIDDEN),
            p + "self_attn.k_proj.weight": normal(kv, HIDDEN),
            p + "self_attn.v_proj.weight": normal(kv, HIDDEN),
            p + "self_attn.o_proj.weight": normal(HIDDEN, q),
            p + "post_attention_layernorm.weight": ones(HIDDEN),
            p + "mlp.gate_proj.weight": normal(INTERMEDIATE, HIDDEN),
            p + "mlp.up_proj.weight": normal(INTERMEDIATE, HIDDEN),
            p + "mlp.down_proj.weight": normal(HIDDEN, INTERMEDIATE),
        }
    out["model.norm.weight"] = ones(HIDDEN)
    out["lm_head.weight"] = normal(vocab, HIDDEN)
    return out


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def make(out: Path, seed: int = 0) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    vocab = tok.get_vocab_size(with_added_tokens=True)
    ids = {t: tok.token_to_id(t) for t in SPECIAL}
    assert all(i is not None for i in ids.values()), ids  # added above
    tok.save(str(out / "tokenizer.json"))
    write_json(out / "tokenizer_config.json", tokenizer_config(ids))
    write_json(out / "config.json", config(vocab, ids))
    write_json(out / "generation_config.json", {
        "bos_token_id": ids["<|begin_of_text|>"],
        "eos_token_id": [ids["<|end_of_text|>"], ids["<|eot_id|>"], ids["<|eom_id|>"]],
        "do_sample": True, "temperature": 0.6, "top_p": 0.9})
    tensors = weights(vocab, seed)
    specs = {name: TensorSpec(dtype="bfloat16", shape=list(a.shape), data_ptr=a.ctypes.data,
                              data_len=a.nbytes) for name, a in tensors.items()}
    serialize_file(specs, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "model.safetensors").chmod(0o644)  # a non-root server must read it


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    make(args.out_dir, args.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
