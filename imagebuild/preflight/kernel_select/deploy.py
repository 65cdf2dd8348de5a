"""A predict.Deployment from what a boot is made of: the checkpoint's files, vLLM's engine
arguments (as `vllm serve` flags set them), the environment and the GPU (capability and
what the image ships). `check` builds it from a cell; the oracle test from its case table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from imagebuild.preflight.kernel_select.facts import Facts, NotRecorded, VllmRaises
from imagebuild.preflight.kernel_select.layers import model_layers
from imagebuild.preflight.kernel_select.predict import Deployment, Device, Drafter, Serve
from imagebuild.preflight.kv.dtypes import checkpoint_kv
from imagebuild.preflight.kv.errors import VllmRefuses

# EngineArgs fields (vllm serve flags) that take part in a kernel choice; the rest are
# not read by any selecting function
ENGINE_FIELDS = ("quantization", "moe_backend", "linear_backend", "attention_backend",
                 "kv_cache_dtype", "block_size", "tensor_parallel_size",
                 "enable_expert_parallel", "enable_lora", "logprobs_mode",
                 "speculative_config")
# speculative methods whose drafter vLLM builds as a model (the others draft without one)
MODEL_DRAFTERS = {"mtp": None, "dflash": "drafter", "eagle": "drafter", "eagle3": "drafter"}


def _arch(config: Mapping[str, Any]) -> str:
    archs = config.get("architectures") or []
    if not archs:
        raise NotRecorded("config.json names no architecture")
    return str(archs[0])


def _kv(config: dict, hf_quant: dict | None, flag: str) -> tuple[str, bool]:
    """The kv_cache_dtype the attention layers pass to the backend selector, and whether
    they ask for per-head scales (attention.py: a compressed-tensors kv_cache_scheme turns
    `auto` into fp8; strategy attn_head asks for per-head scales)."""
    if flag != "auto":
        return flag, False
    try:
        found = checkpoint_kv(config, hf_quant)
    except VllmRefuses as exc:
        raise VllmRaises(exc.kind, exc.message) from None
    q = config.get("quantization_config") or {}
    scheme = q.get("kv_cache_scheme") if isinstance(q, dict) else None
    per_head = isinstance(scheme, dict) and scheme.get("strategy") == "attn_head"
    return (found.cache_dtype or "auto"), per_head


def deployment(facts: Facts, *, cc: str, probes: Mapping[str, bool], config: dict,
               files: Mapping[str, Any] | None, engine: Mapping[str, Any],
               env: Mapping[str, str], drafter_config: dict | None = None) -> Deployment:
    """Raises VllmRaises when vLLM refuses the checkpoint before any layer is built, and
    NotRecorded when the facts do not cover it."""
    unknown = set(engine) - set(ENGINE_FIELDS)
    if unknown:
        raise NotRecorded(f"engine arguments {sorted(unknown)} are not modelled")
    hf_quant = (files or {}).get("hf_quant_config.json")
    flag = engine.get("quantization")
    kv, per_head = _kv(config, hf_quant, str(engine.get("kv_cache_dtype") or "auto"))
    arch = _arch(config)
    target = replace(model_layers(facts, arch, config, hf_quant, flag, kv),
                     per_head_quant_scales=per_head)
    backend = engine.get("attention_backend")
    serve = Serve(moe_backend=str(engine.get("moe_backend") or "auto").lower().replace("-", "_"),
                  linear_backend=str(engine.get("linear_backend") or "auto").lower()
                  .replace("-", "_"),
                  attention_backend=None if backend is None else str(backend).upper(),
                  block_size=engine.get("block_size"),
                  tensor_parallel_size=int(engine.get("tensor_parallel_size") or 1),
                  expert_parallel=bool(engine.get("enable_expert_parallel")),
                  lora=bool(engine.get("enable_lora")),
                  logprobs_mode=str(engine.get("logprobs_mode") or "raw_logprobs"))
    drafter = None
    spec = engine.get("speculative_config") or None
    if spec and spec.get("method") in MODEL_DRAFTERS:
        method = spec["method"]
        if method == "mtp":  # the head's class, as vLLM resolved it for the archetype
            darch = (facts["archetypes"].get(arch) or {}).get("drafters", {}).get("mtp")
            if darch is None:
                raise NotRecorded(f"the MTP head class of {arch} is not recorded")
            layers = replace(model_layers(facts, darch, config, hf_quant, flag, kv),
                             per_head_quant_scales=per_head)
        else:
            if drafter_config is None:
                raise NotRecorded(f"the {method} drafter's config.json is not locked")
            # one cache config for every layer: the target's resolved KV dtype (a
            # compressed-tensors kv_cache_scheme rewrites cache_config.cache_dtype while the
            # target's attention layers are built, attention.py 237-241)
            layers = model_layers(facts, _arch(drafter_config), drafter_config, None,
                                  spec.get("quantization"), kv)
        dback = spec.get("attention_backend")
        dmoe = spec.get("moe_backend")
        drafter = Drafter(method=method, layers=layers,
                          moe_backend=None if dmoe is None else str(dmoe).lower(),
                          attention_backend=None if dback is None else str(dback).upper())
    return Deployment(device=Device(cc=cc, probes=dict(probes)), target=target, serve=serve,
                      env=dict(env), drafter=drafter)
