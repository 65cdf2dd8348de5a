"""The kernel choices vLLM makes at model load, read from the installed vLLM's own code.

For each decision vLLM makes while it
builds a model (dense NVFP4 and FP8 GEMM kernel, quantized NVFP4 and unquantized MoE
backend, attention backend, top-p/top-k sampler), the candidates in vLLM's order (its
module-level lists, or the list literal inside the selecting function, read from the
function's source), the names its switches map to (VLLM_NVFP4_GEMM_BACKEND, --moe-backend,
--linear-backend, VLLM_FLASHINFER_MOE_BACKEND, each evaluated by vLLM's own mapping), and
every candidate's gate: vLLM's own is_supported / can_implement / is_supported_config /
backend check methods called on every compute capability of GRID_CC, with every
hardware and extension probe (vllm_probes.py) and every vLLM environment variable the gate
itself reads (traced, not listed by hand) on and off. imagebuild/preflight/kernel_select/
predict.py composes these into a prediction without importing vLLM; the test
tests/e2e/test_kernel_select_vs_vllm.py compares it with vLLM's own selection functions.

The layer shapes the gates are evaluated for come from vLLM building the ARCHETYPES'
layers itself (meta device, probes patched): their MoE layer config and the arguments
their attention layers pass to the backend selector are recorded as they are.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import functools
import inspect
import itertools
import json
import os
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import vllm_probes as vp  # noqa: E402
from common import Context, header  # noqa: E402

SOURCE = ("vLLM's own selection code, run with only the hardware and extension probes "
          "patched (recorder/vllm_probes.py)")

# compute capabilities the gates are evaluated on (every CUDA arch vLLM 0.23 builds for)
GRID_CC = ("7.5", "8.0", "8.6", "8.7", "8.9", "9.0", "10.0", "10.3", "11.0", "12.0", "12.1")
# values a gate's environment variables take ("" = unset)
ENV_DOMAIN = ("", "0", "1")
# user spellings whose meaning is recorded per switch (vLLM parses each switch itself)
ENV_SAMPLES = ("", "0", "1", "true", "false", "True", "False", "yes", "no", "2")
SWITCHES = (
    "VLLM_USE_FLASHINFER_MOE_FP4", "VLLM_USE_FLASHINFER_MOE_FP16",
    "VLLM_USE_FLASHINFER_MOE_FP8", "VLLM_FLASHINFER_MOE_BACKEND",
    "VLLM_TEST_FORCE_FP8_MARLIN", "VLLM_BATCH_INVARIANT", "VLLM_DISABLED_KERNELS",
    "VLLM_NVFP4_GEMM_BACKEND", "VLLM_USE_FBGEMM", "VLLM_USE_NVFP4_CT_EMULATIONS",
    "VLLM_USE_FLASHINFER_SAMPLER", "VLLM_USE_DEEP_GEMM", "VLLM_ROCM_USE_AITER",
    "VLLM_ROCM_USE_AITER_MOE",
)
# Checkpoints whose layers vLLM builds here to record layer shapes (public config fields of
# Qwen3.6-35B-A3B and its DFlash drafter; only the layer count is cut).
_QWEN36_TEXT = {
    "model_type": "qwen3_5_moe_text", "dtype": "bfloat16", "vocab_size": 248320,
    "hidden_size": 2048, "num_hidden_layers": 4,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "full_attention_interval": 4, "num_attention_heads": 16, "num_key_value_heads": 2,
    "head_dim": 256, "attn_output_gate": True, "attention_bias": False,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "mamba_ssm_dtype": "float32",
    "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512, "mtp_num_hidden_layers": 1,
    "hidden_act": "silu", "rms_norm_eps": 1e-06, "max_position_embeddings": 262144,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                        "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
                        "mrope_interleaved": True},
}
_QWEN36_VISION = {
    "model_type": "qwen3_5_moe", "depth": 2, "hidden_size": 1152, "num_heads": 16,
    "intermediate_size": 4304, "hidden_act": "gelu_pytorch_tanh", "in_channels": 3,
    "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
    "out_hidden_size": 2048, "num_position_embeddings": 2304, "deepstack_visual_indexes": [],
}
QWEN36 = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
          "text_config": _QWEN36_TEXT, "vision_config": _QWEN36_VISION,
          "tie_word_embeddings": False}
DFLASH = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "dtype": "bfloat16",
          "block_size": 16, "dflash_config": {"mask_token_id": 248077,
                                              "target_layer_ids": [1, 2, 3]},
          "num_target_layers": 4, "vocab_size": 248320, "hidden_size": 2048,
          "intermediate_size": 6144, "num_hidden_layers": 2, "num_attention_heads": 32,
          "num_key_value_heads": 4, "head_dim": 128, "hidden_act": "silu",
          "rms_norm_eps": 1e-06, "max_position_embeddings": 262144, "rope_theta": 10000000,
          "tie_word_embeddings": False}
# (target, speculative method or None, drafter config)
ARCHETYPES = ((QWEN36, "mtp", None), (QWEN36, "dflash", DFLASH))


# --- probing one function over the grid ---------------------------------------------------

def _cc(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


def _member_value(mapper: Callable[[str], Any], value: str) -> Any:
    return mapper(value).value


def _member_name(mapper: Callable[[str], Any], value: str) -> Any:
    return mapper(value).name


def _outcome(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:  # the gate raising is itself a fact
        return {"raises": type(exc).__name__, "message": str(exc)}


def tabulate(evaluate: Callable[..., Any], axes: dict[str, Iterable[Any]] | None = None,
             ccs: Iterable[str] = GRID_CC, sets: tuple[str, ...] = ()) -> dict[str, Any]:
    """`evaluate(**axis point)` on every capability, every probe and environment variable
    the evaluations read (found by tracing, repeated until no new one appears; `sets`: the
    variables `evaluate` sets itself) and every axis point. Returns {"reads": [...],
    "axes": [...], "tree": decision tree (_tree) over cc, the probes and variables read (1/0,
    the environment values of ENV_DOMAIN, "" = unset) and the axes, in that order}."""
    axes = {k: list(v) for k, v in (axes or {}).items()}
    ccs = list(ccs)
    probes: list[str] = []
    envs: list[str] = []
    while True:
        table: dict[str, Any] = {}
        seen_p: set[str] = set()
        seen_e: set[str] = set()
        for cc in ccs:
            for pv in itertools.product((True, False), repeat=len(probes)):
                vp.set_state(_cc(cc), **{p: True for p in vp.PROBES})
                vp.set_state(**dict(zip(probes, pv, strict=True)))
                for ev in itertools.product(ENV_DOMAIN, repeat=len(envs)):
                    env = {e: v for e, v in zip(envs, ev, strict=True) if v != ""}
                    for point in itertools.product(*axes.values()):
                        kw = dict(zip(axes, point, strict=True))
                        with vp.environment(env):
                            vp.reset_reads()
                            result = _outcome(functools.partial(evaluate, **kw))
                            seen_p |= vp.READS - {"cc"}
                            seen_e |= vp.ENV_READS
                        key = "|".join([f"cc={cc}"]
                                       + [f"{p}={int(v)}" for p, v in zip(probes, pv, strict=True)]
                                       + [f"{e}={v}" for e, v in zip(envs, ev, strict=True)]
                                       + [f"{a}={_fmt(v)}" for a, v in kw.items()])
                        table[key] = result
        new_p = sorted(seen_p - set(probes))
        new_e = sorted(seen_e - set(envs) - {"VLLM_LOGGING_LEVEL", *sets})
        if not new_p and not new_e:
            vp.set_state(**{p: True for p in vp.PROBES})
            names = ["cc", *probes, *envs, *axes]
            return {"reads": probes + envs, "axes": list(axes), "tree": _tree(table, names)}
        probes += new_p
        envs += new_e


def _fmt(value: Any) -> str:
    """An axis value as the predictor spells it (an enum by its value)."""
    import enum

    return str(value.value) if isinstance(value, enum.Enum) else str(value)


def _ok_reason(result: Any) -> Any:
    """(bool, reason) of vLLM's gates as JSON: [ok, reason]."""
    if isinstance(result, dict):
        return result
    ok, reason = result
    return [bool(ok), reason]


