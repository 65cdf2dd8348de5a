"""The case table the kernel-selection predictor is checked against vLLM 0.23 on, and the
comparison of one case's prediction with what vLLM's own code did (the oracle,
tests/support/vllm_oracle/kernel_select.py).

Each case is a boot: a compute capability and the image's probe answers, a checkpoint's
config.json (and hf_quant_config.json), the engine arguments `vllm serve` flags set, and the
environment. The checkpoints are the repository's Qwen3.6-35B-A3B fixtures (tests/data) cut
to 4 layers, with their quantization config varied: compressed-tensors W4A4 and W4A16,
ModelOpt NVFP4 and W4A16_NVFP4 in both layouts, ModelOpt MIXED_PRECISION with W4A4 and W4A16
experts, an FP8 KV cache scheme.
"""

from __future__ import annotations

import copy
import itertools
import json
import random
from pathlib import Path
from typing import Any

from imagebuild.preflight.kernel_select.deploy import deployment
from imagebuild.preflight.kernel_select.facts import Facts, NotRecorded, VllmRaises
from imagebuild.preflight.kernel_select.predict import Decision, predict

DATA = Path(__file__).resolve().parents[1] / "data"
CCS = ("10.0", "12.0", "12.1")
MOE_BACKENDS = ("auto", "triton", "deep_gemm", "cutlass", "flashinfer_trtllm",
                "flashinfer_cutlass", "flashinfer_cutedsl", "flashinfer_b12x", "marlin",
                "humming", "triton_unfused", "aiter", "emulation")
SWITCHES = {
    "VLLM_USE_FLASHINFER_MOE_FP4": ("0", "1"),
    "VLLM_USE_FLASHINFER_MOE_FP16": ("0", "1"),
    "VLLM_NVFP4_GEMM_BACKEND": ("cutlass", "marlin", "flashinfer-cutlass", "flashinfer-b12x",
                                "emulation"),
    "VLLM_DISABLED_KERNELS": ("FlashInferCutlassNvFp4LinearKernel",
                              "FlashInferCutlassNvFp4LinearKernel,CutlassNvFp4LinearKernel"),
    "VLLM_USE_FLASHINFER_SAMPLER": ("0", "1"),
    "VLLM_TEST_FORCE_FP8_MARLIN": ("1",),
    "VLLM_BATCH_INVARIANT": ("1",),
    "VLLM_FLASHINFER_MOE_BACKEND": ("throughput", "latency"),
}


def _load(rel: str) -> dict:
    doc = json.loads((DATA / rel).read_text())
    doc.pop("_fixture_note", None)
    return doc


def _target() -> dict:
    cfg = _load("configs/qwen36-35b-a3b.json")
    cfg.pop("quantization_config", None)
    text = cfg["text_config"]
    text["num_hidden_layers"] = 4
    text["layer_types"] = text["layer_types"][:4]
    cfg["vision_config"]["depth"] = 2
    return cfg


def _drafter() -> dict:
    cfg = _load("configs/zlab-dflash-31977fbe.json")
    cfg["num_hidden_layers"] = 2
    cfg["layer_types"] = cfg["layer_types"][:2]
    cfg["dflash_config"]["target_layer_ids"] = [1, 2, 3]
    cfg["num_target_layers"] = 4
    return cfg


def _ct_group(inputs: bool) -> dict:
    arg = {"num_bits": 4, "type": "float", "symmetric": True, "group_size": 16,
           "strategy": "tensor_group", "dynamic": False, "observer": "minmax"}
    group = {"targets": ["Linear"], "format": "nvfp4-pack-quantized", "weights": dict(arg)}
    group["input_activations"] = {**arg, "dynamic": "local"} if inputs else None
    return group


CT_IGNORE = ["lm_head", "re:.*visual.*", "re:.*linear_attn.*", "re:.*mlp.gate$",
             "re:.*mlp.shared_expert_gate$", "re:^mtp.*"]
MODELOPT_EXCLUDE = ["lm_head", "model.visual*", "*linear_attn*", "*mlp.gate", "mtp*"]


def _mixed_layers(experts: str) -> dict:
    out = {}
    for i in range(4):
        base = f"model.language_model.layers.{i}"
        out[f"{base}.mlp.experts"] = {"quant_algo": experts, "group_size": 16}
        for p in ("gate_proj", "up_proj", "down_proj"):
            out[f"{base}.mlp.shared_expert.{p}"] = {"quant_algo": experts, "group_size": 16}
        if i == 3:
            for p in ("q_proj", "k_proj", "v_proj", "o_proj"):
                out[f"{base}.self_attn.{p}"] = {"quant_algo": "FP8"}
    return out


