"""Write tests/data/hub: recorded Hub answers for the repos the matrix pins.

    .venv/bin/python -m tests.support.hub.make_fixtures [OUT_DIR]

This machine cannot reach the Hub, so the answers are recorded in the Hub's shape with
contents from the project's domain notes (docs: Qwen3.6-35B-A3B target config, drafter
facts, quantization formats, checkpoint traps). Two commit SHAs are real public pins
(z-lab small-page drafter 31977fbe13a8..., nvidia NVFP4 491c2f1ea524...); every other SHA
is invented, starts with `fa6e`, and is marked `"fixture_only": true` in repo.json.
tests/unit/test_hub.py checks that the committed fixtures equal this script's output.

Kept small on purpose: the safetensors indexes list MoE experts fused per layer
(`mlp.experts.gate_up_proj.*`) instead of 256 per-expert entries (the real indexes are
~10 MB); everything else (vision tensor names and counts, file lists, shard sizes, LFS
shape) follows the real checkpoints.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

from tests.support.paths import HUB_DATA

ZLAB = "z-lab/Qwen3.6-35B-A3B-DFlash"
AEON_DRAFTER = "AEON-7/AEON-DFlash-Qwen3.6-35B-A3B"
HERETIC = "AEON-7/Qwen3.6-35B-A3B-heretic-NVFP4"
NVIDIA = "nvidia/Qwen3.6-35B-A3B-NVFP4"
ORNITH = "AEON-7/Ornith-1.0-35B-AEON-Ultimate-Uncensored"
GATED = "imagebuild-fixtures/gated-NVFP4"
PRIVATE = "imagebuild-fixtures/private-drafter"
MISPLACED = "imagebuild-fixtures/misplaced-vision-NVFP4"
HEX_BRANCH = "imagebuild-fixtures/hex-named-branch"

ZLAB_SMALL_PAGE_SHA = "31977fbe13a86e8b961774f773058175676d89b8"  # docs/domain.md known pin
NVIDIA_SHA = "491c2f1ea524c639598bf8fa787a93fed5a6fbce"  # docs/domain.md, seen pinned 2026-08-23
AUTHORIZED_TOKEN = "hf_imagebuildFixtureAuthorized"  # mirrored in tests/support/hub/__init__.py


def _hex(label: str, n: int = 40) -> str:
    return hashlib.sha256(label.encode()).hexdigest()[:n]


def fixture_sha(label: str) -> str:
    """An invented commit SHA; the `fa6e` prefix marks it as fake at a glance."""
    return "fa6e" + _hex("commit:" + label, 36)


def _json(data: dict) -> bytes:
    return (json.dumps(data, indent=2) + "\n").encode()


# -- configs ------------------------------------------------------------------------------
LAYERS = 40
LAYER_TYPES = (["linear_attention"] * 3 + ["full_attention"]) * (LAYERS // 4)
EOS, IM_END, PAD = 248044, 248046, 248044


def text_config() -> dict:
    """Qwen3.6-35B-A3B text_config: the numbers from docs/domain.md "Target config"."""
    return {
        "model_type": "qwen3_5_moe_text",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_output_gate": True,
        "bos_token_id": EOS,
        "dtype": "bfloat16",
        "eos_token_id": EOS,
        "full_attention_interval": 4,
        "head_dim": 256,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "initializer_range": 0.02,
        "layer_types": LAYER_TYPES,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_value_head_dim": 128,
        "mamba_ssm_dtype": "float32",
        "max_position_embeddings": 262144,
        "moe_intermediate_size": 512,
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "num_attention_heads": 16,
        "num_experts": 256,
        "num_experts_per_tok": 8,
        "num_hidden_layers": LAYERS,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {
            "mrope_interleaved": True,
            "mrope_section": [11, 11, 10],
            "partial_rotary_factor": 0.25,
            "rope_theta": 10000000,
            "rope_type": "default",
        },
        "router_aux_loss_coef": 0.001,
        "shared_expert_intermediate_size": 512,
        "use_cache": True,
        "vocab_size": 248320,
    }


def vision_config() -> dict:
    return {
        "model_type": "qwen3_5_moe",
        "deepstack_visual_indexes": [],
        "depth": 27,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 1152,
        "in_channels": 3,
        "initializer_range": 0.02,
        "intermediate_size": 4304,
        "num_heads": 16,
        "num_position_embeddings": 2304,
        "out_hidden_size": 2048,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    }


def compressed_tensors_quant() -> dict:
    """llm-compressor NVFP4 (the AEON checkpoints): serve with compressed-tensors."""
    fp4 = {
        "num_bits": 4,
        "type": "float",
        "symmetric": True,
        "group_size": 16,
        "strategy": "tensor_group",
        "block_structure": None,
        "actorder": None,
        "observer": "minmax",
        "observer_kwargs": {},
    }
    return {
        "quant_method": "compressed-tensors",
        "format": "nvfp4-pack-quantized",
        "quantization_status": "compressed",
        "version": "0.12.2",
        "global_compression_ratio": None,
        "kv_cache_scheme": None,
        "sparsity_config": {},
        "transform_config": {},
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "format": "nvfp4-pack-quantized",
                "weights": {**fp4, "dynamic": False},
                "input_activations": {**fp4, "dynamic": "local"},
                "output_activations": None,
            }
        },
        "ignore": [
            "lm_head",
            "re:.*visual.*",
            "re:.*linear_attn.*",
            "re:.*mlp.gate$",
            "re:.*mlp.shared_expert_gate$",
            "re:^mtp.*",
        ],
    }


MODELOPT_EXCLUDE = ["lm_head", "model.visual*", "*linear_attn*", "*mlp.gate", "mtp*"]


def modelopt_quant() -> dict:
    """ModelOpt MIXED_PRECISION as embedded in config.json: serve with modelopt."""
    return {
        "quant_method": "modelopt",
        "quant_algo": "MIXED_PRECISION",
        "kv_cache_quant_algo": None,
        "producer": {"name": "modelopt", "version": "0.39.0"},
        "exclude_modules": MODELOPT_EXCLUDE,
    }


def hf_quant_config() -> dict:
    """NVFP4 weights only (W4A16_NVFP4) for MoE/MLP, FP8 for the full-attention projections
    (docs/domain.md); vLLM reads a plain "NVFP4" entry as W4A4."""
    layers: dict[str, dict] = {}
    for i, kind in enumerate(LAYER_TYPES):
        base = f"model.language_model.layers.{i}"
        if kind == "full_attention":
            for p in ("q_proj", "k_proj", "v_proj", "o_proj"):
                layers[f"{base}.self_attn.{p}"] = {"quant_algo": "FP8"}
        layers[f"{base}.mlp.experts"] = {"quant_algo": "W4A16_NVFP4", "group_size": 16}
        for p in ("gate_proj", "up_proj", "down_proj"):
            layers[f"{base}.mlp.shared_expert.{p}"] = {"quant_algo": "W4A16_NVFP4",
                                                       "group_size": 16}
    return {
        "producer": {"name": "modelopt", "version": "0.39.0"},
        "quantization": {
            "quant_algo": "MIXED_PRECISION",
            "kv_cache_quant_algo": None,
            "exclude_modules": MODELOPT_EXCLUDE,
            "quantized_layers": layers,
        },
    }


def target_config(quant: dict) -> dict:
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "image_token_id": 248056,
        "video_token_id": 248057,
        "vision_start_token_id": 248053,
        "vision_end_token_id": 248054,
        "tie_word_embeddings": False,
        "text_config": text_config(),
        "vision_config": vision_config(),
        "quantization_config": quant,
        "transformers_version": "5.0.0",
    }


def drafter_config(kv_heads: int, sliding_window: int | None) -> dict:
    """DFlash drafter: 8 layers, head_dim 128, reads target layers [1, 10, 19, 28, 37]."""
    if sliding_window:
        types = (["sliding_attention"] * 3 + ["full_attention"]) * 2
    else:
        types = ["full_attention"] * 8
    return {
        "architectures": ["DFlashDraftModel"],
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "block_size": 16,
        "dflash_config": {"mask_token_id": 248077, "target_layer_ids": [1, 10, 19, 28, 37]},
        "dtype": "bfloat16",
        "eos_token_id": IM_END,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "initializer_range": 0.02,
        "intermediate_size": 6144,
        "layer_types": types,
        "max_position_embeddings": 262144,
        "max_window_layers": 8,
        "num_attention_heads": 32,
        "num_hidden_layers": 8,
        "num_key_value_heads": kv_heads,
        "num_target_layers": LAYERS,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 10000000,
        "sliding_window": sliding_window,
        "tie_word_embeddings": False,
        "transformers_version": "4.57.1",
        "use_cache": True,
        "use_sliding_window": bool(sliding_window),
        "vocab_size": 248320,
    }


def generation_config() -> dict:
    return {
        "bos_token_id": EOS,
        "do_sample": True,
        "eos_token_id": [IM_END, EOS],
        "pad_token_id": PAD,
        "temperature": 0.6,
        "top_k": 20,
        "top_p": 0.95,
        "transformers_version": "5.0.0",
    }


def tokenizer_config() -> dict:
    special = {
        EOS: ("<|endoftext|>", True),
        248045: ("<|im_start|>", True),
        IM_END: ("<|im_end|>", True),
        248053: ("<|vision_start|>", True),
        248054: ("<|vision_end|>", True),
        248056: ("<|image_pad|>", True),
        248057: ("<|video_pad|>", True),
        248058: ("<tool_call>", False),
        248059: ("</tool_call>", False),
        248068: ("<think>", False),
        248069: ("</think>", False),
    }
    added = {
        str(i): {
            "content": text,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": is_special,
        }
        for i, (text, is_special) in special.items()
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 262144,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def preprocessor_config() -> dict:
    return {
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "merge_size": 2,
        "patch_size": 16,
        "temporal_patch_size": 2,
        "image_processor_type": "Qwen2VLImageProcessorFast",
        "processor_class": "Qwen3VLProcessor",
        "size": {"longest_edge": 16777216, "shortest_edge": 65536},
    }


GITATTRIBUTES = (
    "".join(
        f"*.{ext} filter=lfs diff=lfs merge=lfs -text\n"
        for ext in ("bin", "gguf", "h5", "msgpack", "onnx", "ot", "pt", "pth", "safetensors", "zip")
    )
    + "tokenizer.json filter=lfs diff=lfs merge=lfs -text\n"
)


def readme(repo_id: str, base: str, summary: str) -> bytes:
    return (
        f"---\nlicense: apache-2.0\nbase_model: {base}\nlibrary_name: transformers\n---\n\n"
        f"# {repo_id.split('/')[1]}\n\n{summary}\n\n(Recorded fixture for imagebuild tests.)\n"
    ).encode()


# -- safetensors indexes -----------------------------------------------------------------
def vision_weights(prefix: str) -> list[str]:
    """The 333 vision tensors: 27 blocks x 12, patch embed 2, pos embed 1, merger 6."""
    names = [f"{prefix}.patch_embed.proj.{p}" for p in ("weight", "bias")]
    names.append(f"{prefix}.pos_embed.weight")
    for b in range(27):
        for mod in ("attn.qkv", "attn.proj", "mlp.linear_fc1", "mlp.linear_fc2", "norm1", "norm2"):
            names += [f"{prefix}.blocks.{b}.{mod}.{p}" for p in ("weight", "bias")]
    for mod in ("norm", "linear_fc1", "linear_fc2"):
        names += [f"{prefix}.merger.{mod}.{p}" for p in ("weight", "bias")]
    return names


QUANT_SUFFIXES = {
    "compressed-tensors": (
        "weight_packed",
        "weight_scale",
        "weight_global_scale",
        "input_global_scale",
    ),
    "modelopt-nvfp4": ("weight", "weight_scale", "weight_scale_2", "input_scale"),
    "modelopt-fp8": ("weight", "weight_scale", "input_scale"),
}


def language_weights(scheme: str) -> list[str]:
    """Text-model tensor names; `scheme` is compressed-tensors or modelopt."""
    fp4 = QUANT_SUFFIXES[
        "compressed-tensors" if scheme == "compressed-tensors" else "modelopt-nvfp4"
    ]
    attn = fp4 if scheme == "compressed-tensors" else QUANT_SUFFIXES["modelopt-fp8"]
    lm = "model.language_model"
    names = [f"{lm}.embed_tokens.weight", f"{lm}.norm.weight", "lm_head.weight"]
    for i, kind in enumerate(LAYER_TYPES):
        base = f"{lm}.layers.{i}"
        names += [f"{base}.input_layernorm.weight", f"{base}.post_attention_layernorm.weight"]
        if kind == "full_attention":
            for p in ("q_proj", "k_proj", "v_proj", "o_proj"):
                names += [f"{base}.self_attn.{p}.{s}" for s in attn]
            names += [f"{base}.self_attn.{n}.weight" for n in ("q_norm", "k_norm")]
        else:
            for p in (
                "in_proj_qkv",
                "in_proj_z",
                "in_proj_b",
                "in_proj_a",
                "out_proj",
                "conv1d",
                "norm",
            ):
                names.append(f"{base}.linear_attn.{p}.weight")
            names += [f"{base}.linear_attn.dt_bias", f"{base}.linear_attn.A_log"]
        names += [f"{base}.mlp.gate.weight", f"{base}.mlp.shared_expert_gate.weight"]
        for p in ("gate_proj", "up_proj", "down_proj"):
            names += [f"{base}.mlp.shared_expert.{p}.{s}" for s in fp4]
        for p in ("gate_up_proj", "down_proj"):  # fused here; see the module docstring
            names += [f"{base}.mlp.experts.{p}.{s}" for s in fp4]
    names += [
        "mtp.fc.weight",
        "mtp.norm.weight",
        "mtp.pre_fc_norm_embedding.weight",
        "mtp.pre_fc_norm_hidden.weight",
    ]
    return names


def shard_names(n: int) -> list[str]:
    return [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]


def index(weights: list[str], sizes: list[int]) -> dict:
    shards = shard_names(len(sizes))
    per = -(-len(weights) // len(shards))
    weight_map = {w: shards[i // per] for i, w in enumerate(weights)}
    # total_size counts tensor bytes; each shard also holds its JSON header
    total = sum(sizes) - 98_304 * len(sizes)
    return {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}


# -- repo writing -------------------------------------------------------------------------
def lfs(repo_id: str, sha: str, path: str, size: int) -> dict:
    return {
        "path": path,
        "size": size,
        "blobId": _hex(f"blob:{repo_id}:{sha}:{path}"),
        "lfs": {"sha256": _hex(f"lfs:{repo_id}:{sha}:{path}", 64), "pointerSize": 135},
    }


def unrecorded(repo_id: str, sha: str, path: str, size: int) -> dict:
    """A git-stored file listed with size and blob id, whose bytes were not recorded."""
    return {"path": path, "size": size, "blobId": _hex(f"blob:{repo_id}:{sha}:{path}")}


def target_files(
    repo_id: str,
    sha: str,
    quant: str,
    shard_sizes: list[int],
    base: str,
    summary: str,
    vision_prefix: str = "model.visual",
) -> dict:
    """Files of a Qwen3.6-35B-A3B NVFP4 checkpoint: recorded bytes, listings, LFS shards."""
    cfg_quant = compressed_tensors_quant() if quant == "compressed-tensors" else modelopt_quant()
    weights = vision_weights(vision_prefix) + language_weights(quant)
    recorded = {
        ".gitattributes": GITATTRIBUTES.encode(),
        "README.md": readme(repo_id, base, summary),
        "config.json": _json(target_config(cfg_quant)),
        "generation_config.json": _json(generation_config()),
        "model.safetensors.index.json": _json(index(weights, shard_sizes)),
        "preprocessor_config.json": _json(preprocessor_config()),
        "tokenizer_config.json": _json(tokenizer_config()),
    }
    if quant == "modelopt":
        recorded["hf_quant_config.json"] = _json(hf_quant_config())
    listed = [
        unrecorded(repo_id, sha, "chat_template.jinja", 7_756),
        unrecorded(repo_id, sha, "merges.txt", 3_383_407),
        unrecorded(repo_id, sha, "vocab.json", 6_722_759),
        lfs(repo_id, sha, "tokenizer.json", 12_807_982),
    ]
    listed += [
        lfs(repo_id, sha, name, size)
        for name, size in zip(shard_names(len(shard_sizes)), shard_sizes, strict=True)
    ]
    return {"recorded": recorded, "listed": listed}


def drafter_files(repo_id: str, sha: str, cfg: dict, weights_size: int, summary: str) -> dict:
    return {
        "recorded": {
            ".gitattributes": GITATTRIBUTES.encode(),
            "README.md": readme(repo_id, "Qwen/Qwen3.6-35B-A3B", summary),
            "config.json": _json(cfg),
        },
        "listed": [
            unrecorded(repo_id, sha, "dflash.py", 14_211),
            lfs(repo_id, sha, "model.safetensors", weights_size),
        ],
    }


def write_repo(
    out: Path,
    repo_id: str,
    *,
    info: dict,
    refs: dict[str, str],
    revisions: dict[str, tuple[str, dict]],
    private: bool = False,
    gated: str | bool = False,
    authorized: tuple[str, ...] = (),
) -> None:
    repo_dir = out / repo_id
    spec_revs = {}
    for sha, (last_modified, files) in revisions.items():
        for path, data in files["recorded"].items():
            target = repo_dir / sha / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        entries = [{"path": p} for p in files["recorded"]] + files["listed"]
        spec_revs[sha] = {
            "fixture_only": sha.startswith("fa6e"),
            "lastModified": last_modified,
            "files": sorted(entries, key=lambda e: e["path"]),
        }
    spec = {
        "_note": "Recorded Hub answers for imagebuild tests; fixture_only SHAs are invented.",
        "id": repo_id,
        "private": private,
        "gated": gated,
        "authorized_tokens": list(authorized),
        "info": info,
        "refs": refs,
        "revisions": spec_revs,
    }
    repo_dir.mkdir(parents=True, exist_ok=True)
    (repo_dir / "repo.json").write_bytes(_json(spec))


def target_info(quant_tag: str, base: str) -> dict:
    return {
        "library_name": "transformers",
        "pipeline_tag": "image-text-to-text",
        "tags": [
            "transformers",
            "safetensors",
            "qwen3_5_moe",
            "image-text-to-text",
            "conversational",
            quant_tag,
            "nvfp4",
            f"base_model:quantized:{base}",
        ],
        "downloads": 18_204,
        "likes": 96,
        "createdAt": "2026-04-17T09:12:44.000Z",
    }


DRAFTER_INFO = {
    "library_name": "transformers",
    "pipeline_tag": "text-generation",
    "tags": [
        "transformers",
        "safetensors",
        "qwen3",
        "dflash",
        "speculative-decoding",
        "custom_code",
        "base_model:Qwen/Qwen3.6-35B-A3B",
    ],
    "downloads": 4_311,
    "likes": 41,
    "createdAt": "2026-04-20T14:03:10.000Z",
}
BASE = "Qwen/Qwen3.6-35B-A3B"
CT_SHARDS = [4_998_312_448, 4_996_874_112, 4_999_081_216, 4_997_533_696, 2_011_402_176]


def write_all(out: Path) -> None:
    zlab_main = fixture_sha(ZLAB + "@main-retrained")
    write_repo(
        out,
        ZLAB,
        info=DRAFTER_INFO,
        refs={"main": zlab_main},
        revisions={
            ZLAB_SMALL_PAGE_SHA: (
                "2026-04-22T08:41:05.000Z",
                drafter_files(
                    ZLAB,
                    ZLAB_SMALL_PAGE_SHA,
                    drafter_config(4, None),
                    862_341_232,
                    "DFlash drafter, 8 full-attention layers, 4 KV heads.",
                ),
            ),
            zlab_main: (
                "2026-06-09T17:22:51.000Z",
                drafter_files(
                    ZLAB,
                    zlab_main,
                    drafter_config(8, 4096),
                    929_450_096,
                    "DFlash drafter, retrained: sliding-window layers (4096), 8 KV heads.",
                ),
            ),
        },
    )

    aeon_sha = fixture_sha(AEON_DRAFTER + "@main")
    write_repo(
        out,
        AEON_DRAFTER,
        info=DRAFTER_INFO,
        refs={"main": aeon_sha},
        revisions={
            aeon_sha: (
                "2026-05-30T11:05:37.000Z",
                drafter_files(
                    AEON_DRAFTER,
                    aeon_sha,
                    drafter_config(4, None),
                    905_987_344,
                    "DFlash drafter for the AEON NVFP4 targets: 8 full-attention layers.",
                ),
            ),
        },
    )

    heretic_sha = fixture_sha(HERETIC + "@main")
    write_repo(
        out,
        HERETIC,
        info=target_info("compressed-tensors", BASE),
        refs={"main": heretic_sha},
        revisions={
            heretic_sha: (
                "2026-05-28T19:47:02.000Z",
                target_files(
                    HERETIC,
                    heretic_sha,
                    "compressed-tensors",
                    CT_SHARDS,
                    BASE,
                    "Abliterated Qwen3.6-35B-A3B, NVFP4 via llm-compressor (compressed-tensors).",
                ),
            ),
        },
    )

    write_repo(
        out,
        NVIDIA,
        info=target_info("modelopt", BASE),
        refs={"main": NVIDIA_SHA},
        revisions={
            NVIDIA_SHA: (
                "2026-08-21T03:16:29.000Z",
                target_files(
                    NVIDIA,
                    NVIDIA_SHA,
                    "modelopt",
                    [4_999_640_832, 4_998_127_360, 4_999_912_704, 4_997_201_664, 3_412_988_416],
                    BASE,
                    "Qwen3.6-35B-A3B quantized with TensorRT Model Optimizer (MIXED_PRECISION).",
                ),
            ),
        },
    )

    ornith_sha = fixture_sha(ORNITH + "@main")
    write_repo(
        out,
        ORNITH,
        info=target_info("compressed-tensors", BASE),
        refs={"main": ornith_sha},
        revisions={
            ornith_sha: (
                "2026-06-14T22:30:18.000Z",
                target_files(
                    ORNITH,
                    ornith_sha,
                    "compressed-tensors",
                    [4_998_296_064, 4_996_890_496, 4_999_064_832, 4_997_550_080, 2_011_418_560],
                    BASE,
                    "Ornith 1.0: RL post-train of Qwen3.6-35B-A3B, NVFP4 (compressed-tensors).",
                ),
            ),
        },
    )

    gated_sha = fixture_sha(GATED + "@main")
    write_repo(
        out,
        GATED,
        info=target_info("compressed-tensors", BASE),
        refs={"main": gated_sha},
        gated="manual",
        authorized=(AUTHORIZED_TOKEN,),
        revisions={
            gated_sha: (
                "2026-05-02T10:00:00.000Z",
                target_files(
                    GATED,
                    gated_sha,
                    "compressed-tensors",
                    CT_SHARDS,
                    BASE,
                    "Gated fixture: files need an authorized token.",
                ),
            ),
        },
    )

    private_sha = fixture_sha(PRIVATE + "@main")
    write_repo(
        out,
        PRIVATE,
        info=DRAFTER_INFO,
        refs={"main": private_sha},
        private=True,
        authorized=(AUTHORIZED_TOKEN,),
        revisions={
            private_sha: (
                "2026-05-03T10:00:00.000Z",
                drafter_files(
                    PRIVATE,
                    private_sha,
                    drafter_config(4, None),
                    862_341_232,
                    "Private fixture: invisible without an authorized token.",
                ),
            ),
        },
    )

    misplaced_sha = fixture_sha(MISPLACED + "@main")
    write_repo(
        out,
        MISPLACED,
        info=target_info("compressed-tensors", BASE),
        refs={"main": misplaced_sha},
        revisions={
            misplaced_sha: (
                "2026-05-05T10:00:00.000Z",
                target_files(
                    MISPLACED,
                    misplaced_sha,
                    "compressed-tensors",
                    CT_SHARDS,
                    BASE,
                    "Trap fixture: the 333 vision tensors sit under model.language_model.visual.*",
                    vision_prefix="model.language_model.visual",
                ),
            ),
        },
    )

    hex_sha = fixture_sha(HEX_BRANCH + "@main")
    write_repo(
        out,
        HEX_BRANCH,
        info=DRAFTER_INFO,
        refs={"main": hex_sha, "c0ffee1234": hex_sha},
        revisions={
            hex_sha: (
                "2026-05-06T10:00:00.000Z",
                drafter_files(
                    HEX_BRANCH,
                    hex_sha,
                    drafter_config(4, None),
                    862_341_232,
                    "Trap fixture: a branch named like a short SHA (c0ffee1234).",
                ),
            ),
        },
    )
    from tests.support.hub import fixtures_examples  # the repos examples/ pin

    fixtures_examples.write_examples(out, sys.modules[__name__])


def main(argv: list[str]) -> int:
    from tests.support.hub.fixtures_examples import EAGLE3, LLAMA

    out = Path(argv[0]) if argv else HUB_DATA
    for owner in {r.split("/")[0] for r in (ZLAB, AEON_DRAFTER, NVIDIA, GATED, LLAMA, EAGLE3)}:
        shutil.rmtree(out / owner, ignore_errors=True)  # regenerate, never merge
    write_all(out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