# --- reading a selecting function's own list literals --------------------------------------

def _names_in(node: ast.AST) -> list[str]:
    return [elt.attr for elt in getattr(node, "elts", []) if isinstance(elt, ast.Attribute)]


def local_list(fn: Callable[..., Any], name: str, within: str | None = None) -> list[str]:
    """The enum member names of the list/set literal assigned to `name` in fn's source
    (inside the `if <within>:` branch when given)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    scopes: list[ast.AST] = [tree]
    if within is not None:
        scopes = [n for n in ast.walk(tree) if isinstance(n, ast.If)
                  and within in ast.unparse(n.test)]
    for scope in scopes:
        body = scope.body if isinstance(scope, ast.If) else [scope]
        for stmt in body:
            for node in ast.walk(stmt):
                if (isinstance(node, ast.Assign) and len(node.targets) == 1
                        and isinstance(node.targets[0], ast.Name)
                        and node.targets[0].id == name):
                    return _names_in(node.value)
    raise SystemExit(f"generate.py: no list {name} in {fn.__qualname__}; teach local_list()")


# --- the archetypes' layers, built by vLLM --------------------------------------------------

_distributed = False


def engine_config(config: dict, files: dict[str, dict] | None = None, **engine: Any) -> Any:
    """vLLM's VllmConfig for a checkpoint directory holding `config`, as `vllm serve` builds
    it (EngineArgs.create_engine_config), on the probed CUDA platform."""
    from vllm.engine.arg_utils import EngineArgs

    model_dir = tempfile.mkdtemp(prefix="kernel-select-")
    Path(model_dir, "config.json").write_text(json.dumps(config))
    for name, body in (files or {}).items():
        Path(model_dir, name).write_text(json.dumps(body))
    spec = engine.pop("speculative_config", None)
    if spec and spec.get("model") == "<drafter>":
        drafter_dir = tempfile.mkdtemp(prefix="kernel-select-drafter-")
        Path(drafter_dir, "config.json").write_text(json.dumps(spec.pop("config")))
        spec = {**spec, "model": drafter_dir}
    args = EngineArgs(model=model_dir, skip_tokenizer_init=True, load_format="dummy",
                      max_model_len=engine.pop("max_model_len", 4096), enforce_eager=True,
                      speculative_config=spec, **engine)
    return args.create_engine_config()


def distributed(vllm_config: Any) -> None:
    global _distributed
    from vllm.config import set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.distributed.parallel_state import destroy_model_parallel

    with set_current_vllm_config(vllm_config):
        if not _distributed:
            port = 29600 + os.getpid() % 300
            init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                         distributed_init_method=f"tcp://127.0.0.1:{port}")
            _distributed = True
        destroy_model_parallel()
        ensure_model_parallel_initialized(1, 1)


def build(vllm_config: Any, model_config: Any | None = None) -> Any:
    """The model vLLM builds for `vllm_config` (weights on the meta device, never loaded),
    as get_model() does before loading weights."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype

    model_config = model_config or vllm_config.model_config
    with set_current_vllm_config(vllm_config), set_default_torch_dtype(model_config.dtype), \
            torch.device("meta"):
        return initialize_model(vllm_config=vllm_config, model_config=model_config)


