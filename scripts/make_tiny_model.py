#!/usr/bin/env python3
"""Write the tiny Qwen3-architecture checkpoint the cpu target serves.

    python scripts/make_tiny_model.py OUT_DIR [--seed 0]

No hub download: the config, a byte-level BPE tokenizer trained on the fixed corpus below,
a Qwen-style chat template (tools + thinking) and random bf16 weights from a fixed seed.
The same seed gives the same bytes in every file, so the model layer of a serve image
caches and its hash can be pinned. Needs numpy, safetensors and tokenizers; not torch.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
from safetensors import TensorSpec, serialize_file
from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    trainers,
)

# The BPE trainer counts in parallel; one thread keeps its tie-breaking order fixed. Read
# when the thread pool starts (first training call), so setting it after import is enough.
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Shape from docs/cpu-engine.md ("Serving a tiny model"): head_dim 32 is the CPU attention
# backend's minimum; Qwen3ForCausalLM is what makes vLLM serve it as a generative model.
HIDDEN = 64
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 32
INTERMEDIATE = 128
MAX_POSITIONS = 1024
BPE_VOCAB = 2048  # with the added tokens; the made-up words give enough merges to reach it
WORDS = 1600

SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Not special, as in Qwen3: the reasoning and tool parsers look them up in the vocabulary,
# and they must survive skip_special_tokens when the text is returned.
MARKERS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
           "</tool_response>")

# Qwen2-style pre-tokenization: split words, single digits, punctuation runs, newlines.
SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Written for this project. Renders system/user/assistant/tool turns in ChatML; tools go
# into the system turn as JSON schemas, calls as <tool_call>{json}</tool_call> (what the
# hermes parser reads); thinking is opened in the generation prompt unless
# enable_thinking is false, when an empty think block is closed for the model.
CHAT_TEMPLATE = r"""
{%- set sys = messages[0].content if messages and messages[0].role == 'system' else none -%}
{%- if tools -%}
{{- '<|im_start|>system\n' -}}
{{- sys ~ '\n\n' if sys else '' -}}
{{- '# Tools\n\nYou may call one or more functions. Their signatures, as JSON schemas, are'
    ' inside <tools></tools>:\n<tools>' -}}
{%- for tool in tools -%}{{- '\n' ~ (tool | tojson) -}}{%- endfor -%}
{{- '\n</tools>\n\nTo call a function, answer with one JSON object per call inside'
    ' <tool_call></tool_call>:\n<tool_call>\n{"name": <function-name>, "arguments":'
    ' <arguments-as-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif sys -%}
{{- '<|im_start|>system\n' ~ sys ~ '<|im_end|>\n' -}}
{%- endif -%}
{%- for m in messages -%}
{%- if m.role == 'system' -%}
{{- '' if loop.first else '<|im_start|>system\n' ~ m.content ~ '<|im_end|>\n' -}}
{%- elif m.role == 'user' -%}
{{- '<|im_start|>user\n' ~ m.content ~ '<|im_end|>\n' -}}
{%- elif m.role == 'assistant' -%}
{{- '<|im_start|>assistant\n' -}}
{%- if m.reasoning_content -%}
{{- '<think>\n' ~ (m.reasoning_content | trim) ~ '\n</think>\n\n' -}}
{%- endif -%}
{{- m.content or '' -}}
{%- for call in m.tool_calls or [] -%}
{%- set f = call.function if call.function is defined else call -%}
{%- set args = f.arguments if f.arguments is string else f.arguments | tojson -%}
{{- '\n' if m.content or not loop.first else '' -}}
{{- '<tool_call>\n{"name": ' ~ (f.name | tojson) ~ ', "arguments": ' ~ args ~ '}\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\n' -}}
{%- elif m.role == 'tool' -%}
{{- '<|im_start|>user' if loop.first or loop.previtem.role != 'tool' else '' -}}
{{- '\n<tool_response>\n' ~ m.content ~ '\n</tool_response>' -}}
{{- '<|im_end|>\n' if loop.last or loop.nextitem.role != 'tool' else '' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- if enable_thinking is defined and not enable_thinking -%}
{{- '<think>\n\n</think>\n\n' -}}
{%- else -%}
{{- '<think>\n' -}}
{%- endif -%}
{%- endif -%}
"""


def corpus() -> list[str]:
    """A fixed training text: prose, numbers, code, JSON and chat markup."""
    prose = [
        "The quick brown fox jumps over the lazy dog while the cat sleeps by the fire.",
        "A small model can still exercise every path of a serving stack end to end.",
        "Speculative decoding drafts a few tokens and the target model verifies them all.",
        "The weather today is sunny with a light breeze from the west and clear skies.",
        "Please summarize the following document in three short sentences for a reader.",
        "What is the capital of France? The capital of France is Paris, on the Seine.",
        "Hello! How can I help you today? I can answer questions, write code and plan.",
        "Once upon a time there was a little robot who wanted to learn how to paint.",
        "The engine loads the weights, allocates the cache and starts the scheduler.",
        "Think step by step, then give the final answer on its own line at the end.",
    ]
    subjects = ["the server", "a user", "the model", "our team", "the scheduler", "a worker",
                "the builder", "this image", "the registry", "every request"]
    verbs = ["reads", "writes", "builds", "tests", "pushes", "loads", "starts", "stops",
             "checks", "returns", "streams", "measures", "caches", "verifies", "tags"]
    objects = ["the answer", "a token", "the weights", "an image", "the config", "a layer",
               "the tokenizer", "a digest", "the metrics", "a response", "the prompt",
               "a release", "the lock file", "some numbers", "the patch"]
    adverbs = ["quickly", "slowly", "again", "today", "carefully", "twice", "later", "now"]
    lines = list(prose)
    for i, s in enumerate(subjects):
        for j, v in enumerate(verbs):
            o = objects[(i * 7 + j) % len(objects)]
            a = adverbs[(i + j) % len(adverbs)]
            lines.append(f"{s.capitalize()} {v} {o} {a}.")
    lines += [f"{n} + {n + 1} = {2 * n + 1}; {n} * 3 = {3 * n}" for n in range(0, 200, 7)]
    code = [
        "def add(a, b):\n    return a + b\n",
        "for i in range(10):\n    print(i, i * i)\n",
        "import json\nwith open('config.json') as fh:\n    data = json.load(fh)\n",
        "class Server:\n    def __init__(self, host, port):\n        self.host = host\n",
        "if __name__ == \"__main__\":\n    main()\n",
        "SELECT name, size FROM images WHERE tag = 'latest' ORDER BY created DESC;",
        "docker build --network host -t tiny:latest .\n",
    ]
    tool_json = [
        json.dumps({"name": name, "arguments": {"city": city, "unit": unit}})
        for name in ("get_weather", "get_time", "search")
        for city in ("Paris", "Berlin", "Tokyo", "Lima")
        for unit in ("celsius", "fahrenheit")
    ]
    chat = [
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n",
        "<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n",
        "<|im_start|>assistant\n<think>\nThe user asks about weather.\n</think>\n\n",
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
        "</tool_call><|im_end|>\n",
        "<tool_response>\n{\"temperature\": 21}\n</tool_response>\n",
    ]
    return lines + code + tool_json + chat + made_up_words()


def made_up_words() -> list[str]:
    """Syllable words fill the vocabulary to ~2k merges; each appears in two spellings so
    both the bare and the space-prefixed forms are learned."""
    onsets = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "ch", "st"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ou"]
    codas = ["", "n", "r", "s", "l", "th"]
    syllables = [o + v + c for o in onsets for v in vowels for c in codas]
    # A fixed stride through the syllable pairs gives varied words without a random source.
    words = [syllables[(i * 37) % len(syllables)] + syllables[(i * 61 + 11) % len(syllables)]
             for i in range(WORDS)]
    return [" ".join(words[i:i + 8]) + ". " + " ".join(w.capitalize() for w in words[i:i + 8])
            for i in range(0, len(words), 8)]


def build_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB - len(SPECIAL) - len(MARKERS),
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    # Ids after the BPE vocabulary, as in Qwen: specials first, then the markers.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKERS])
    return tok


def config(vocab: int, ids: dict[str, int]) -> dict:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "vocab_size": vocab,
        "max_position_embeddings": MAX_POSITIONS,
        "max_window_layers": LAYERS,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "sliding_window": None,
        "use_sliding_window": False,
        "use_cache": True,
        "tie_word_embeddings": False,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "torch_dtype": "bfloat16",
    }


def generation_config(ids: dict[str, int]) -> dict:
    return {
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
        "pad_token_id": ids["<|endoftext|>"],
        "do_sample": True,
        "temperature": 0.6,
        "top_k": 20,
        "top_p": 0.95,
    }


def tokenizer_config(ids: dict[str, int]) -> dict:
    decoder = {
        str(ids[t]): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": t in SPECIAL}
        for t in SPECIAL + MARKERS
    }
    return {
        "tokenizer_class": "Qwen2Tokenizer",
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "split_special_tokens": False,
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

    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    out = {"model.embed_tokens.weight": normal(vocab, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out |= {
            p + "input_layernorm.weight": ones(HIDDEN),
            p + "self_attn.q_proj.weight": normal(q, HIDDEN),
            p + "self_attn.k_proj.weight": normal(kv, HIDDEN),
            p + "self_attn.v_proj.weight": normal(kv, HIDDEN),
            p + "self_attn.o_proj.weight": normal(HIDDEN, q),
            p + "self_attn.q_norm.weight": ones(HEAD_DIM),
            p + "self_attn.k_norm.weight": ones(HEAD_DIM),
            p + "post_attention_layernorm.weight": ones(HIDDEN),
            p + "mlp.gate_proj.weight": normal(INTERMEDIATE, HIDDEN),
            p + "mlp.up_proj.weight": normal(INTERMEDIATE, HIDDEN),
            p + "mlp.down_proj.weight": normal(HIDDEN, INTERMEDIATE),
        }
    out["model.norm.weight"] = ones(HIDDEN)
    out["lm_head.weight"] = normal(vocab, HIDDEN)
    return out


def save_bf16(tensors: dict[str, np.ndarray], path: Path) -> int:
    specs = {
        name: TensorSpec(dtype="bfloat16", shape=list(a.shape), data_ptr=a.ctypes.data,
                         data_len=a.nbytes)
        for name, a in tensors.items()
    }
    serialize_file(specs, str(path), metadata={"format": "pt"})
    path.chmod(0o644)  # serialize_file creates 0600; a non-root server must read it
    return sum(a.nbytes for a in tensors.values())


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def make(out: Path, seed: int = 0) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    vocab = tok.get_vocab_size(with_added_tokens=True)
    ids: dict[str, int] = {}
    for t in SPECIAL + MARKERS:
        tid = tok.token_to_id(t)
        assert tid is not None, t  # added above; a miss is a bug in this script
        ids[t] = tid
    tok.save(str(out / "tokenizer.json"))
    write_json(out / "tokenizer_config.json", tokenizer_config(ids))
    write_json(out / "config.json", config(vocab, ids))
    write_json(out / "generation_config.json", generation_config(ids))
    tensors = weights(vocab, seed)
    total = save_bf16(tensors, out / "model.safetensors")
    write_json(out / "model.safetensors.index.json", {
        "metadata": {"total_size": total},
        "weight_map": {name: "model.safetensors" for name in sorted(tensors)},
    })


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    make(args.out_dir, args.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
