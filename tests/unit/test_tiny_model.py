"""The tiny cpu model: same bytes every run, a config vLLM serves, a working tokenizer."""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "make_tiny_model.py"
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MARKERS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]


def make(out: Path, seed: int = 0) -> Path:
    subprocess.run([sys.executable, str(SCRIPT), str(out), "--seed", str(seed)], check=True)
    return out


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def safetensors_header(path: Path) -> dict:
    raw = path.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + size])


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make(tmp_path_factory.mktemp("tiny") / "model")


def test_two_runs_write_identical_bytes(model: Path, tmp_path: Path) -> None:
    again = digests(make(tmp_path / "again"))
    assert again == digests(model)
    assert set(again) >= {"config.json", "generation_config.json", "tokenizer.json",
                          "tokenizer_config.json", "model.safetensors"}


def test_seed_changes_weights_only(model: Path, tmp_path: Path) -> None:
    other = digests(make(tmp_path / "seed1", seed=1))
    base = digests(model)
    assert other["model.safetensors"] != base["model.safetensors"]
    assert other["tokenizer.json"] == base["tokenizer.json"]
    assert other["config.json"] == base["config.json"]


def test_config_is_a_generative_qwen3_the_cpu_backend_accepts(model: Path) -> None:
    cfg = json.loads((model / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"]
    assert cfg["model_type"] == "qwen3"
    assert (cfg["hidden_size"], cfg["num_hidden_layers"]) == (64, 2)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (4, 2)
    assert cfg["head_dim"] >= 32  # CPU attention rejects smaller heads
    assert cfg["torch_dtype"] == "bfloat16"
    assert cfg["max_position_embeddings"] >= 512
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    assert cfg["vocab_size"] == tok.get_vocab_size(with_added_tokens=True)
    assert 1500 <= cfg["vocab_size"] <= 4096
    assert cfg["eos_token_id"] == tok.token_to_id("<|im_end|>")


def test_weights_are_bf16_with_the_config_shapes(model: Path) -> None:
    cfg = json.loads((model / "config.json").read_text())
    header = safetensors_header(model / "model.safetensors")
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    assert {v["dtype"] for v in tensors.values()} == {"BF16"}
    vocab, hidden = cfg["vocab_size"], cfg["hidden_size"]
    q = cfg["num_attention_heads"] * cfg["head_dim"]
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    assert tensors["model.embed_tokens.weight"]["shape"] == [vocab, hidden]
    assert tensors["lm_head.weight"]["shape"] == [vocab, hidden]
    for i in range(cfg["num_hidden_layers"]):
        attn = f"model.layers.{i}.self_attn."
        assert tensors[attn + "q_proj.weight"]["shape"] == [q, hidden]
        assert tensors[attn + "k_proj.weight"]["shape"] == [kv, hidden]
        assert tensors[attn + "q_norm.weight"]["shape"] == [cfg["head_dim"]]
    index = json.loads((model / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(tensors)
    size = (model / "model.safetensors").stat().st_size
    assert 300_000 < size < 1_500_000
    assert (model / "model.safetensors").stat().st_mode & 0o044 == 0o044  # readable by all


def test_tokenizer_round_trips_with_chat_and_parser_tokens(model: Path) -> None:
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    text = ('<|im_start|>user\nWeather in Paris? <think>hmm</think>'
            '<tool_call>{"name": "f"}</tool_call>héllo ☃<|im_end|><|endoftext|>')
    enc = tok.encode(text)
    assert tok.decode(enc.ids, skip_special_tokens=False) == text
    for t in SPECIAL + MARKERS:
        tid = tok.token_to_id(t)
        assert tid is not None, t
        assert enc.ids.count(tid) == 1, t  # one id each, never split into pieces
    # The markers are not special: parsers must still see them after special tokens go.
    plain = tok.decode(enc.ids, skip_special_tokens=True)
    assert all(m in plain for m in MARKERS)
    assert not any(s in plain for s in SPECIAL)


def render(model: Path, **kw) -> str:
    # The environment transformers renders chat templates in.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, **k: json.dumps(x, **k)
    cfg = json.loads((model / "tokenizer_config.json").read_text())
    return env.from_string(cfg["chat_template"]).render(**kw)


def test_chat_template_renders_tools_calls_and_thinking(model: Path) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    msgs = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function",
                         "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": '{"t": 21}'},
    ]
    out = render(model, messages=msgs, tools=tools, add_generation_prompt=True)
    assert '"name": "get_weather"' in out.split("\n</tools>")[0]
    call = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    assert f"<tool_call>\n{call}\n</tool_call>" in out
    assert "<|im_start|>user\n<tool_response>\n{\"t\": 21}\n</tool_response><|im_end|>" in out
    assert out.endswith("<|im_start|>assistant\n<think>\n")
    off = render(model, messages=msgs[:1], add_generation_prompt=True, enable_thinking=False)
    assert off == "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n" \
        "<think>\n\n</think>\n\n"