def draft_config(vllm_config: Any) -> Any:
    """The VllmConfig the drafter is built with: the proposer class's own
    _create_draft_vllm_config (moe_backend inherited unless the speculative config names
    one; attention backend never inherited; DFlash: non-causal attention)."""
    from vllm.v1.spec_decode.dflash import DFlashProposer
    from vllm.v1.spec_decode.eagle import EagleProposer

    spec = vllm_config.speculative_config
    cls = DFlashProposer if spec.method == "dflash" else EagleProposer
    proposer = cls.__new__(cls)
    proposer.vllm_config = vllm_config
    proposer.speculative_config = spec
    if cls is DFlashProposer:  # as DFlashProposer.__init__ sets it
        proposer.draft_model_config = spec.draft_model_config
        proposer.dflash_causal = proposer.dflash_config.get("causal", False)
    return proposer._create_draft_vllm_config()


class Harvest:
    """What vLLM's own layers hand the selection functions while a model is built."""

    def __init__(self) -> None:
        self.moe: list[Any] = []
        self.attention: list[dict[str, Any]] = []

    def __enter__(self) -> Harvest:
        import vllm.model_executor.layers.fused_moe.oracle.nvfp4 as nvfp4
        import vllm.model_executor.layers.fused_moe.oracle.unquantized as unq
        import vllm.v1.attention.selector as selector

        self._saved = [(selector, "_cached_get_attn_backend", selector._cached_get_attn_backend),
                       (unq, "select_unquantized_moe_backend",
                        unq.select_unquantized_moe_backend),
                       (nvfp4, "select_nvfp4_moe_backend", nvfp4.select_nvfp4_moe_backend)]
        harvest = self

        def attn(backend: Any, attn_selector_config: Any, num_heads: Any = None,
                 **more: Any) -> Any:  # 0.32 adds keyword-only _run_kv_cache_dtype
            harvest.attention.append({**attn_selector_config._asdict(), "num_heads": num_heads})
            return harvest._saved[0][2](backend, attn_selector_config, num_heads, **more)

        def unquantized(moe_config: Any) -> Any:
            harvest.moe.append(moe_config)
            return harvest._saved[1][2](moe_config)

        selector._cached_get_attn_backend = attn
        unq.select_unquantized_moe_backend = unquantized
        import vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method as method
        self._saved.append((method, "select_unquantized_moe_backend",
                            method.select_unquantized_moe_backend))
        method.select_unquantized_moe_backend = unquantized
        return self

    def __exit__(self, *exc: Any) -> None:
        for module, name, original in self._saved:
            setattr(module, name, original)


