"""Recorded Hub answers for the repos the example matrices (examples/) pin.

Called from make_fixtures.write_all. Configs follow the public model cards and configs of
these checkpoints as published (architecture, layer counts, head shapes, vocabularies,
file layout including Llama's `original/` folder of consolidated weights); commit SHAs are
invented (`fa6e...`, "fixture_only"), like the rest of the recordings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
EAGLE3 = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
NEMOTRON = "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-FP8"

LLAMA_LAYERS = 32
# Nemotron 3 Nano 30B-A3B: 52 layers, Mamba-2 (M), MoE (E) and 6 attention (*) layers
NEMOTRON_PATTERN = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"


def llama_config() -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009],
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 14336,
        "max_position_embeddings": 131072,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": 32,
        "num_hidden_layers": LLAMA_LAYERS,
        "num_key_value_heads": 8,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.43.0.dev0",
        "use_cache": True,
        "vocab_size": 128256,
    }


def llama_weights() -> list[str]:
    names = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
    for i in range(LLAMA_LAYERS):
        p = f"model.layers.{i}"
        names += [f"{p}.input_layernorm.weight", f"{p}.post_attention_layernorm.weight"]
        names += [f"{p}.self_attn.{x}_proj.weight" for x in ("q", "k", "v", "o")]
        names += [f"{p}.mlp.{x}_proj.weight" for x in ("gate", "up", "down")]
    return names


def eagle3_config() -> dict[str, Any]:
    """EAGLE3 head for Llama 3.1 8B: one decoder layer over the target's hidden states,
    a 32k draft vocabulary mapped onto the target's."""
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "bos_token_id": 128000,
        "draft_vocab_size": 32000,
        "eos_token_id": 128001,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 14336,
        "max_position_embeddings": 2048,
        "model_type": "llama",
        "num_attention_heads": 32,
        "num_hidden_layers": 1,
        "num_key_value_heads": 8,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "transformers_version": "4.28.1",
        "use_cache": True,
        "vocab_size": 128256,
    }


def nemotron_config() -> dict[str, Any]:
    return {
        "architectures": ["NemotronHForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "auto_map": {"AutoConfig": "configuration_nemotron_h.NemotronHConfig",
                     "AutoModelForCausalLM": "modeling_nemotron_h.NemotronHForCausalLM"},
        "bos_token_id": 1,
        "chunk_size": 128,
        "conv_kernel": 4,
        "eos_token_id": 2,
        "head_dim": 128,
        "hidden_dropout": 0.0,
        "hidden_size": 2688,
        "hybrid_override_pattern": NEMOTRON_PATTERN,
        "initializer_range": 0.02,
        "intermediate_size": 1856,
        "layer_norm_epsilon": 1e-05,
        "mamba_head_dim": 64,
        "mamba_hidden_act": "silu",
        "mamba_num_heads": 64,
        "mamba_proj_bias": False,
        "max_position_embeddings": 262144,
        "mlp_bias": False,
        "mlp_hidden_act": "relu2",
        "model_type": "nemotron_h",
        "moe_intermediate_size": 1856,
        "moe_shared_expert_intermediate_size": 3712,
        "n_group": 1,
        "n_groups": 8,
        "n_routed_experts": 128,
        "n_shared_experts": 1,
        "norm_eps": 1e-05,
        "norm_topk_prob": True,
        "num_attention_heads": 32,
        "num_experts_per_tok": 6,
        "num_hidden_layers": len(NEMOTRON_PATTERN),
        "num_key_value_heads": 2,
        "pad_token_id": 0,
        "quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8",
                                "kv_cache_quant_algo": None,
                                "producer": {"name": "modelopt", "version": "0.37.0"},
                                "exclude_modules": ["lm_head", "*mixer.conv1d*",
                                                    "*mixer.in_proj*", "*mixer.out_proj*"]},
        "rescale_prenorm_residual": True,
        "residual_in_fp32": False,
        "routed_scaling_factor": 2.5,
        "sliding_window": None,
        "ssm_state_size": 128,
        "tie_word_embeddings": False,
        "time_step_floor": 0.0001,
        "time_step_max": 0.1,
        "time_step_min": 0.001,
        "topk_group": 1,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.55.4",
        "use_bias": False,
        "use_cache": True,
        "use_conv_bias": True,
        "use_mamba_kernels": True,
        "vocab_size": 131072,
    }


def nemotron_hf_quant() -> dict[str, Any]:
    return {"producer": {"name": "modelopt", "version": "0.37.0"},
            "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": None,
                             "exclude_modules": ["lm_head", "*mixer.conv1d*",
                                                 "*mixer.in_proj*", "*mixer.out_proj*"]}}


def nemotron_weights() -> list[str]:
    names = ["backbone.embeddings.weight", "backbone.norm_f.weight", "lm_head.weight"]
    for i, kind in enumerate(NEMOTRON_PATTERN):
        p = f"backbone.layers.{i}"
        names.append(f"{p}.norm.weight")
        if kind == "M":
            names += [f"{p}.mixer.{x}" for x in ("A_log", "D", "dt_bias", "conv1d.weight",
                                                 "conv1d.bias", "in_proj.weight",
                                                 "out_proj.weight", "norm.weight")]
        elif kind == "*":
            for x in ("q", "k", "v", "o"):
                names += [f"{p}.mixer.{x}_proj.{s}" for s in ("weight", "weight_scale",
                                                              "input_scale")]
        else:  # MoE, experts fused per layer as in the other recordings
            names += [f"{p}.mixer.gate.weight", f"{p}.mixer.gate.e_score_correction_bias"]
            for x in ("experts.up_proj", "experts.down_proj", "shared_experts.up_proj",
                      "shared_experts.down_proj"):
                names += [f"{p}.mixer.{x}.{s}" for s in ("weight", "weight_scale",
                                                         "input_scale")]
    return names


