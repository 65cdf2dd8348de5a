"""What each layer of a checkpoint is to vLLM: which quantization config class reads it and
which scheme every layer that consults it gets (predict.Layers), the way vLLM 0.23 decides.

The layer names are vLLM's own (the archetype's `layers` in the facts: the prefixes its
layers consult the quantization config with), after the model class's weight-name mapper.

vLLM 0.23.0 sources followed:
- which config class: transformers_utils/model_arch_config_convertor.py
  _normalize_quantization_config (ModelOpt producer block; its "Unknown ModelOpt quant algo"),
  config/model.py _verify_quantization (the override order: modelopt, modelopt_fp4,
  modelopt_mxfp8, modelopt_mixed; a --quantization that disagrees with the checkpoint);
- compressed-tensors: compressed_tensors.py from_config (attention-only groups dropped),
  get_scheme / _get_scheme_from_parts (NVFP4 weights with NVFP4 inputs: W4A4, no inputs:
  W4A16, other inputs: ValueError), compressed_tensors/utils.py should_ignore_layer and
  find_matched_target, compressed_tensors_moe.py get_moe_method (the experts are read as
  their .0.gate_proj/.0.up_proj/.0.down_proj shards, "Linear" targets match FusedMoE);
- ModelOpt: modelopt.py ModelOptQuantConfigBase.from_config and is_layer_excluded,
  apply_vllm_mapper (a trailing `*` pattern becomes two), ModelOptNvFp4Config._from_config
  (required fields of the hf_quant_config.json layout), ModelOptMixedPrecisionConfig
  _resolve_quant_algo.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from imagebuild.preflight.kernel_select.facts import Facts, NotRecorded, VllmRaises
from imagebuild.preflight.kernel_select.predict import Layers
from imagebuild.preflight.kv.dtypes import _normalized_method, quant_config
from imagebuild.preflight.kv.errors import VllmRefuses

MODELOPT_FP8 = {"FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO"}
QUANT_ALGOS = ["FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO", "NVFP4", "W4A16_NVFP4",
               "MXFP8", "MIXED_PRECISION"]  # modelopt.py QUANT_ALGOS


def method_of(config: dict, hf_quant: dict | None,
              flag: str | None) -> tuple[str | None, dict | None]:
    """(vLLM's quantization method name, the quantization config dict it reads)."""
    q = quant_config(config, hf_quant)
    if q is None:
        text = config.get("text_config")
        q = quant_config(text, None) if isinstance(text, dict) else None
    if q is None:
        return flag, None
    where = ("config.json quantization_config" if config.get("quantization_config") is not None
             else "hf_quant_config.json")
    try:
        method = _normalized_method(q, where)
    except VllmRefuses as exc:
        raise VllmRaises(exc.kind, exc.message) from None
    if method.startswith("modelopt"):
        algo = _modelopt_algo(q)
        if algo is not None:
            if algo in MODELOPT_FP8:
                method = "modelopt"
            elif "NVFP4" in algo or "FP4" in algo:
                method = "modelopt_fp4"
            elif algo == "MXFP8":
                method = "modelopt_mxfp8"
            elif algo == "MIXED_PRECISION":
                method = "modelopt_mixed"
            return method, q
    if not method:  # an empty quant_method reads as none
        return None, q
    if flag is not None and flag != method:
        raise VllmRaises("ValueError", "Quantization method specified in the model config "
                                       f"({method}) does not match the quantization method "
                                       f"specified in the `quantization` argument ({flag}).")
    return method, q


def _modelopt_algo(q: dict) -> str | None:
    """ModelOptQuantConfigBase._extract_modelopt_quant_algo."""
    if not str(q.get("quant_method", "")).lower().startswith("modelopt"):
        return None
    inner = q.get("quantization")
    if "quantization" in q:
        return str(inner.get("quant_algo", "")).upper() if isinstance(inner, dict) else None
    return str(q.get("quant_algo", "")).upper()


def _map_name(mapper: Mapping[str, Any] | None, name: str) -> str:
    """WeightsMapper._map_name (models/utils.py): substrings, then prefixes, then suffixes."""
    if not mapper:
        return name
    for pattern, new in mapper.get("regex", {}).items():
        if re.search(pattern, name):
            name = re.sub(pattern, new or "", name)
    for old, new in mapper.get("substr", {}).items():
        if old in name:
            name = name.replace(old, new or "", 1)
    for old, new in mapper.get("prefix", {}).items():
        if name.startswith(old):
            name = name.replace(old, new or "", 1)
    for old, new in mapper.get("suffix", {}).items():
        if name.endswith(old):
            name = (new or "").join(name.rsplit(old, 1))
    return name


# --- compressed-tensors -------------------------------------------------------------------

def _ct_match(value: str, target: str, contains: bool = False) -> bool:
    if target.startswith("re:"):
        return re.match(target[3:], value) is not None
    if contains:
        return target.lower() in value.lower()
    return target == value


class _CT:
    def __init__(self, q: dict, arch: Mapping[str, Any]):
        self.packed = arch.get("packed") or {}
        mapper = arch.get("mapper")

        def mapped(target: str) -> str:
            return _map_name(mapper, target) if "." in target and not target.startswith(
                "re:") else target

        self.targets: dict[str, dict] = {}
        for group in (q.get("config_groups") or {}).values():
            targets = group.get("targets") or []
            if len(targets) == 1 and targets[0].endswith("Attention"):
                continue  # from_config: attention quant goes with the KV cache
            for t in targets:
                self.targets[mapped(t)] = {"weights": group.get("weights"),
                                           "input_activations": group.get("input_activations")}
        self.ignore = [mapped(t) for t in q.get("ignore") or []]

    def _ignored(self, name: str) -> bool:
        proj = name.split(".")[-1]
        if proj in self.packed and name not in self.ignore:
            answers = {any(_ct_match(name.replace(proj, shard), t) for t in self.ignore)
                       for shard in self.packed[proj]}
            if len(answers) > 1:
                raise VllmRaises("ValueError", f"Found a different quantization schemes for "
                                               f"{self.packed[proj]} in {name}. vLLM requires "
                                               "all to use the same scheme.")
            return answers.pop()
        return any(_ct_match(name, t) for t in self.ignore)

    def _target(self, name: str, cls: str) -> str | None:
        for t in self.targets:
            if _ct_match(name, t):
                return t
        for t in self.targets:
            if _ct_match(cls, t, contains=True):
                return t
        proj = name.split(".")[-1]
        if proj in self.packed:
            found = [next((t for t in self.targets if _ct_match(name.replace(proj, s), t)),
                          None) for s in self.packed[proj]]
            if found and all(found):
                return found[0]
        return None

    def scheme_dict(self, name: str, cls: str) -> dict | None:
        if self._ignored(name):
            return None
        target = self._target(name, cls)
        return None if target is None else self.targets[target]

    def linear(self, name: str, cls: str) -> str | None:
        return _ct_nvfp4(self.scheme_dict(name, cls), moe=False)

    def moe(self, name: str) -> str:
        if "Linear" in self.targets and "FusedMoE" not in self.targets:
            self.targets["FusedMoE"] = self.targets["Linear"]
        shards = [self.scheme_dict(name + p, "FusedMoE")
                  for p in (".0.gate_proj", ".0.up_proj", ".0.down_proj")]
        last = shards.pop()
        if not all(s == last for s in shards):
            raise VllmRaises("ValueError", "All MoE projections need to have same "
                                           "quantization scheme but found multiple")
        if last is None:
            return "unquantized"
        return _ct_nvfp4(last, moe=True) or "other"


def _is_nvfp4(args: Any) -> bool:
    """CompressedTensorsConfig._is_nvfp4_format."""
    return (isinstance(args, dict) and args.get("strategy") == "tensor_group"
            and args.get("type") == "float" and args.get("num_bits") == 4
            and args.get("group_size") == 16 and bool(args.get("symmetric")))


def _ct_nvfp4(scheme: dict | None, moe: bool) -> str | None:
    if scheme is None or scheme.get("weights") is None:
        return None
    weights, inputs = scheme["weights"], scheme.get("input_activations")
    if not _is_nvfp4(weights):
        return "other"
    if inputs is None:
        return "nvfp4_w4a16" if moe else "w4a16"
    if not _is_nvfp4(inputs):
        if moe:
            raise VllmRaises("ValueError", "For NVFP4 weights, input quantization must also be "
                                           f"NVFP4 format or None for NVFP4A16, found {inputs}")
        raise VllmRaises("ValueError", "('For NVFP4 weights, input quantization must also be "
                                       "NVFP4 format, ', 'None for NVFP4A16')")
    return "nvfp4_w4a4" if moe else "w4a4"


# --- ModelOpt -----------------------------------------------------------------------------

class _ModelOpt:
    def __init__(self, q: dict, method: str, arch: Mapping[str, Any]):
        self.method = method
        self.packed = arch.get("packed") or {}
        nested = "quantization" in q
        inner = q["quantization"] if nested else q
        algo = str(inner.get("quant_algo") or "").upper()
        if not algo:
            raise VllmRaises("ValueError", "Missing 'quant_algo' in quantization config")
        if algo not in QUANT_ALGOS:
            raise VllmRaises("ValueError", f"ModelOpt currently only supports: {QUANT_ALGOS} "
                                           "quantizations in vLLM. Please check the "
                                           "`hf_quant_config.json` file for your model's "
                                           "quant configuration.")
        self.algo = algo
        exclude = (inner.get("exclude_modules", []) if nested
                   else q.get("ignore", []))
        if method == "modelopt_fp4" and nested:
            missing = [f for f in ("group_size", "kv_cache_quant_algo", "exclude_modules")
                       if f not in inner]
            if missing:
                raise VllmRaises("ValueError", "NVFP4 quantization requires the following "
                                               f"fields in hf_quant_config.json: {missing}")
        mapper = arch.get("mapper")
        expanded = []
        for e in exclude:  # apply_vllm_mapper (modelopt.py)
            if len(e) >= 2 and e[-1] == "*" and e[-2] != ".":
                expanded += [e[:-1], e[:-1] + ".*"]
            else:
                expanded.append(e)
        self.exclude = [_map_name(mapper, e) for e in expanded]
        layers = inner.get("quantized_layers", {}) if nested else q.get("quantized_layers", {})
        if method == "modelopt_mixed":
            if not layers:
                raise VllmRaises("ValueError", "MIXED_PRECISION quant_algo requires a non-empty "
                                               "'quantized_layers' mapping in the quantization "
                                               "config.")
            self.layers = {(_map_name(mapper, k) if mapper else k): v for k, v in layers.items()}
        else:
            self.layers = {}

    def excluded(self, prefix: str) -> bool:
        if not self.exclude:
            return False
        proj = prefix.split(".")[-1]
        if proj in self.packed:  # is_layer_skipped: every shard
            shards = [prefix.replace(proj, s) for s in self.packed[proj]]
            if all(s in self.exclude for s in shards):
                return True
        elif prefix in self.exclude:
            return True
        for e in self.exclude:
            if e != prefix and (e in prefix or (prefix.startswith("language_model.")
                                                and e in prefix.removeprefix("language_model."))):
                return True
        return any(fnmatch.fnmatch(prefix, e) for e in self.exclude)

    def _candidates(self, prefix: str) -> list[str]:
        out = [prefix]
        if prefix.endswith(".lm_head"):
            out.append("lm_head")
        if prefix.startswith("language_model.model."):
            out.append("model.language_model." + prefix[len("language_model.model."):])
        elif prefix.startswith("model.language_model."):
            out.append("language_model.model." + prefix[len("model.language_model."):])
        return list(dict.fromkeys(out))

    def algo_of(self, prefix: str) -> str | None:
        """ModelOptMixedPrecisionConfig._resolve_quant_algo."""
        for c in self._candidates(prefix):
            if c in self.layers:
                return self.layers[c]["quant_algo"].upper()
        proj = prefix.rsplit(".", 1)[-1]
        if proj in self.packed:
            algos = set()
            base = prefix.rsplit(".", 1)[0]
            for b in self._candidates(base):
                for shard in self.packed[proj]:
                    if f"{b}.{shard}" in self.layers:
                        algos.add(self.layers[f"{b}.{shard}"]["quant_algo"].upper())
            if len(algos) == 1:
                return algos.pop()
            if len(algos) > 1:
                raise VllmRaises("ValueError", f"Mixed quant_algo within fused layer {prefix}: "
                                               f"{algos}. All shards must use the same "
                                               "quantization.")
        for c in self._candidates(prefix):
            for key, info in self.layers.items():
                if key.startswith(c + "."):
                    return info["quant_algo"].upper()
        if prefix.endswith(".experts"):
            parent = prefix.rsplit(".experts", 1)[0] + "."
            for key, info in self.layers.items():
                if key.startswith(parent):
                    return info["quant_algo"].upper()
        return None

    def linear(self, prefix: str, cls: str) -> str | None:
        if self.excluded(prefix):
            return None
        if self.method != "modelopt_mixed" and any(
                v in prefix for v in ("vision_tower", "vision_model", "vit_large_projector")):
            return None
        algo = self.algo if self.method != "modelopt_mixed" else self.algo_of(prefix)
        return {"NVFP4": "w4a4", "W4A16_NVFP4": "w4a16_pinned", "FP8": "fp8"}.get(
            algo or "", None if algo is None else "other")

    def moe(self, prefix: str) -> str:
        if self.excluded(prefix):
            return "unquantized"
        algo = self.algo if self.method != "modelopt_mixed" else self.algo_of(prefix)
        if algo is None:
            return "unquantized"
        return {"NVFP4": "nvfp4_w4a4", "W4A16_NVFP4": "nvfp4_w4a16"}.get(algo, "other")


# --- putting it together ------------------------------------------------------------------

def model_layers(facts: Facts, arch: str, config: dict, hf_quant: dict | None,
                 flag: str | None, kv_cache_dtype: str = "auto") -> Layers:
    """The Layers vLLM builds for a checkpoint served as `arch` (the target's architecture,
    or the drafter's: an MTP head is read with the target checkpoint's quantization)."""
    archetype = facts["archetypes"].get(arch)
    if archetype is None:
        raise NotRecorded(f"no recorded layers of {arch} (add an archetype to "
                          "imagebuild/facts/recorder/kernel_select.py)")
    method, q = method_of(config, hf_quant, flag)
    text_config = config.get("text_config")
    text: dict = text_config if isinstance(text_config, dict) else config
    base = Layers(arch=arch, head_size=text.get("head_dim"), kv_cache_dtype=kv_cache_dtype)
    if method is None:
        moe = "unquantized" if archetype.get("moe") else "none"
        return replace(base, moe=moe, order=("moe", "attention") if moe != "none"
                       else ("attention",))
    if archetype.get("layers") is None:
        raise NotRecorded(f"no recorded quantized layers of {arch}")
    if method == "modelopt_mixed" and "quantized_layers" not in (q or {}):
        # model_loader/weight_utils.py get_quant_config 308-318: config.json's
        # quantization_config without the per-layer map: hf_quant_config.json is read
        if hf_quant is None:
            raise VllmRaises("ValueError", "Cannot find the config file for modelopt_mixed")
        q = hf_quant
    if method == "compressed-tensors":
        reader: Any = _CT(q or {}, archetype)
    elif method in ("modelopt_fp4", "modelopt_mixed", "modelopt"):
        reader = _ModelOpt(q or {}, method, archetype)
    else:
        raise NotRecorded(f"quantization method {method} is not modelled")
    nvfp4: str | None = None
    fp8 = False
    moe = "none"
    order: list[str] = []
    for name, cls, kind in archetype["layers"]:
        if kind == "linear":
            scheme = reader.linear(name, cls)
            if scheme == "fp8":
                fp8 = True
                order.append("fp8_gemm")
            elif scheme == "other":
                raise NotRecorded(f"{name}: a {method} scheme other than NVFP4 or FP8")
            elif scheme is not None:
                nvfp4 = nvfp4 or scheme
                order.append("nvfp4_gemm")
        elif kind == "moe":
            found = reader.moe(name)
            if found == "other":
                raise NotRecorded(f"{name}: a {method} MoE scheme other than NVFP4")
            moe = found if moe == "none" else moe
            order.append("moe")
        elif kind == "attention":
            order.append("attention")
    return replace(base, nvfp4_linear=nvfp4, fp8_linear=fp8, moe=moe,
                   order=tuple(dict.fromkeys(order)))