def _moe_layer(moe_config: Any) -> dict[str, Any]:
    pc = moe_config.moe_parallel_config
    return {"activation": moe_config.activation.name, "is_act_and_mul": moe_config.is_act_and_mul,
            "routing_method": moe_config.routing_method.name,
            "router_logits_dtype": str(moe_config.router_logits_dtype).replace("torch.", ""),
            "hidden_dim": moe_config.hidden_dim, "swiglu_limit": moe_config.swiglu_limit,
            "in_dtype": str(moe_config.in_dtype).replace("torch.", ""),
            "tp": pc.tp_size, "ep": pc.ep_size, "dp": pc.dp_size,
            "batched": pc.use_batched_activation_format, "lora": moe_config.is_lora_enabled}


# a compressed-tensors NVFP4 config quantizing every Linear: which layers consult it
_EVERY_LINEAR = {
    "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
    "config_groups": {"group_0": {
        "targets": ["Linear"], "format": "nvfp4-pack-quantized",
        "weights": {"num_bits": 4, "type": "float", "symmetric": True, "group_size": 16,
                    "strategy": "tensor_group", "dynamic": False},
        "input_activations": {"num_bits": 4, "type": "float", "symmetric": True,
                              "group_size": 16, "strategy": "tensor_group",
                              "dynamic": "local"}}},
    "ignore": [],
}


def moe_layer_class() -> type:
    """The routed-experts layer class: FusedMoE (fused_moe/layer.py) until 0.32 renamed it
    RoutedExperts (fused_moe/routed_experts.py)."""
    import importlib

    for module, name in (("vllm.model_executor.layers.fused_moe.layer", "FusedMoE"),
                         ("vllm.model_executor.layers.fused_moe.routed_experts",
                          "RoutedExperts")):
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
    raise SystemExit("kernel_select.py: no FusedMoE / RoutedExperts layer class; teach "
                     "moe_layer_class()")


class QuantConsults:
    """The layers that ask a quantization config for their method while vLLM builds a
    model (layers built with quant_config=None, such as routers, never ask), in build
    order, with the prefix they ask with."""

    def __enter__(self) -> list[list[str]]:
        from vllm.model_executor.layers.attention import Attention
        from vllm.model_executor.layers.linear import LinearBase
        from vllm.model_executor.layers.quantization.compressed_tensors import (
            compressed_tensors as ct,
        )

        self.seen: list[list[str]] = []
        self._cls = ct.CompressedTensorsConfig
        self._original = self._cls.get_quant_method
        seen, original = self.seen, self._original

        moe_layer = moe_layer_class()

        def traced(config: Any, layer: Any, prefix: str) -> Any:
            kind = ("moe" if isinstance(layer, moe_layer) else "linear"
                    if isinstance(layer, LinearBase) else "attention"
                    if isinstance(layer, Attention) else None)
            if kind is not None and "visual" not in prefix:
                seen.append([prefix, type(layer).__name__, kind])
            return original(config, layer, prefix)

        self._cls.get_quant_method = traced
        return self.seen

    def __exit__(self, *exc: Any) -> None:
        self._cls.get_quant_method = self._original


def _model_class_facts(model: Any) -> dict[str, Any]:
    """The model class's weight-name mapper (vLLM applies it to a quantization config's
    layer names) and its fused layer shards (packed_modules_mapping)."""
    mapper = getattr(type(model), "hf_to_vllm_mapper", None)
    return {
        "mapper": None if mapper is None else {
            "prefix": dict(mapper.orig_to_new_prefix), "substr": dict(mapper.orig_to_new_substr),
            "suffix": dict(mapper.orig_to_new_suffix),
            "regex": {p.pattern: v for p, v in mapper.orig_to_new_regex.items()}},
        "packed": {k: list(v) for k, v in (getattr(model, "packed_modules_mapping", None)
                                           or {}).items()},
    }


def _attn_args(args: dict[str, Any]) -> dict[str, Any]:
    out = {k: (str(v).replace("torch.", "") if k == "dtype" else v) for k, v in args.items()}
    out.pop("kv_cache_dtype", None)
    out.pop("block_size", None)
    out.pop("use_batch_invariant", None)
    return out