def write_examples(out: Path, h: Any) -> None:
    """h: the make_fixtures module (write_repo, lfs, unrecorded, index, readme, ...)."""
    llama_sha = h.fixture_sha(LLAMA + "@main")
    shards = [4_976_698_672, 4_999_802_720, 4_915_916_176, 1_168_138_808]
    h.write_repo(
        out, LLAMA,
        info={"library_name": "transformers", "pipeline_tag": "text-generation",
              "tags": ["transformers", "safetensors", "llama", "text-generation",
                       "conversational", "facebook", "meta", "llama-3"],
              "downloads": 5_123_456, "likes": 4_321,
              "createdAt": "2024-07-18T08:56:00.000Z"},
        refs={"main": llama_sha},
        gated="manual",  # Meta's license: files need an accepted token
        authorized=(h.AUTHORIZED_TOKEN,),
        revisions={llama_sha: ("2024-09-25T17:00:57.000Z", {
            "recorded": {
                ".gitattributes": h.GITATTRIBUTES.encode(),
                "README.md": h.readme(LLAMA, "meta-llama/Llama-3.1-8B",
                                      "Llama 3.1 8B Instruct."),
                "config.json": h._json(llama_config()),
                "generation_config.json": h._json({
                    "bos_token_id": 128000, "do_sample": True,
                    "eos_token_id": [128001, 128008, 128009], "temperature": 0.6,
                    "top_p": 0.9, "transformers_version": "4.43.0.dev0"}),
                "model.safetensors.index.json": h._json(h.index(llama_weights(), shards)),
            },
            "listed": [
                h.unrecorded(LLAMA, llama_sha, "LICENSE", 7_627),
                h.unrecorded(LLAMA, llama_sha, "USE_POLICY.md", 4_691),
                h.unrecorded(LLAMA, llama_sha, "special_tokens_map.json", 296),
                h.lfs(LLAMA, llama_sha, "tokenizer.json", 9_085_657),
                h.unrecorded(LLAMA, llama_sha, "tokenizer_config.json", 55_351),
                # Meta's own format beside the safetensors: not what vLLM serves
                h.lfs(LLAMA, llama_sha, "original/consolidated.00.pth", 16_060_617_592),
                h.unrecorded(LLAMA, llama_sha, "original/params.json", 199),
                h.lfs(LLAMA, llama_sha, "original/tokenizer.model", 2_183_982),
            ] + [h.lfs(LLAMA, llama_sha, name, size)
                 for name, size in zip(h.shard_names(len(shards)), shards, strict=True)],
        })},
    )

    eagle_sha = h.fixture_sha(EAGLE3 + "@main")
    h.write_repo(
        out, EAGLE3,
        info={"library_name": "transformers", "pipeline_tag": "text-generation",
              "tags": ["pytorch", "llama", "eagle3", "speculative-decoding"],
              "downloads": 61_234, "likes": 18, "createdAt": "2025-03-10T12:00:00.000Z"},
        refs={"main": eagle_sha},
        revisions={eagle_sha: ("2025-03-12T09:30:00.000Z", {
            "recorded": {
                ".gitattributes": h.GITATTRIBUTES.encode(),
                "README.md": h.readme(EAGLE3, LLAMA, "EAGLE-3 draft head for Llama 3.1 8B."),
                "config.json": h._json(eagle3_config()),
            },
            "listed": [h.lfs(EAGLE3, eagle_sha, "pytorch_model.bin", 850_224_986)],
        })},
    )

    nemo_sha = h.fixture_sha(NEMOTRON + "@main")
    shards = [4_995_104_128, 4_998_421_376, 4_999_865_024, 4_997_932_416, 4_996_011_520,
              4_999_214_080, 2_911_703_296]
    h.write_repo(
        out, NEMOTRON,
        info={"library_name": "transformers", "pipeline_tag": "text-generation",
              "tags": ["transformers", "safetensors", "nemotron_h", "text-generation",
                       "nvidia", "fp8", "custom_code"],
              "downloads": 210_987, "likes": 312, "createdAt": "2025-12-15T16:00:00.000Z"},
        refs={"main": nemo_sha},
        revisions={nemo_sha: ("2025-12-16T10:12:00.000Z", {
            "recorded": {
                ".gitattributes": h.GITATTRIBUTES.encode(),
                "README.md": h.readme(NEMOTRON, "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
                                      "Nemotron 3 Nano 30B-A3B, FP8 (ModelOpt)."),
                "config.json": h._json(nemotron_config()),
                "hf_quant_config.json": h._json(nemotron_hf_quant()),
                "model.safetensors.index.json": h._json(h.index(nemotron_weights(), shards)),
            },
            "listed": [
                h.unrecorded(NEMOTRON, nemo_sha, "configuration_nemotron_h.py", 12_905),
                h.unrecorded(NEMOTRON, nemo_sha, "modeling_nemotron_h.py", 71_540),
                h.unrecorded(NEMOTRON, nemo_sha, "generation_config.json", 171),
                h.lfs(NEMOTRON, nemo_sha, "tokenizer.json", 17_078_330),
                h.unrecorded(NEMOTRON, nemo_sha, "tokenizer_config.json", 182_519),
            ] + [h.lfs(NEMOTRON, nemo_sha, name, size)
                 for name, size in zip(h.shard_names(len(shards)), shards, strict=True)],
        })},
    )
