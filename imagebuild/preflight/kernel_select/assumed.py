"""The quantization layouts a checkpoint declared `quantization: X` in matrix.yaml can have
while its metadata is not locked yet (`build.py lock` has not reached the Hub): `check`
predicts every one of them and says which would not meet the profile; once locked/ holds
the checkpoint's own config.json and hf_quant_config.json, only the real one counts.

Each layout is written the way its exporter writes it (llm-compressor's compressed-tensors
NVFP4 groups; ModelOpt's config.json quantization_config), over the layer names of a
Qwen3.5/3.6 hybrid MoE (vision tower, Gated DeltaNet projections, routers and the MTP head
left unquantized, as both NVFP4 exports of Qwen3.6-35B-A3B in docs/domain.md do).
"""

from __future__ import annotations

import copy

_NVFP4 = {"num_bits": 4, "type": "float", "symmetric": True, "group_size": 16,
          "strategy": "tensor_group", "dynamic": False, "observer": "minmax"}
CT_IGNORE = ["lm_head", "re:.*visual.*", "re:.*linear_attn.*", "re:.*mlp.gate$",
             "re:.*mlp.shared_expert_gate$", "re:^mtp.*"]
MODELOPT_EXCLUDE = ["lm_head", "model.visual*", "*linear_attn*", "*mlp.gate", "mtp*"]


def ct_nvfp4(inputs: bool, ignore: list[str] | None = None) -> dict:
    """compressed-tensors NVFP4: W4A4 (NVFP4 inputs too) or W4A16 (weights only)."""
    group = {"targets": ["Linear"], "format": "nvfp4-pack-quantized",
             "weights": dict(_NVFP4),
             "input_activations": {**_NVFP4, "dynamic": "local"} if inputs else None}
    return {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
            "quantization_status": "compressed", "kv_cache_scheme": None,
            "config_groups": {"group_0": group},
            "ignore": list(CT_IGNORE if ignore is None else ignore)}


def modelopt(algo: str) -> dict:
    """ModelOpt (>= 0.39, config.json layout) NVFP4 or W4A16_NVFP4 everywhere."""
    return {"quant_method": "modelopt", "quant_algo": algo, "group_size": 16,
            "kv_cache_quant_algo": None, "ignore": list(MODELOPT_EXCLUDE)}


def modelopt_mixed(experts: str, layers: int = 40, interval: int = 4) -> dict:
    """ModelOpt MIXED_PRECISION: NVFP4-family experts and shared-expert MLP, FP8 full
    attention projections (docs/domain.md: the official Qwen3.6-35B-A3B NVFP4)."""
    quantized = {}
    for i in range(layers):
        base = f"model.language_model.layers.{i}"
        quantized[f"{base}.mlp.experts"] = {"quant_algo": experts, "group_size": 16}
        for p in ("gate_proj", "up_proj", "down_proj"):
            quantized[f"{base}.mlp.shared_expert.{p}"] = {"quant_algo": experts,
                                                         "group_size": 16}
        if (i + 1) % interval == 0:
            for p in ("q_proj", "k_proj", "v_proj", "o_proj"):
                quantized[f"{base}.self_attn.{p}"] = {"quant_algo": "FP8"}
    return {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
            "kv_cache_quant_algo": None, "producer": {"name": "modelopt", "version": "0.39.0"},
            "ignore": list(MODELOPT_EXCLUDE), "quantized_layers": quantized}


def layouts(quantization: str | None) -> dict[str, dict | None]:
    """name -> the config.json quantization_config of each layout `quantization` can be."""
    if quantization == "compressed-tensors":
        return {"NVFP4 W4A4": ct_nvfp4(True), "NVFP4 W4A16": ct_nvfp4(False)}
    if quantization == "modelopt":
        return {"NVFP4": modelopt("NVFP4"), "W4A16_NVFP4": modelopt("W4A16_NVFP4"),
                "MIXED_PRECISION (NVFP4 experts, FP8 attention)": modelopt_mixed("NVFP4"),
                "MIXED_PRECISION (W4A16_NVFP4 experts, FP8 attention)":
                    modelopt_mixed("W4A16_NVFP4")}
    if quantization is None:
        return {"unquantized": None}
    return {}


def with_layout(config: dict, layout: dict | None) -> dict:
    out = copy.deepcopy(config)
    out.pop("quantization_config", None)
    if layout is not None:
        out["quantization_config"] = copy.deepcopy(layout)
    return out
