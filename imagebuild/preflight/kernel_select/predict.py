"""Which kernels vLLM picks at model load, predicted from its recorded facts (facts.py).

The candidate lists, the names switches map to and every candidate's gate are vLLM's own
(generate.py records them); what is written here is how vLLM's selecting functions walk
them, each function named with its file. A Decision holds what vLLM logs (its own format
strings), the name the profile's expect_backends uses, or the exception it raises.

vLLM 0.23.0 sources followed:
- NVFP4 GEMM: model_executor/kernels/linear/__init__.py init_nvfp4_linear_kernel (851-968);
  compressed-tensors W4A16 asks it with use_a16 (schemes/compressed_tensors_w4a4_nvfp4.py
  28); ModelOpt W4A16_NVFP4 pins MarlinNvFp4LinearKernel without asking and without a log
  line (quantization/modelopt.py 1263-1269).
- FP8 GEMM (ModelOpt FP8 layers, static per-tensor): the same file, init_fp8_linear_kernel
  (522-592) and choose_scaled_mm_linear_kernel (450-519); ModelOptFp8LinearMethod logs
  "Selected <kernel> for ModelOptFp8LinearMethod" (modelopt.py 503-510).
- NVFP4 MoE: fused_moe/oracle/nvfp4.py select_nvfp4_moe_backend (160-333).
- Unquantized MoE: fused_moe/oracle/unquantized.py _get_priority_backends (44-87) and
  select_unquantized_moe_backend (153-298).
- Drafter: v1/spec_decode/llm_base_proposer.py _create_draft_vllm_config (1157-1183): the
  drafter inherits --moe-backend unless the speculative config names one, and never
  inherits the attention backend; DFlash makes its attention non-causal (dflash.py 74-82).
- Attention: v1/attention/selector.py get_attn_backend (block size only when given),
  platforms/cuda.py get_attn_backend_cls (293-385) and get_valid_backends (258-290),
  v1/attention/backend.py validate_configuration (275-341).
- Sampler: v1/sample/ops/topk_topp_sampler.py flashinfer_sampler_supported (21-66) and
  TopKTopPSampler.__init__ (69-90).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from imagebuild.preflight.kernel_select.facts import Facts, NotRecorded, VllmRaises

# The kinds a prediction holds (expect_backends names where one exists).
KINDS = ("nvfp4_gemm", "fp8_gemm", "moe", "attention", "sampler", "drafter_moe",
         "drafter_attention")


@dataclass(frozen=True)
class Device:
    cc: str  # "12.1"
    probes: Mapping[str, bool]

    @property
    def major(self) -> int:
        return int(self.cc.split(".")[0])

    @property
    def cc_int(self) -> int:
        major, minor = self.cc.split(".")
        return int(major) * 10 + int(minor)


@dataclass(frozen=True)
class Layers:
    """What vLLM builds for one model (target or drafter), as its quantization config
    hands each layer kind out."""

    arch: str  # the architecture vLLM resolved (archetype name in the facts)
    head_size: int | None = None  # None: the archetype's
    dtype: str | None = None  # None: the archetype's
    # dense NVFP4 layers: "w4a4", "w4a16" (compressed-tensors: vLLM asks with use_a16),
    # "w4a16_pinned" (ModelOpt W4A16_NVFP4: Marlin, no selection) or None
    nvfp4_linear: str | None = None
    fp8_linear: bool = False  # ModelOpt FP8 (static per-tensor) layers
    moe: str | None = "none"  # "nvfp4_w4a4", "nvfp4_w4a16", "unquantized" or "none"
    kv_cache_dtype: str = "auto"  # the attention layers' resolved kv_cache_dtype
    per_head_quant_scales: bool = False
    # the decisions in the order vLLM's build meets them (the first that raises ends the boot)
    order: tuple[str, ...] = ("nvfp4_gemm", "moe", "fp8_gemm", "attention")


@dataclass(frozen=True)
class Serve:
    moe_backend: str = "auto"
    linear_backend: str = "auto"
    attention_backend: str | None = None  # --attention-backend (enum name, any case)
    block_size: int | None = None  # only when given on the command line
    tensor_parallel_size: int = 1
    expert_parallel: bool = False
    lora: bool = False
    logprobs_mode: str = "raw_logprobs"


@dataclass(frozen=True)
class Drafter:
    method: str
    layers: Layers
    moe_backend: str | None = None  # speculative_config.moe_backend
    attention_backend: str | None = None  # speculative_config.attention_backend


@dataclass(frozen=True)
class Deployment:
    device: Device
    target: Layers
    serve: Serve = Serve()
    env: Mapping[str, str] = field(default_factory=dict)
    drafter: Drafter | None = None


@dataclass(frozen=True)
class Decision:
    kind: str
    name: str | None = None  # expect_backends vocabulary (CUTLASS, VLLM_CUTLASS, FLASH_ATTN...)
    kernel: str | None = None  # vLLM's class or enum name
    log: tuple[str, ...] = ()  # the lines vLLM logs for this choice (info and warnings)
    error: tuple[str, str] | None = None  # (exception class, message) when vLLM raises
    unknown: str | None = None  # why the facts cannot predict it
    candidates: tuple[str, ...] = ()  # what was tried, in order
    scheme: str | None = None  # the layers' quantization scheme (Layers.nvfp4_linear, .moe)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v not in (None, (), [])}


class _Raise(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind, self.message = kind, message


def gemm_name(kernel: str) -> str:
    """CutlassNvFp4LinearKernel -> CUTLASS, FlashInferCutlassNvFp4LinearKernel ->
    FLASHINFER_CUTLASS (VLLM_NVFP4_GEMM_BACKEND's spelling, upper case)."""
    stem = kernel.replace("NvFp4LinearKernel", "")
    words = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", stem.replace("FlashInfer", "Flashinfer"))
    return words.upper()


def _selector_repr(sel: Mapping[str, Any]) -> str:
    """AttentionSelectorConfig.__repr__ (v1/attention/selector.py)."""
    names = ("head_size", "dtype", "kv_cache_dtype", "block_size", "use_mla", "has_sink",
             "use_sparse", "use_mm_prefix", "use_per_head_quant_scales", "attn_type",
             "use_non_causal", "use_batch_invariant", "use_kv_connector")
    shown = {**sel, "dtype": f"torch.{sel['dtype']}",
             "attn_type": f"AttentionType.{str(sel['attn_type']).upper()}"}
    return "AttentionSelectorConfig(" + ", ".join(f"{n}={shown[n]}" for n in names) + ")"


class Predictor:
    def __init__(self, facts: Facts, dep: Deployment):
        self.f, self.dep = facts, dep
        self.dev = dep.device

    # --- shared -------------------------------------------------------------------------
    def gate(self, gate: Mapping[str, Any], **axes: Any) -> Any:
        return self.f.gate(gate, self.dev.cc, self.dev.probes, self.dep.env, **axes)

    def env(self, name: str) -> Any:
        try:
            return self.f.parse_env(name, self.dep.env.get(name))
        except VllmRaises as exc:
            raise _Raise(exc.kind, exc.message) from None

    def is_set(self, name: str) -> bool:
        return name in self.dep.env

    def disabled(self) -> list[str]:
        return list(self.env("VLLM_DISABLED_KERNELS"))

    # --- dense NVFP4 GEMM ----------------------------------------------------------------
    def nvfp4_gemm(self, layers: Layers) -> Decision:
        kind = "nvfp4_gemm"
        if layers.nvfp4_linear is None:
            return Decision(kind)
        if layers.nvfp4_linear == "w4a16_pinned":
            k = "MarlinNvFp4LinearKernel"
            return Decision(kind, gemm_name(k), k, ())
        facts = self.f["nvfp4_linear"]
        gates = facts["gates"]

        def supported(k: str) -> tuple[bool, str | None]:
            ok, reason = self.gate(gates[k]["is_supported"])
            return ok, reason

        lines: list[str] = []
        lb = self.dep.serve.linear_backend
        force = None
        if self.env("VLLM_BATCH_INVARIANT"):
            ok, reason = supported("CutlassNvFp4LinearKernel")
            if ok:
                force = "CutlassNvFp4LinearKernel"
                lines.append(f"VLLM_BATCH_INVARIANT overrides --linear-backend={lb}; using the "
                             "CUTLASS backend for deterministic execution."
                             if lb not in ("auto", "cutlass") else
                             "VLLM_BATCH_INVARIANT forces NVFP4 linear to use the CUTLASS "
                             "backend for deterministic execution.")
            else:
                force = "EmulationNvFp4LinearKernel"
                if lb not in ("auto", "emulation"):
                    lines.append(f"VLLM_BATCH_INVARIANT overrides --linear-backend={lb}; "
                                 "using the emulation backend for deterministic execution.")
                lines.append("VLLM_BATCH_INVARIANT is set but the batch-invariant NVFP4 "
                             "kernel is not supported on this platform; falling back to "
                             f"emulation for deterministic execution. Reason: {reason}")
        elif lb == "auto":
            if layers.nvfp4_linear == "w4a16":
                force = "MarlinNvFp4LinearKernel"
            elif self.env("VLLM_USE_FBGEMM"):
                force = "FbgemmNvFp4LinearKernel"
            elif self.env("VLLM_USE_NVFP4_CT_EMULATIONS"):
                force = "EmulationNvFp4LinearKernel"
            elif (backend := self.env("VLLM_NVFP4_GEMM_BACKEND")) is not None:
                force = facts["env_backends"].get(backend)
                if force is None:
                    raise _Raise("ValueError", f"Unknown VLLM_NVFP4_GEMM_BACKEND={backend!r}. "
                                               f"Valid choices: {list(facts['env_backends'])}")
        if force is not None:
            ok, reason = supported(force)
            if not ok:
                raise _Raise("ValueError",
                             f"Forced NVFP4 kernel {force} is not supported: {reason}")
            return Decision(kind, gemm_name(force), force,
                            (*lines, f"Using {force} for NVFP4 GEMM"), candidates=(force,))
        possible = list(facts["candidates"])
        if lb != "auto":
            allowed = set(self.f["linear_backends"].get(lb, []))
            possible = [k for k in possible if k in allowed]
            if not possible:
                raise _Raise("ValueError", f"--linear-backend={lb} was requested but no "
                                           f"'{lb}' kernel exists for NVFP4 layers.")
        reasons: list[str] = []
        disabled = self.disabled()
        for k in possible:
            if k in disabled:
                reasons.append(f" {k} disabled by environment variable")
                continue
            ok, reason = supported(k)
            if not ok:
                reasons.append(f"{k}: {reason}")
                continue
            ok, reason = self.gate(gates[k]["can_implement"])
            if not ok:
                reasons.append(f"{k}: {reason}")
                continue
            if k == "EmulationNvFp4LinearKernel" and reasons:
                lines.append("NVFP4 linear falling back to the slow and unoptimized emulation "
                             "backend as no optimized backend is available (unavailable "
                             "reasons:\n - " + "\n - ".join(reasons) + "\n). In case you "
                             "expect one of these backends to be used, please verify your "
                             "environment.")
            return Decision(kind, gemm_name(k), k, (*lines, f"Using {k} for NVFP4 GEMM"),
                            candidates=tuple(possible))
        raise _Raise("ValueError", "Failed to find a kernel that can implement the NVFP4 "
                                   "linear layer. Reasons: \n" + "\n".join(reasons))

    # --- FP8 GEMM -----------------------------------------------------------------------
    def fp8_gemm(self, layers: Layers) -> Decision:
        kind = "fp8_gemm"
        if not layers.fp8_linear:
            return Decision(kind)
        facts = self.f["fp8_linear"]
        possible = list(facts["candidates"])
        lb = self.dep.serve.linear_backend
        if lb != "auto":
            allowed = set(self.f["linear_backends"].get(lb, []))
            possible = [k for k in possible if k in allowed]
            if not possible:
                raise _Raise("ValueError", f"--linear-backend={lb} was requested but no "
                                           f"'{lb}' kernel exists for this layer type.")
        reasons = []
        disabled = self.disabled()
        for k in possible:
            if k in disabled:
                reasons.append(f" {k} is disabled by environment variable")
                continue
            ok, reason = self.gate(facts["gates"][k]["is_supported"])
            if not ok:
                reasons.append(f"{k} {reason}.")
                continue
            ok, reason = self.gate(facts["gates"][k]["can_implement"], scheme="fp8_per_tensor")
            if not ok:
                reasons.append(f"{k} {reason}.")
                continue
            return Decision(kind, k.replace("FP8ScaledMMLinearKernel", "").upper() or k, k,
                            (f"Selected {k} for ModelOptFp8LinearMethod",),
                            candidates=tuple(possible))
        raise _Raise("ValueError", "Failed to find a kernel that can implement the ScaledMM "
                                   "linear layer. Reasons: \n" + "\n".join(reasons))

    # --- MoE ----------------------------------------------------------------------------
    def _layer_variant(self, layers: Layers) -> str:
        serve = self.dep.serve
        if serve.lora:
            variant = "tp1-lora" if serve.tensor_parallel_size == 1 else None
        elif serve.tensor_parallel_size == 1:
            variant = "tp1"
        elif serve.tensor_parallel_size == 2:
            variant = "tp2-ep" if serve.expert_parallel else "tp2"
        else:
            variant = None
        key = f"{layers.arch}/{variant}"
        if variant is None or key not in self.f["moe_layers"]:
            raise NotRecorded(f"no recorded MoE layer of {layers.arch} for tensor parallel "
                              f"{serve.tensor_parallel_size}"
                              + (" with expert parallel" if serve.expert_parallel else "")
                              + (" with LoRA" if serve.lora else ""))
        return key

    def moe(self, layers: Layers, moe_backend: str, kind: str = "moe") -> Decision:
        if layers.moe is None or layers.moe == "none":
            return Decision(kind)
        variant = self._layer_variant(layers)
        layer = self.f["moe_layers"][variant]
        if layers.moe == "unquantized":
            return self._unquantized_moe(kind, variant, layer, moe_backend)
        return self._nvfp4_moe(kind, variant, layer, layers.moe, moe_backend)

    def _nvfp4_moe(self, kind: str, variant: str, layer: Mapping[str, Any], scheme: str,
                   moe_backend: str) -> Decision:
        facts = self.f["nvfp4_moe"]
        available = list(facts["order"])
        clamp = set(facts["with_clamp"])
        swiglu = layer.get("swiglu_limit")
        if swiglu is not None:
            available = [b for b in available if b in clamp]
        batched = bool(layer.get("batched"))

        def log(backend: str) -> str:
            return (f"Using '{backend}' NvFp4 MoE backend out of potential backends: "
                    f"{available}.")

        def supported(backend: str) -> tuple[str | None, str | None]:
            reason = None
            for k in facts["experts"][backend]:
                ok, reason = self.gate(facts["gates"][k], scheme=scheme, layer=variant)
                if ok:
                    return k, None
            return None, reason

        def return_or_raise(backend: str) -> Decision:
            k, reason = supported(backend)
            if k is not None:
                return Decision(kind, backend, k, (log(backend),), candidates=(backend,))
            because = f" since {reason}" if reason else ""
            raise _Raise("ValueError", f"NvFp4 MoE backend '{backend}' does not support the "
                                       f"deployment configuration{because}.")

        if moe_backend != "auto":
            requested = facts["moe_backends"].get(moe_backend)
            if requested is None:
                raise NotRecorded(f"--moe-backend {moe_backend} is not recorded")
            if isinstance(requested, dict):
                raise _Raise(requested["raises"], requested["message"])
            if batched and requested == "FLASHINFER_CUTEDSL":
                requested = "FLASHINFER_CUTEDSL_BATCHED"
            if swiglu is not None and requested not in clamp:
                raise _Raise("ValueError", f"Model sets swiglu_limit={swiglu}, but the "
                                           "explicitly requested moe_backend="
                                           f"{moe_backend!r} does not apply the SwiGLU clamp. "
                                           "Use 'flashinfer_trtllm' or 'flashinfer_cutlass' "
                                           "instead.")
            return return_or_raise(requested)
        if self.is_set("VLLM_USE_FLASHINFER_MOE_FP4"):
            if not self.env("VLLM_USE_FLASHINFER_MOE_FP4"):
                available = [b for b in available if b not in facts["flashinfer"]]
            elif self.is_set("VLLM_FLASHINFER_MOE_BACKEND"):
                value = self.env("VLLM_FLASHINFER_MOE_BACKEND")
                backend = self.gate(facts["fi_env"], value=value)
                if isinstance(backend, dict):
                    raise _Raise(backend["raises"], backend["message"])
                if swiglu is not None and backend not in clamp:
                    raise _Raise("ValueError", f"Model sets swiglu_limit={swiglu}, but the "
                                               "FlashInfer backend selected via "
                                               f"VLLM_FLASHINFER_MOE_BACKEND ({backend}) does "
                                               "not apply the SwiGLU clamp.")
                return return_or_raise(backend)
            else:
                for backend in facts["flashinfer"]:
                    if swiglu is not None and backend not in clamp:
                        continue
                    if supported(backend)[0] is not None:
                        k = supported(backend)[0]
                        return Decision(kind, backend, k, (log(backend),),
                                        candidates=tuple(facts["flashinfer"]))
                raise _Raise("NotImplementedError", "Found VLLM_USE_FLASHINFER_MOE_FP4=1, but "
                                                    "no FlashInfer NVFP4 MoE backend supports "
                                                    "the configuration.")
        if self.env("VLLM_TEST_FORCE_FP8_MARLIN"):
            return return_or_raise("MARLIN")
        for backend in available:
            k, _ = supported(backend)
            if k is not None:
                return Decision(kind, backend, k, (log(backend),), candidates=tuple(available))
        raise _Raise("NotImplementedError",
                     "No NvFp4 MoE backend supports the deployment configuration.")

    def _unquantized_moe(self, kind: str, variant: str, layer: Mapping[str, Any],
                         moe_backend: str) -> Decision:
        facts = self.f["unquantized_moe"]
        labels = facts["labels"]
        if layer.get("lora"):  # no log line: the LoRA path returns before the oracle logs
            return Decision(kind, "TRITON", facts["experts"]["TRITON"], ())
        available = list(facts["cuda_order"])

        def to_back(name: str) -> None:
            if name in available:
                available.append(available.pop(available.index(name)))

        if self.dev.major == 9:  # Hopper: Triton first (unquantized.py 71-75)
            to_back("FLASHINFER_TRTLLM")
            to_back("FLASHINFER_CUTLASS")
        if layer.get("dp", 1) > 1:
            to_back("FLASHINFER_CUTLASS")
        batched = bool(layer.get("batched"))

        def log(backend: str) -> str:
            return (f"Using {labels[backend]} Unquantized MoE backend out of potential "
                    f"backends: {[labels[b] for b in available]}.")

        def check(backend: str) -> tuple[bool, str | None]:
            ok, reason = self.gate(facts["gates"][facts["experts"][backend]],
                                   scheme="unquantized", layer=variant)
            return ok, reason

        def return_or_raise(backend: str) -> Decision:
            ok, reason = check(backend)
            if ok:
                return Decision(kind, backend, facts["experts"][backend], (log(backend),),
                                candidates=(backend,))
            because = f" since {reason}" if reason else ""
            raise _Raise("ValueError", f"Unquantized MoE backend {labels[backend]} does not "
                                       f"support the deployment configuration{because}.")

        if moe_backend != "auto":
            requested = facts["moe_backends"].get(moe_backend)
            if requested is None:
                raise NotRecorded(f"--moe-backend {moe_backend} is not recorded")
            if isinstance(requested, dict):
                raise _Raise(requested["raises"], requested["message"])
            if batched and requested == "TRITON":
                requested = "BATCHED_TRITON"
            return return_or_raise(requested)
        if self.is_set("VLLM_USE_FLASHINFER_MOE_FP16"):
            if not self.env("VLLM_USE_FLASHINFER_MOE_FP16"):
                available = [b for b in available
                             if b not in ("FLASHINFER_TRTLLM", "FLASHINFER_CUTLASS")]
            elif self.is_set("VLLM_FLASHINFER_MOE_BACKEND"):
                value = self.env("VLLM_FLASHINFER_MOE_BACKEND")
                fi = self.gate(self.f["nvfp4_moe"]["fi_env"], value=value)
                if isinstance(fi, dict):
                    raise _Raise(fi["raises"], fi["message"])
                if fi not in ("FLASHINFER_CUTLASS", "FLASHINFER_TRTLLM"):
                    enum = {"FLASHINFER_CUTEDSL": "CUTEDSL"}.get(fi, fi)
                    raise _Raise("ValueError", f"FlashInfer MOE backend FlashinferMoeBackend."
                                               f"{enum} does not support unquantized MoE.")
                return return_or_raise(fi)
            else:
                for backend in ("FLASHINFER_TRTLLM", "FLASHINFER_CUTLASS"):
                    if check(backend)[0]:
                        return Decision(kind, backend, facts["experts"][backend],
                                        (log(backend),))
                raise _Raise("NotImplementedError", "Found VLLM_USE_FLASHINFER_MOE_FP16=1, but "
                                                    "no FlashInfer unquantized MoE backend "
                                                    "supports the configuration.")
        if self.is_set("VLLM_ROCM_USE_AITER") or self.is_set("VLLM_ROCM_USE_AITER_MOE"):
            if not self.env("VLLM_ROCM_USE_AITER") or not self.env("VLLM_ROCM_USE_AITER_MOE"):
                available = [b for b in available if b != "AITER"]
            else:
                return return_or_raise("AITER")
        for backend in available:
            if check(backend)[0]:
                return Decision(kind, backend, facts["experts"][backend], (log(backend),),
                                candidates=tuple(available))
        raise _Raise("NotImplementedError",
                     "No Unquantized MoE backend supports the deployment configuration.")

    # --- attention ----------------------------------------------------------------------
    def _selector(self, layers: Layers, non_causal: bool) -> dict[str, Any]:
        arch = self.f["archetypes"].get(layers.arch) or {}
        base = arch.get("attention")
        if base is None:
            raise NotRecorded(f"no recorded attention layer of {layers.arch}")
        return {**base, "head_size": layers.head_size or base["head_size"],
                "dtype": layers.dtype or base["dtype"], "kv_cache_dtype": layers.kv_cache_dtype,
                "block_size": self.dep.serve.block_size, "use_non_causal": non_causal,
                "use_per_head_quant_scales": layers.per_head_quant_scales,
                "use_batch_invariant": bool(self.env("VLLM_BATCH_INVARIANT"))}

    def validate(self, backend: str, sel: Mapping[str, Any]) -> list[str]:
        """AttentionBackend.validate_configuration (backend.py 275-341), in its order."""
        facts = self.f["attention"]["backends"].get(backend)
        if facts is None:
            raise NotRecorded(f"attention backend {backend} is not recorded")
        if "import_error" in facts or (backend.startswith("FLASHINFER")
                                       and not self.dev.probes.get("flashinfer")):
            return ["ImportError"]  # get_valid_backends / get_attn_backend_cls catch it

        def g(check: str, **axes: Any) -> Any:
            return self.gate(facts[check], **axes)

        out = []
        if not g("head_size", h=sel["head_size"]):
            out.append("head_size not supported")
        if not g("dtype", d=sel["dtype"]):
            out.append("dtype not supported")
        if not g("kv_cache_dtype", k=sel["kv_cache_dtype"]):
            out.append("kv_cache_dtype not supported")
        if not g("block_size", b=sel["block_size"]):
            out.append("block_size not supported")
        if sel["use_mm_prefix"] and not g("mm_prefix"):
            out.append("partial multimodal token full attention not supported")
        if sel["use_mla"] != g("mla"):
            out.append("MLA not supported" if sel["use_mla"] else "non-MLA not supported")
        if sel["has_sink"] and not g("sink"):
            out.append("attention sinks not supported")
        if sel["use_sparse"] != g("sparse"):
            out.append("sparse not supported" if sel["use_sparse"] else "non-sparse not supported")
        if sel["use_per_head_quant_scales"] and not g("per_head_quant_scales"):
            out.append("per-head quant scales not supported")
        if not g("compute_capability"):
            out.append("compute capability not supported")
        if not g("attn_type", t=sel["attn_type"]):
            out.append(f"attention type {sel['attn_type']} not supported")
        if sel["use_non_causal"] and not g("non_causal"):
            out.append("non-causal attention not supported")
        if sel["use_batch_invariant"] and not g("batch_invariance"):
            out.append("batch invariance not supported")
        if sel["use_kv_connector"] and not g("kv_connector"):
            out.append("KV connector not supported")
        combination = g("combination", head=sel["head_size"], dtype=sel["dtype"],
                        kv=sel["kv_cache_dtype"], block=None, sink=sel["has_sink"])
        if combination is not None:
            out.append(combination)
        return out

    def attention(self, layers: Layers, selected: str | None, non_causal: bool,
                  kind: str) -> Decision:
        sel = self._selector(layers, non_causal)
        facts = self.f["attention"]
        layout_lines: tuple[str, ...] = ()

        def layout(backend: str) -> tuple[str, ...]:
            """selector.py _cached_get_attn_backend: a backend's required KV layout."""
            found = self.gate(facts["backends"][backend]["kv_layout"])
            return (f"Using {found} KV cache layout for {backend} backend.",) if found not in (
                None, "None") else ()

        if selected is not None:
            name = selected.upper()
            if name not in facts["backends"]:
                raise NotRecorded(f"attention backend {selected} is not recorded")
            reasons = self.validate(name, sel)
            if reasons:
                raise _Raise("ValueError", f"Selected backend AttentionBackendEnum.{name} is "
                                           "not valid for this configuration. Reason: "
                                           f"{reasons}")
            layout_lines = layout(name)
            return Decision(kind, name, name,
                            (f"Using AttentionBackendEnum.{name} backend.", *layout_lines),
                            candidates=(name,))
        order = facts["priorities"].get(self.dev.cc)
        if order is None:
            raise NotRecorded(f"attention priorities for capability {self.dev.cc}")
        valid, invalid = [], {}
        for backend in order:
            reasons = self.validate(backend, sel)
            if reasons:
                invalid[backend] = reasons
            else:
                valid.append(backend)
        if not valid:
            text = ", ".join(f"{b}: [{', '.join(r)}]" for b, r in invalid.items())
            raise _Raise("ValueError", "No valid attention backend found for cuda with "
                                       f"{_selector_repr(sel)}. Reasons: {{{text}}}.")
        chosen = valid[0]
        lines = [f"Using {chosen} attention backend out of potential backends: "
                 f"[{', '.join(repr(b) for b in valid)}]."]
        if sel["block_size"] is not None:
            excluded = [b for b in order[:order.index(chosen)]
                        if invalid.get(b) == ["block_size not supported"]]
            if excluded:
                lines.insert(0, f"--block-size {sel['block_size']} precluded higher-priority "
                                f"backend(s) {', '.join(excluded)}. Using {chosen} instead, "
                                "which may result in reduced performance. Consider removing "
                                "--block-size to auto-select the optimal block size.")
        return Decision(kind, chosen, chosen, (*lines, *layout(chosen)),
                        candidates=tuple(order))

    # --- sampler ------------------------------------------------------------------------
    def sampler(self) -> Decision:
        kind = "sampler"
        if self.dep.serve.logprobs_mode in ("processed_logits", "processed_logprobs"):
            return Decision(kind, "NATIVE", "forward_native", ())
        if not self.env("VLLM_USE_FLASHINFER_SAMPLER"):
            return Decision(kind, "NATIVE", "forward_native",
                            ("FlashInfer top-p/top-k sampling disabled via "
                             "VLLM_USE_FLASHINFER_SAMPLER=0.",))
        if not self.dev.probes.get("flashinfer"):
            raise _Raise("ModuleNotFoundError", "No module named 'flashinfer'")
        ok = self.gate(self.f["attention"]["backends"]["FLASHINFER"]["compute_capability"])
        if ok:
            return Decision(kind, "FLASHINFER", "forward_cuda",
                            ("Using FlashInfer for top-p & top-k sampling.",))
        reason = f"unsupported compute capability {self.dev.cc}"
        if self.is_set("VLLM_USE_FLASHINFER_SAMPLER"):
            raise _Raise("RuntimeError", f"FlashInfer top-p/top-k sampling unavailable: "
                                         f"{reason}. Unset VLLM_USE_FLASHINFER_SAMPLER=1.")
        return Decision(kind, "NATIVE", "forward_native",
                        (f"FlashInfer top-p/top-k sampling unavailable: {reason}; falling "
                         "back. Set VLLM_USE_FLASHINFER_SAMPLER=0 to silence.",))

    # --- all ----------------------------------------------------------------------------
    def run(self, kind: str) -> Decision:
        decision = self._run(kind)
        layers = self.dep.target if not kind.startswith("drafter_") else (
            self.dep.drafter.layers if self.dep.drafter else None)
        if layers is not None and kind.endswith("nvfp4_gemm"):
            return dataclasses.replace(decision, scheme=layers.nvfp4_linear)
        if layers is not None and kind.endswith("moe"):
            return dataclasses.replace(decision, scheme=layers.moe)
        return decision

    def _run(self, kind: str) -> Decision:
        dep = self.dep
        try:
            if kind == "nvfp4_gemm":
                return self.nvfp4_gemm(dep.target)
            if kind == "fp8_gemm":
                return self.fp8_gemm(dep.target)
            if kind == "moe":
                return self.moe(dep.target, dep.serve.moe_backend)
            if kind == "attention":
                return self.attention(dep.target, dep.serve.attention_backend, False, kind)
            if kind == "sampler":
                return self.sampler()
            if dep.drafter is None:
                return Decision(kind)
            d = dep.drafter
            if kind == "drafter_moe":
                backend = d.moe_backend if d.moe_backend is not None else dep.serve.moe_backend
                return self.moe(d.layers, backend, kind)
            if kind == "drafter_attention":
                arch = self.f["archetypes"].get(d.layers.arch) or {}
                return self.attention(d.layers, d.attention_backend,
                                      bool(arch.get("non_causal")), kind)
            raise ValueError(kind)
        except _Raise as exc:
            return Decision(kind, error=(exc.kind, exc.message))
        except NotRecorded as exc:
            return Decision(kind, unknown=str(exc))


def predict(facts: Facts, dep: Deployment) -> dict[str, Decision]:
    p = Predictor(facts, dep)
    return {kind: p.run(kind) for kind in KINDS}