def checkpoints() -> dict[str, tuple[dict, dict, str]]:
    """name -> (config.json quantization_config or None, extra files, --quantization)."""
    ct = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
          "quantization_status": "compressed", "kv_cache_scheme": None, "ignore": CT_IGNORE}
    out: dict[str, tuple[dict, dict, str]] = {
        "ct-w4a4": ({**ct, "config_groups": {"group_0": _ct_group(True)}}, {},
                    "compressed-tensors"),
        "ct-w4a16": ({**ct, "config_groups": {"group_0": _ct_group(False)}}, {},
                     "compressed-tensors"),
        "ct-w4a4-mtp-quantized": ({**ct, "config_groups": {"group_0": _ct_group(True)},
                                   "ignore": CT_IGNORE[:-1]}, {}, "compressed-tensors"),
        "ct-w4a4-fp8kv": ({**ct, "config_groups": {"group_0": _ct_group(True)},
                           "kv_cache_scheme": {"num_bits": 8, "type": "float",
                                               "strategy": "tensor", "dynamic": False,
                                               "symmetric": True}}, {}, "compressed-tensors"),
    }
    for algo in ("NVFP4", "W4A16_NVFP4"):
        slug = algo.lower().replace("_nvfp4", "")
        # the layout ModelOpt >= 0.39 writes into config.json
        out[f"modelopt-{slug}"] = ({"quant_method": "modelopt", "quant_algo": algo,
                                    "group_size": 16, "kv_cache_quant_algo": None,
                                    "ignore": MODELOPT_EXCLUDE}, {}, "modelopt")
        # the older hf_quant_config.json layout (producer block), no quantization_config
        out[f"modelopt-{slug}-hfquant"] = (None, {"hf_quant_config.json": {
            "producer": {"name": "modelopt", "version": "0.37.0"},
            "quantization": {"quant_algo": algo, "group_size": 16, "kv_cache_quant_algo": None,
                             "exclude_modules": MODELOPT_EXCLUDE}}}, "modelopt")
    for experts in ("NVFP4", "W4A16_NVFP4"):
        slug = experts.lower().replace("_nvfp4", "")
        out[f"modelopt-mixed-{slug}"] = ({
            "quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
            "kv_cache_quant_algo": None, "producer": {"name": "modelopt", "version": "0.39.0"},
            "ignore": MODELOPT_EXCLUDE, "quantized_layers": _mixed_layers(experts)}, {},
            "modelopt")
    # config.json names MIXED_PRECISION, the per-layer map lives in hf_quant_config.json
    # (the layout of tests/data/hub/nvidia/Qwen3.6-35B-A3B-NVFP4)
    for experts in ("NVFP4", "W4A16_NVFP4"):
        slug = experts.lower().replace("_nvfp4", "")
        out[f"modelopt-mixed-{slug}-split"] = ({
            "quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
            "kv_cache_quant_algo": None, "producer": {"name": "modelopt", "version": "0.39.0"},
            "exclude_modules": MODELOPT_EXCLUDE}, {"hf_quant_config.json": {
                "producer": {"name": "modelopt", "version": "0.39.0"},
                "quantization": {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": None,
                                 "exclude_modules": MODELOPT_EXCLUDE,
                                 "quantized_layers": _mixed_layers(experts)}}}, "modelopt")
    out["modelopt-nvfp4-fp8kv"] = ({"quant_method": "modelopt", "quant_algo": "NVFP4",
                                    "group_size": 16, "kv_cache_quant_algo": "FP8",
                                    "kv_cache_scheme": {"type": "float", "num_bits": 8,
                                                        "dynamic": False},
                                    "ignore": MODELOPT_EXCLUDE}, {}, "modelopt")
    return out


def make_case(cid: str, checkpoint: str, cc: str = "12.1", probes: dict | None = None,
              env: dict | None = None, method: str | None = "mtp",
              **engine: Any) -> dict:
    q, files, flag = checkpoints()[checkpoint]
    config = _target()
    if q is not None:
        config["quantization_config"] = copy.deepcopy(q)
    eng: dict[str, Any] = {"quantization": flag, **engine}
    spec_extra = {k[5:]: eng.pop(k) for k in list(eng) if k.startswith("spec_")}
    if method == "mtp":
        eng["speculative_config"] = {"method": "mtp", "num_speculative_tokens": 2, **spec_extra}
    elif method == "dflash":
        eng["speculative_config"] = {"method": "dflash", "num_speculative_tokens": 4,
                                     "model": "<drafter>", "config": _drafter(), **spec_extra}
    return {"id": cid, "cc": cc, "probes": probes or {}, "config": config,
            "files": copy.deepcopy(files), "engine": eng, "env": env or {},
            "checkpoint": checkpoint}