def archetypes() -> tuple[dict[str, Any], dict[str, Any]]:
    """Layer shapes of each archetype (target and drafter), and the FusedMoEConfig objects
    the gates are evaluated on, by architecture."""
    facts: dict[str, Any] = {}
    moe_configs: dict[str, Any] = {}
    for target, method, drafter in ARCHETYPES:
        spec: dict[str, Any] = {"method": method, "num_speculative_tokens": 2}
        if drafter is not None:
            spec.update(model="<drafter>", config=copy.deepcopy(drafter))
        for quantized in (False, True):
            config = copy.deepcopy(target)
            if quantized:
                config["quantization_config"] = copy.deepcopy(_EVERY_LINEAR)
            vc = engine_config(config, speculative_config=copy.deepcopy(spec))
            distributed(vc)
            dvc = draft_config(vc)
            dmc = vc.speculative_config.draft_model_config
            facts.setdefault(vc.model_config.architecture, {}).setdefault(
                "drafters", {})[method] = dmc.architecture
            for arch, vcfg, mcfg in ((vc.model_config.architecture, vc, None),
                                     (dmc.architecture, dvc, dmc)):
                entry = facts.setdefault(arch, {})
                if quantized:
                    if mcfg is not None and drafter is not None:
                        continue  # a separate drafter checkpoint: its own (none) quantization
                    vp.refresh()
                    with QuantConsults() as seen:
                        build(vcfg, mcfg)
                    entry["layers"] = seen
                    continue
                vp.refresh()
                with Harvest() as h:
                    model = build(vcfg, mcfg)
                entry.update(_model_class_facts(model))
                entry["attention"] = _attn_args(h.attention[-1]) if h.attention else None
                if mcfg is not None:
                    entry["non_causal"] = bool(vcfg.attention_config.use_non_causal)
                if h.moe:
                    entry["moe"] = _moe_layer(h.moe[0])
                    moe_configs.setdefault(arch, h.moe[0])
    return facts, moe_configs


def moe_variants(moe_configs: dict[str, Any]) -> dict[str, Any]:
    """Each archetype's MoE layer config as vLLM built it (tp1), and vLLM's own
    FusedMoEParallelConfig.make for tensor parallel 2 with and without expert parallel."""
    from vllm.config import ParallelConfig
    from vllm.model_executor.layers.fused_moe.config import FusedMoEParallelConfig

    out = {}
    for arch, cfg in moe_configs.items():
        out[f"{arch}/tp1"] = cfg
        for name, ep in (("tp2", False), ("tp2-ep", True)):
            pc = FusedMoEParallelConfig.make(tp_size_=2, pcp_size_=1, dp_size_=1, sp_size_=1,
                                             vllm_parallel_config=ParallelConfig(
                                                 enable_expert_parallel=ep))
            out[f"{arch}/{name}"] = dataclasses.replace(cfg, moe_parallel_config=pc)
        out[f"{arch}/tp1-lora"] = dataclasses.replace(cfg, is_lora_enabled=True)
    return out


# --- the decisions --------------------------------------------------------------------------

def _choices(getter: Any) -> list[str] | None:
    """The choices of an env_with_choices getter (envs.py), through deprecated_env."""
    seen = [getter]
    while seen:
        fn = seen.pop()
        cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True))
        if "choices" in cells:
            found = cells["choices"].cell_contents
            return list(found() if callable(found) else found)
        seen += [c.cell_contents for c in cells.values() if callable(c.cell_contents)
                 and hasattr(c.cell_contents, "__code__")]
    return None


INVALID = "not-a-choice"


def switches() -> dict[str, Any]:
    """How vLLM reads each switch (envs.py): the spellings of ENV_SAMPLES, a choice
    variable's choices and one invalid value, a list variable's one- and two-item values."""
    import vllm.envs as envs

    out = {}
    for name in SWITCHES:
        if name not in envs.environment_variables:
            continue  # gone in this version (0.32: VLLM_USE_FLASHINFER_MOE_FP4...): not read
        choices = _choices(envs.environment_variables[name])
        samples = list(ENV_SAMPLES)
        if choices is not None:
            samples += [*choices, INVALID]
        samples += ["KernelA", "KernelA,KernelB"]
        parsed = {}
        for sample in samples:
            with vp.environment({name: sample} if sample else {}):
                value = _outcome(functools.partial(getattr, envs, name))
            parsed[sample] = value if isinstance(value, dict) else repr(value)
        entry: dict[str, Any] = {"read": parsed}
        if choices is not None:
            entry["choices"] = choices
            entry["invalid"] = INVALID
        if parsed["KernelA,KernelB"] == repr(["KernelA", "KernelB"]) and \
                parsed["KernelA"] == repr(["KernelA"]):
            entry["split"] = ","
        out[name] = entry
    return out


def nvfp4_linear() -> dict[str, Any]:
    import vllm.model_executor.kernels.linear as lin
    from vllm.platforms import PlatformEnum

    candidates = lin._POSSIBLE_NVFP4_KERNELS[PlatformEnum.CUDA]
    # VLLM_NVFP4_GEMM_BACKEND's table (0.23); 0.32 has no such variable (--linear-backend)
    env_table = getattr(lin, "_NVFP4_BACKEND_TO_KERNEL", None)
    classes = {k.__name__: k for k in [*candidates, *(env_table or {}).values()]}
    gates = {}
    for name, cls in classes.items():
        gates[name] = {
            "is_supported": tabulate(lambda cls=cls: _ok_reason(cls.is_supported())),
            "can_implement": tabulate(lambda cls=cls: _ok_reason(
                cls.can_implement(lin.NvFp4LinearLayerConfig())), ccs=GRID_CC[-1:]),
        }
    return {
        "candidates": [k.__name__ for k in candidates],
        "env_backends": (None if env_table is None
                         else {k: v.__name__ for k, v in env_table.items()}),
        "gates": gates,
    }


def linear_backends() -> dict[str, list[str]]:
    import vllm.model_executor.kernels.linear as lin

    return {b: sorted(k.__name__ for k in ks) for b, ks in lin._LINEAR_BACKEND_KERNEL_MAP.items()}


FP8_SCHEMES = {
    # ModelOptFp8LinearMethod.create_weights (modelopt.py): static per-tensor both
    "fp8_per_tensor": ("kFp8StaticTensorSym", "kFp8StaticTensorSym"),
}


def fp8_linear() -> dict[str, Any]:
    import torch
    import vllm.model_executor.kernels.linear as lin
    import vllm.model_executor.layers.quantization.utils.quant_utils as qu
    from vllm.platforms import PlatformEnum

    candidates = lin._POSSIBLE_FP8_KERNELS[PlatformEnum.CUDA]
    gates = {}
    for cls in candidates:
        def supported(cls=cls) -> Any:
            major, minor = vp.STATE["cc"]
            return _ok_reason(cls.is_supported(major * 10 + minor))

        def implement(scheme: str, cls=cls) -> Any:
            wkey, akey = (getattr(qu, n) for n in FP8_SCHEMES[scheme])
            config = lin.FP8ScaledMMLinearLayerConfig(
                weight_quant_key=wkey, activation_quant_key=akey, weight_shape=(2048, 5120),
                input_dtype=torch.bfloat16, out_dtype=torch.bfloat16)
            return _ok_reason(cls.can_implement(config))

        gates[cls.__name__] = {"is_supported": tabulate(supported),
                               "can_implement": tabulate(implement, {"scheme": FP8_SCHEMES})}
    return {"candidates": [k.__name__ for k in candidates], "schemes": FP8_SCHEMES,
            "gates": gates}


MOE_SCHEMES = {"nvfp4_w4a4": ("kNvfp4Static", "kNvfp4Dynamic"),
               "nvfp4_w4a16": ("kNvfp4Static", None), "unquantized": (None, None)}


def _experts_gate(cls: Any, variants: dict[str, Any], schemes: list[str]) -> dict[str, Any]:
    import vllm.model_executor.layers.fused_moe.modular_kernel as mk
    import vllm.model_executor.layers.quantization.utils.quant_utils as qu

    def evaluate(scheme: str, layer: str) -> Any:
        cfg = variants[layer]
        w, a = (getattr(qu, n) if n else None for n in MOE_SCHEMES[scheme])
        fmt = (mk.FusedMoEActivationFormat.BatchedExperts
               if cfg.moe_parallel_config.use_batched_activation_format
               else mk.FusedMoEActivationFormat.Standard)
        return _ok_reason(cls.is_supported_config(cls, cfg, w, a, fmt))

    return tabulate(evaluate, {"scheme": schemes, "layer": list(variants)})


def _moe_backend_values() -> list[str]:
    from typing import get_args

    from vllm.config.kernel import MoEBackend

    return list(get_args(MoEBackend))