def table(seed: int = 20260904) -> list[dict]:
    """The cases: every checkpoint on every capability on auto, with and without FlashInfer;
    each switch value and each --moe-backend and --linear-backend value on the W4A4 and
    W4A16 checkpoints of both formats; the attention backends with both KV dtypes and both
    drafters; the drafter's own moe_backend and attention_backend; then seeded
    combinations of all of these."""
    cases: list[dict] = []
    names = list(checkpoints())
    for cp, cc in itertools.product(names, CCS):
        cases.append(make_case(f"{cp}@{cc}", cp, cc))
        cases.append(make_case(f"{cp}@{cc}/no-flashinfer", cp, cc, {"flashinfer": False}))
    for cc in CCS:  # an image whose CUTLASS FP4 kernels were not built for this GPU
        cases.append(make_case(f"ct-w4a4@{cc}/no-cutlass-fp4", "ct-w4a4", cc,
                               {"cutlass_fp4": False}))
    per_switch = [(cp, "12.1") for cp in ("ct-w4a4", "ct-w4a16", "modelopt-nvfp4",
                                          "modelopt-w4a16")] + [("ct-w4a4", "10.0"),
                                                                ("ct-w4a4", "12.0")]
    for cp, cc in per_switch:
        for name, values in SWITCHES.items():
            for value in values:
                cases.append(make_case(f"{cp}@{cc}/{name}={value}", cp, cc, env={name: value}))
    for cp, cc in (("ct-w4a4", "12.1"), ("ct-w4a16", "12.1"), ("modelopt-w4a16", "12.1"),
                   ("ct-w4a4", "10.0")):
        for mb in MOE_BACKENDS[1:]:
            cases.append(make_case(f"{cp}@{cc}/moe={mb}", cp, cc, moe_backend=mb))
    for cp, cc in (("ct-w4a4", "12.1"), ("ct-w4a16", "12.1"), ("modelopt-nvfp4", "10.0")):
        for lb in ("cutlass", "marlin", "flashinfer_cutlass", "emulation"):
            cases.append(make_case(f"{cp}@{cc}/linear={lb}", cp, cc, linear_backend=lb))
    for cp in ("ct-w4a4", "modelopt-nvfp4-fp8kv"):
        for cc in ("10.0", "12.1"):
            for backend in ("flash_attn", "flashinfer", "triton_attn", "flex_attention"):
                for kv in ("auto", "fp8"):
                    for method in ("mtp", "dflash"):
                        cases.append(make_case(f"{cp}@{cc}/attn={backend}/kv={kv}/{method}",
                                               cp, cc, method=method,
                                               attention_backend=backend, kv_cache_dtype=kv))
    for cc in CCS:
        for mb in ("triton", "flashinfer_cutlass", "cutlass"):
            cases.append(make_case(f"ct-w4a4@{cc}/moe=cutlass/spec-moe={mb}", "ct-w4a4", cc,
                                   moe_backend="cutlass", spec_moe_backend=mb))
        cases.append(make_case(f"ct-w4a4@{cc}/dflash/spec-attn=flash_attn", "ct-w4a4", cc,
                               method="dflash", spec_attention_backend="flash_attn"))
        cases.append(make_case(f"ct-w4a4@{cc}/plain", "ct-w4a4", cc, method=None))
    rng = random.Random(seed)
    pool = [(n, v) for n, vs in SWITCHES.items() for v in vs]
    for i in range(60):
        cp = rng.choice(names)
        cc = rng.choice(CCS)
        env = dict(rng.sample(pool, rng.choice([1, 2, 3])))
        engine: dict[str, Any] = {}
        if rng.random() < 0.5:
            engine["moe_backend"] = rng.choice(MOE_BACKENDS)
        if rng.random() < 0.3:
            engine["attention_backend"] = rng.choice(["flash_attn", "flashinfer", "triton_attn"])
        if rng.random() < 0.3:
            engine["kv_cache_dtype"] = rng.choice(["auto", "fp8", "bfloat16"])
        if rng.random() < 0.3:
            engine["spec_moe_backend"] = rng.choice(["triton", "flashinfer_cutlass", "marlin"])
        probes = rng.choice([{}, {}, {}, {"flashinfer": False}, {"cutlass_fp4": False}])
        method = rng.choice(["mtp", "mtp", "dflash", None])
        cases.append(make_case(f"mix{i}:{cp}@{cc}:{sorted(env.items())}:{engine}:{probes}:"
                               f"{method}", cp, cc, probes, env, method, **engine))
    return cases


# --- the comparison -------------------------------------------------------------------------

TARGET_KINDS = ("nvfp4_gemm", "fp8_gemm", "moe", "attention")
DRAFTER_KINDS = ("drafter_moe", "drafter_attention")


def predicted(facts: Facts, case: dict) -> dict[str, Any]:
    """What the predictor says for the case: {"config_error": (class, message)} when vLLM
    refuses the checkpoint or its arguments first, else the decisions."""
    probes = {p: True for p in facts["grid"]["probes"]} | case.get("probes", {})
    engine = copy.deepcopy(case["engine"])
    spec = engine.get("speculative_config")
    drafter = spec.pop("config", None) if spec else None
    try:
        dep = deployment(facts, cc=case["cc"], probes=probes, config=case["config"],
                         files=case.get("files"), engine=engine, env=case.get("env", {}),
                         drafter_config=drafter)
    except VllmRaises as exc:
        return {"config_error": (exc.kind, exc.message)}
    except NotRecorded as exc:
        return {"unknown": str(exc)}
    return {"decisions": predict(facts, dep), "deployment": dep}


def compare(facts: Facts, case: dict, oracle: dict) -> tuple[int, list[str]]:
    """(comparisons made, disagreements): every decision vLLM's build reached, its log lines
    and its exception (class and message), the first failing decision in build order."""
    cid = case["id"]
    if "crashed" in oracle:
        return 1, [f"{cid}: the oracle crashed ({oracle['crashed']})"]
    p = predicted(facts, case)
    if "unknown" in p:
        return 1, [f"{cid}: the predictor cannot predict it: {p['unknown']}"]
    err = oracle.get("error")
    if oracle.get("stage") == "config":
        got = p.get("config_error")
        want = (err["class"], err["message"]) if err else None
        return 1, [] if got == want else [f"{cid}: config: vLLM {want}, predicted {got}"]
    if "config_error" in p:
        return 1, [f"{cid}: predicted a refusal {p['config_error']} but vLLM built the model "
                   f"(stage {oracle.get('stage')}, error {err})"]
    decisions: dict[str, Decision] = p["decisions"]
    dep = p["deployment"]
    bad: list[str] = []
    n = 0
    # the sampler (built on its own before the model)
    n += 1
    s = decisions["sampler"]
    want_s = oracle.get("sampler_error")
    if (s.error != ((want_s["class"], want_s["message"]) if want_s else None)
            or list(s.log) != oracle["lines"].get("sampler", [])):
        bad.append(f"{cid}: sampler: vLLM {oracle['lines'].get('sampler')} {want_s}, "
                   f"predicted {s.as_dict()}")
    order = [k for k in dep.target.order if k in TARGET_KINDS]
    if dep.drafter is not None:
        dorder = ["drafter_" + k for k in dep.drafter.layers.order
                  if k in ("moe", "attention")]
        order += dorder
    for kind in (*TARGET_KINDS, *DRAFTER_KINDS):
        if kind not in order and kind not in oracle["lines"] and not (
                err and err.get("kind") == kind):
            continue
        d = decisions[kind]
        stopped = err is not None and err.get("kind") in order
        if stopped and kind in order and order.index(kind) > order.index(err["kind"]):
            continue  # vLLM's build never got there
        if oracle.get("stage") == "target" and kind.startswith("drafter_"):
            continue
        n += 1
        if d.unknown:
            bad.append(f"{cid}: {kind}: cannot predict ({d.unknown})")
            continue
        want_err = (err["class"], err["message"]) if err and err.get("kind") == kind else None
        if want_err != d.error:
            bad.append(f"{cid}: {kind}: vLLM raised {want_err}, predicted error {d.error}")
            continue
        lines = oracle["lines"].get(kind, [])
        if want_err is None and list(d.log) != lines:
            bad.append(f"{cid}: {kind}: vLLM logged {lines}, predicted {list(d.log)}")
    if err is not None and err.get("kind") is not None:
        first = next((k for k in order if decisions[k].error), None)
        n += 1
        if first != err["kind"]:
            bad.append(f"{cid}: vLLM's boot stops at {err['kind']}, predicted first failure "
                       f"{first}")
    elif err is not None:
        n += 1
        bad.append(f"{cid}: vLLM raised outside a selecting function: {err}")
    return n, bad