def nvfp4_moe(variants: dict[str, Any]) -> dict[str, Any]:
    import vllm.model_executor.layers.fused_moe.oracle.nvfp4 as o
    import vllm.model_executor.layers.quantization.utils.flashinfer_utils as fiu

    # VLLM_FLASHINFER_MOE_BACKEND's reading (0.23); gone from 0.32
    get_flashinfer_moe_backend = getattr(fiu, "get_flashinfer_moe_backend", None)

    mapping = {}
    for value in _moe_backend_values():
        if value != "auto":
            result = _outcome(functools.partial(_member_value, o.map_nvfp4_backend, value))
            mapping[value] = result

    def fi(value: str) -> Any:
        assert get_flashinfer_moe_backend is not None  # only tabulated when it exists
        with vp.environment({"VLLM_FLASHINFER_MOE_BACKEND": value}):
            return o.fi_2_vllm_backend_map[get_flashinfer_moe_backend()].value

    fi_env = (None if get_flashinfer_moe_backend is None else
              tabulate(fi, {"value": ["throughput", "latency", "masked_gemm"]},
                       sets=("VLLM_FLASHINFER_MOE_BACKEND",)))
    experts = {b.value: [k.__name__ for k in o.backend_to_kernel_cls(b)] for b in o.NvFp4MoeBackend}
    classes = {k.__name__: k for b in o.NvFp4MoeBackend for k in o.backend_to_kernel_cls(b)}
    return {
        "order": local_list(o.select_nvfp4_moe_backend, "AVAILABLE_BACKENDS"),
        "with_clamp": local_list(o.select_nvfp4_moe_backend, "NVFP4_BACKENDS_WITH_CLAMP"),
        "flashinfer": [b.value for b in o.FLASHINFER_NVFP4_MOE_BACKENDS],
        "moe_backends": mapping,
        "fi_env": fi_env,
        "experts": experts,
        "gates": {n: _experts_gate(k, variants, ["nvfp4_w4a4", "nvfp4_w4a16"])
                  for n, k in classes.items()},
    }


def unquantized_moe(variants: dict[str, Any]) -> dict[str, Any]:
    import vllm.model_executor.layers.fused_moe.oracle.unquantized as o

    mapping = {}
    for value in _moe_backend_values():
        if value != "auto":
            mapping[value] = _outcome(
                functools.partial(_member_name, o.map_unquantized_backend, value))
    cuda_order = local_list(o._get_priority_backends, "_AVAILABLE_BACKENDS",
                            within="current_platform.is_cuda()")
    classes: dict[str, list[Any]] = {}
    for member in cuda_order + ["AITER"]:
        b = o.UnquantizedMoeBackend[member]
        cls = _outcome(functools.partial(o.backend_to_kernel_cls, b))
        if not isinstance(cls, dict):  # one class (0.23) or a list of them (0.32)
            classes[member] = list(cls) if isinstance(cls, list | tuple) else [cls]
    return {
        "cuda_order": cuda_order,
        "labels": {b.name: b.value for b in o.UnquantizedMoeBackend},
        "moe_backends": mapping,
        "experts": {m: (cs[0].__name__ if len(cs) == 1 else [c.__name__ for c in cs])
                    for m, cs in classes.items()},
        "gates": {c.__name__: _experts_gate(c, variants, ["unquantized"])
                  for cs in classes.values() for c in cs},
    }


def attention(archs: dict[str, Any]) -> dict[str, Any]:
    from typing import get_args

    import torch
    from vllm.config.cache import CacheDType
    from vllm.platforms import cuda
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backend import AttentionType
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    priorities = {}
    for cc in GRID_CC:
        major, minor = _cc(cc)
        priorities[cc] = [b.name for b in cuda._get_backend_priorities(
            False, DeviceCapability(major, minor))]
    head_sizes = sorted({32, 48, 64, 80, 96, 112, 128, 160, 192, 256, 320, 512, 576}
                        | {a["attention"]["head_size"] for a in archs.values()
                           if a.get("attention")})
    dtypes = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
    kv_dtypes = list(get_args(CacheDType))
    blocks = [None, 16, 32, 64, 128]
    attn_types = [AttentionType.DECODER, AttentionType.ENCODER_ONLY]
    names = sorted({n for order in priorities.values() for n in order} | {
        "FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION", "TURBOQUANT",
        "FLASH_ATTN_DIFFKV", "CUTLASS_MLA", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA",
        "FLASH_ATTN_MLA"})
    backends: dict[str, Any] = {}
    for name in names:
        member = AttentionBackendEnum[name]
        cls = _outcome(member.get_class)
        if isinstance(cls, dict):
            backends[name] = {"import_error": cls}
            continue

        def cap(cls=cls) -> Any:
            major, minor = vp.STATE["cc"]
            return cls.supports_compute_capability(DeviceCapability(major, minor))

        def combination(head: int, dtype: str, kv: str, block: Any, sink: bool,
                        cls=cls) -> Any:
            major, minor = vp.STATE["cc"]
            return cls.supports_combination(head, dtypes[dtype], kv, block, False, sink, False,
                                            DeviceCapability(major, minor))

        backends[name] = {
            "head_size": tabulate(lambda h, cls=cls: cls.supports_head_size(h),
                                  {"h": head_sizes}),
            "dtype": tabulate(lambda d, cls=cls: cls.supports_dtype(dtypes[d]), {"d": dtypes}),
            "kv_cache_dtype": tabulate(lambda k, cls=cls: cls.supports_kv_cache_dtype(k),
                                       {"k": kv_dtypes}),
            "block_size": tabulate(lambda b, cls=cls: cls.supports_block_size(b),
                                   {"b": blocks}, ccs=GRID_CC[-1:]),
            "mm_prefix": tabulate(lambda cls=cls: cls.supports_mm_prefix()),
            "mla": tabulate(lambda cls=cls: cls.is_mla()),
            "sink": tabulate(lambda cls=cls: cls.supports_sink()),
            "sparse": tabulate(lambda cls=cls: cls.is_sparse()),
            "per_head_quant_scales": tabulate(lambda cls=cls: cls.supports_per_head_quant_scales()),
            "compute_capability": tabulate(cap),
            "attn_type": tabulate(lambda t, cls=cls: cls.supports_attn_type(t),
                                  {"t": attn_types}),
            "non_causal": tabulate(lambda cls=cls: cls.supports_non_causal()),
            "batch_invariance": tabulate(lambda cls=cls: cls.supports_batch_invariance()),
            "kv_connector": tabulate(lambda cls=cls: cls.supports_kv_connector()),
            "combination": tabulate(combination, {"head": head_sizes, "dtype": ["float16",
                                                                            "bfloat16"],
                                                   "kv": kv_dtypes, "block": [None],
                                                   "sink": [False, True]}),
            "kv_layout": tabulate(lambda cls=cls: _outcome(
                lambda: str(cls.get_required_kv_cache_layout()))),
        }
    return {"priorities": priorities, "backends": backends, "kv_cache_dtypes": kv_dtypes}


def _tree(table: dict[str, Any], names: list[str]) -> Any:
    """The table as a decision tree over `names` (key order), a level collapsed wherever
    every branch below it gives the same result: {"by": name, "values": {v: subtree}} or
    {"is": result}."""
    if not names:
        (value,) = table.values()
        return {"is": value}
    name, rest = names[0], names[1:]
    branches: dict[str, dict[str, Any]] = {}
    for key, value in table.items():
        head, _, tail = key.partition("|")
        branches.setdefault(head.split("=", 1)[1], {})[tail] = value
    subtrees = {v: _tree(sub, rest) for v, sub in branches.items()}
    texts = {json.dumps(t, sort_keys=True) for t in subtrees.values()}
    if len(texts) == 1:
        return next(iter(subtrees.values()))
    return {"by": name, "values": subtrees}


def _section(ctx: Context, name: str, fn: Callable[[], Any]) -> Any:
    """One decision's facts; a decision this version's code makes differently (a renamed
    table, a removed switch) is recorded as unrecorded with the error, not fatal: the
    predictor then says it cannot predict that decision on this version."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - recorded, with a finding
        ctx.finding(f"kernel_select: {name} not recorded: {type(exc).__name__}: {exc}")
        return {"unrecorded": f"{type(exc).__name__}: {exc}"}


def record(ctx: Context) -> dict[str, Any]:
    vp.install((12, 1))

    archs, moe_configs = archetypes()
    variants = moe_variants(moe_configs)
    return {
        **header("kernel_select", SOURCE),
        "grid": {"cc": list(GRID_CC), "probes": list(vp.PROBES), "env": list(ENV_DOMAIN)},
        "switches": switches(),
        "archetypes": archs,
        "moe_layers": {k: _moe_layer(v) for k, v in variants.items()},
        "linear_backends": _section(ctx, "linear_backends", linear_backends),
        "nvfp4_linear": _section(ctx, "nvfp4_linear", nvfp4_linear),
        "fp8_linear": _section(ctx, "fp8_linear", fp8_linear),
        "nvfp4_moe": _section(ctx, "nvfp4_moe", lambda: nvfp4_moe(variants)),
        "unquantized_moe": _section(ctx, "unquantized_moe", lambda: unquantized_moe(variants)),
        "attention": _section(ctx, "attention", lambda: attention(archs)),
    }
