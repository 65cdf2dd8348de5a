"""The KV-cache predictor against each recorded vLLM version's own code, on hundreds of
generated layouts (N_CASES per version, one seeded generator).

For every version with recorded facts (imagebuild/facts/recorded/, 0.23.0 and 0.32.0), the
predictor answers from that version's facts and is compared with that version's real
functions, run by its oracle venv (tests/support/vllm_oracle/pythons.py):
- the specs as the version's layer code builds them (tests/support/vllm_oracle/specs.py: the
  attention/MLA layer's own get_kv_cache_spec, then the backend's customize_spec where the
  version has one) and unify_kv_cache_spec_page_size (tests/support/vllm_oracle/unify.py):
  outcome, and the page size and block size of every layer when it unifies;
- the "all layers of one type" shortcut of get_kv_cache_groups, which skips unification;
- Platform._align_hybrid_block_size with the real Qwen3.5 / Qwen3-Next model classes and the
  real CPU attention backend (light stand-ins for the config objects): the attention block
  size and the padded mamba page;
- an engine whose patches change unification (dflashfix on 0.23): the patched function.

The generator draws the version's own --kv-cache-dtype values. From 0.32 a drafter's
attention backend is not the target's and shapes its pages, so the 0.32 cases run on the CPU
platform (CPU_ATTN everywhere), MLA targets on CUDA with triton_mla.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import tempfile
from pathlib import Path

import pytest

from imagebuild.errors import UserError
from imagebuild.facts import facts_for
from imagebuild.preflight.kvcache import (
    CannotPredict,
    KVFlags,
    KVModel,
    KVPrediction,
    layout_for_oracle,
    predict,
    simulate_unify,
)
from tests.support.vllm_oracle.pythons import need, recorded

REPO = Path(__file__).resolve().parents[2]
ORACLE = REPO / "tests" / "support" / "vllm_oracle" / "unify.py"
N_CASES = 240
SEED = 20260618
VERSIONS = recorded("kv")

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


# --- seeded layout generator ------------------------------------------------------------------

def _hybrid_target(rng: random.Random) -> dict:
    interval = rng.choice([2, 4])
    kv = rng.choice([1, 2, 4, 8])
    text = {
        "num_hidden_layers": interval * rng.choice([1, 2, 3]),
        "full_attention_interval": interval,
        "num_key_value_heads": kv,
        "num_attention_heads": kv * rng.choice([2, 4, 8]),
        "head_dim": rng.choice([64, 128, 256]),
        "linear_num_key_heads": rng.choice([4, 8, 16]),
        "linear_num_value_heads": rng.choice([8, 16, 32]),
        "linear_key_head_dim": rng.choice([64, 128]),
        "linear_value_head_dim": rng.choice([64, 128]),
        "linear_conv_kernel_dim": 4,
        "mtp_num_hidden_layers": rng.choice([1, 2]),
        "dtype": rng.choice(["bfloat16", "float16"]),
        "max_position_embeddings": 32768,
    }
    if rng.random() < 0.7:
        text["mamba_ssm_dtype"] = "float32"
    if rng.random() < 0.6:
        return {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "text_config": text}
    return {"architectures": ["Qwen3NextForCausalLM"], **text}


def _other_hybrid_target(rng: random.Random) -> dict:
    """Mamba1/Mamba2, linear-attention and short-conv hybrids with small random shapes (the
    model-level oracle, test_kvcache_families_vs_vllm.py, checks how each family reads them)."""
    kv = rng.choice([1, 2, 4, 8])
    heads = kv * rng.choice([2, 4])
    common = {"num_key_value_heads": kv, "num_attention_heads": heads,
              "hidden_size": heads * rng.choice([64, 128]), "torch_dtype": "bfloat16",
              "max_position_embeddings": 32768}
    family = rng.choice(["nemotron_h", "jamba", "minimax", "lfm2_moe", "falcon_h1", "kimi"])
    n = rng.choice([4, 8])
    if family == "nemotron_h":
        return {"architectures": ["NemotronHForCausalLM"], **common, "head_dim": 128,
                "hybrid_override_pattern": ("M-*-" if n == 4 else "M-M-M*E-")[:n],
                "mamba_num_heads": rng.choice([8, 16, 32]), "mamba_head_dim": 64,
                "n_groups": rng.choice([1, 2, 8]), "ssm_state_size": rng.choice([64, 128]),
                "conv_kernel": 4, "chunk_size": rng.choice([128, 256])}
    if family == "jamba":
        return {"architectures": ["JambaForCausalLM"], **common, "num_hidden_layers": n,
                "attn_layer_period": n // 2, "attn_layer_offset": 1,
                "mamba_d_state": rng.choice([16, 32]), "mamba_d_conv": 4, "mamba_expand": 2}
    if family == "minimax":
        return {"architectures": ["MiniMaxText01ForCausalLM"], **common, "num_hidden_layers": n,
                "head_dim": rng.choice([64, 128]), "attn_type_list": [0, 0, 0, 1] * (n // 4)}
    if family == "kimi":  # KDA + multi-head latent attention
        return {"architectures": ["KimiLinearForCausalLM"], **common, "num_hidden_layers": n,
                "kv_lora_rank": rng.choice([256, 512]), "qk_rope_head_dim": 64,
                "qk_nope_head_dim": 128, "v_head_dim": 128, "mla_use_nope": True,
                "linear_attn_config": {"kda_layers": [i for i in range(1, n + 1) if i % 4],
                                       "num_heads": heads, "head_dim": 128,
                                       "short_conv_kernel_size": 4}}
    if family == "lfm2_moe":
        return {"architectures": ["Lfm2MoeForCausalLM"], **common, "num_hidden_layers": n,
                "conv_L_cache": 3, "layer_types": ["conv", "full_attention"] * (n // 2)}
    return {"architectures": ["FalconH1ForCausalLM"], **common, "num_hidden_layers": n // 2,
            "head_dim": 64, "mamba_d_ssm": common["hidden_size"], "mamba_n_heads": 8,
            "mamba_d_head": common["hidden_size"] // 8, "mamba_n_groups": 1,
            "mamba_d_state": rng.choice([64, 128]), "mamba_d_conv": 4,
            "mamba_chunk_size": 128}


def _attention_target(rng: random.Random) -> dict:
    kv = rng.choice([1, 2, 4, 8])
    n = rng.choice([2, 4, 6])
    cfg = {
        "architectures": ["LlamaForCausalLM"], "num_hidden_layers": n,
        "num_key_value_heads": kv, "num_attention_heads": kv * rng.choice([1, 2, 4]),
        "head_dim": rng.choice([64, 128, 256]), "torch_dtype": rng.choice(["bfloat16",
                                                                          "float16"]),
    }
    if rng.random() < 0.4:
        cfg["layer_types"] = [rng.choice(["sliding_attention", "full_attention"])
                              for _ in range(n)]
        cfg["sliding_window"] = rng.choice([512, 4096])
    return cfg


def _drafter(rng: random.Random, method: str) -> dict:
    kv = rng.choice([1, 2, 3, 4, 6, 8])
    n = rng.choice([1, 2, 4, 8])
    cfg = {
        "architectures": ["DFlashDraftModel" if method == "dflash" else "Eagle3LlamaForCausalLM"],
        "num_hidden_layers": n, "num_key_value_heads": kv,
        "num_attention_heads": kv * rng.choice([2, 4, 8]),
        "head_dim": rng.choice([64, 128, 256]),
    }
    if rng.random() < 0.4:  # windows: ignored by 0.23's DFlash, honoured by EAGLE (llama.py)
        cfg["layer_types"] = [rng.choice(["sliding_attention", "full_attention"])
                              for _ in range(n)]
        cfg["sliding_window"] = 4096
    return cfg


def _random_case(rng: random.Random, version: str
                 ) -> tuple[KVPrediction, dict, dict | None, KVFlags] | None:
    draw = rng.random()
    hybrid = draw < 0.75
    target = (_attention_target(rng) if not hybrid else
              _hybrid_target(rng) if draw < 0.5 else _other_hybrid_target(rng))
    gdn = "linear_num_key_heads" in json.dumps(target)
    methods = [None, "ngram", "dflash", "eagle3"] + (["mtp"] if gdn else [])
    method = rng.choice(methods)
    # every --kv-cache-dtype the version takes for non-MLA attention
    dtypes = [d for d in facts_for(version).kv["cache_dtypes"] if not d.endswith("ds_mla")]
    mla = "kv_lora_rank" in target
    # 0.23: the generator's own setting since it was written; later versions: the CPU
    # platform (its one backend runs target and drafter), MLA targets on CUDA
    platform = "cuda" if version.startswith("0.23.") or mla else "cpu"
    flags = KVFlags(
        vllm_version=version, platform=platform,
        default_block_size=128 if platform == "cpu" else 16,
        tensor_parallel_size=rng.choice([1, 1, 2, 4]),
        kv_cache_dtype=rng.choice(["auto", "auto", "fp8", *dtypes]),
        max_num_batched_tokens=65536,
        mamba_cache_dtype=rng.choice(["auto", "float32", "float16"]),
        mamba_ssm_cache_dtype=rng.choice(["auto", "auto", "float32", "bfloat16"]),
        block_size=rng.choice([None, None, 16, 32, 64]),
        num_speculative_tokens=rng.randint(1, 15) if method else 0,
        speculative_method=method,
        attention_backend="triton_mla" if mla else "cpu_attn",
        enable_prefix_caching=True,  # the oracle aligns in "align" mode (prefix caching on)
    )
    drafter = _drafter(rng, method) if method in ("dflash", "eagle3") else None
    try:
        p = predict(target, drafter, flags)
    except (UserError, CannotPredict):  # e.g. a TP size that does not divide the heads
        return None
    if not p.layers:  # vLLM refuses before any layout exists (e.g. TurboQuant on FalconH1)
        return None
    return p, target, drafter, flags


def generate(version: str) -> list[tuple[str, KVPrediction, dict, KVFlags]]:
    rng = random.Random(SEED)
    out = []
    while len(out) < N_CASES:
        drawn = _random_case(rng, version)
        if drawn:
            p, target, _, flags = drawn
            out.append((f"case-{len(out)}", p, target, flags))
    return out


@pytest.fixture(scope="module", params=VERSIONS)
def version(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def cases(version: str) -> list[tuple[str, KVPrediction, dict, KVFlags]]:
    return generate(version)


@pytest.fixture(scope="module")
def kv_model(version: str) -> KVModel:
    return KVModel.of(facts_for(version), version)


@pytest.fixture(scope="module")
def oracle(version: str) -> Path:
    return need(version)


def _run(python: Path, script: list[str], payload: dict | list, timeout: int = 900) -> str:
    proc = subprocess.run(
        [str(python), *script], input=json.dumps(payload), capture_output=True, text=True,
        timeout=timeout, cwd=tempfile.gettempdir(),
        env={**os.environ, "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def test_generator_covers_every_way_the_version_unifies(cases, kv_model):
    """Every way the version's recorded unification treats a differing page (scale, pad,
    or raise) that its layouts can reach shows up among the cases."""
    from imagebuild.preflight.kv.unify import situation

    seen: dict[str, int] = {}
    for _, p, _, _ in cases:
        top = max((s.page_bytes for s in p.layers), default=0)
        for s in p.layers:
            if s.page_bytes != top:
                got = kv_model.does(situation(s, top))
                what = got["does"] if got["does"] != "raise" else got["raises"]
                seen[what] = seen.get(what, 0) + 1
    wanted = {"scale"} | {b["does"] if b["does"] != "raise" else b["raises"]
                          for name, b in kv_model.unify.items() if name != "mla_not_dividing"}
    assert wanted <= set(seen), (wanted, seen)
    assert sum(p.hybrid for _, p, _, _ in cases) > N_CASES // 2
    assert sum(bool(p.drafter_layers) for _, p, _, _ in cases) > N_CASES // 3


def test_unify_matches_vllm(cases, kv_model, oracle):
    payload = {"kv_cache_utils_path": None,
               "cases": [{"id": cid, **layout_for_oracle(p)} for cid, p, _, _ in cases]}
    results = {r["id"]: r for r in _oracle_json(_run(oracle, [str(ORACLE)], payload))["results"]}
    mismatches = []
    for cid, p, _, _ in cases:
        # The oracle calls unify directly, also for layouts where get_kv_cache_groups would
        # skip it; compare those with the predictor's unify model (the skip is checked below).
        outcome, _, finals = simulate_unify(p.layers, kv_model.does)
        got = results[cid]
        if got["outcome"] != outcome:
            mismatches.append((cid, outcome, got["outcome"], got.get("message")))
            continue
        if outcome == "ok":
            pages = {f.name: f.page_bytes for f in finals}
            blocks = {f.name: f.block_size for f in finals}
            if got["page_size_bytes"] != pages or got["block_size"] != blocks:
                mismatches.append((cid, "layout", pages, got["page_size_bytes"]))
    # the figure CI prints per version (docs/kv-cache.md)
    print(f"vLLM {kv_model.version}: {len(cases) - len(mismatches)}/{len(cases)} cases agree "
          "with its own unify_kv_cache_spec_page_size")
    assert not mismatches, mismatches[:5]


_SHORTCUT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from specs import make_spec  # tests/support/vllm_oracle/specs.py: vLLM's own spec classes
from vllm.v1.core.kv_cache_utils import is_kv_cache_spec_uniform
from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs
out = {}
for case in json.load(sys.stdin):
    specs = {name: make_spec(s, case["num_spec"]) for name, s in case["specs"].items()}
    skip = is_kv_cache_spec_uniform(specs) or UniformTypeKVCacheSpecs.is_uniform_type(specs)
    out[case["id"]] = {"skip": skip,
                       "pages": {n: s.page_size_bytes for n, s in specs.items()},
                       "blocks": {n: s.block_size for n, s in specs.items()}}
print("@@RESULT@@" + json.dumps(out))
"""


def _oracle_json(stdout: str) -> dict:
    # The protocol says stdout is JSON; vLLM may still log lines to stdout before it.
    try:
        return json.loads(stdout)
    except json.JSONDecodeError:
        return json.loads([x for x in stdout.splitlines() if x.strip()][-1])


def _result(stdout: str) -> dict:
    # vLLM logs to stdout; the result is the marked line.
    line = next(x for x in stdout.splitlines() if x.startswith("@@RESULT@@"))
    return json.loads(line[len("@@RESULT@@"):])


def test_spec_pages_and_unify_shortcut_match_vllm(cases, oracle):
    payload = [{"id": cid, "num_spec": flags.num_speculative_tokens if
                flags.speculative_method else 0, **layout_for_oracle(p)}
               for cid, p, _, flags in cases]
    got = _result(_run(oracle, ["-c", _SHORTCUT, str(ORACLE.parent)], payload))
    bad = []
    for cid, p, _, _ in cases:
        if got[cid]["skip"] == p.unify_needed:
            bad.append((cid, "skip", got[cid]["skip"]))
        if got[cid]["pages"] != {s.name: s.page_bytes for s in p.layers}:
            bad.append((cid, "pages", got[cid]["pages"]))
        if got[cid]["blocks"] != {s.name: s.block_size for s in p.layers}:
            bad.append((cid, "blocks", got[cid]["blocks"]))
    assert not bad, bad[:5]
    assert any(not p.unify_needed for _, p, _, _ in cases)


_ALIGN = r"""
import json, sys, torch
from types import SimpleNamespace as NS
from vllm.model_executor.models.config import MODELS_CONFIG_MAP
from vllm.platforms.interface import Platform
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
if hasattr(Platform, "_find_non_ssm_backends"):
    # 0.32 also aligns to every attention backend of the built model (static forward
    # context): the model is not built here, its one backend is the CPU one
    Platform._find_non_ssm_backends = classmethod(lambda cls, vc: [CPUAttentionBackend])
D = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
out = {}
for c in json.load(sys.stdin):
    text = NS(**c["text"])
    kv, head = c["text"]["num_key_value_heads"], c["text"]["head_dim"]
    model = NS(dtype=D[c["model_dtype"]], use_mla=False, architecture=c["arch"],
               hf_text_config=text, model_impl="auto", convert_type="none", is_hybrid=True,
               get_num_kv_heads=lambda pc, kv=kv: max(1, kv // pc.tensor_parallel_size),
               get_head_size=lambda head=head: head)
    cache = NS(cache_dtype=c["kv_cache_dtype"], mamba_cache_dtype=c["mamba_cache_dtype"],
               mamba_ssm_cache_dtype=c["mamba_ssm_cache_dtype"], mamba_block_size=None,
               user_specified_mamba_block_size=False, mamba_cache_mode="align",
               block_size=c["block_size"], mamba_page_size_padded=None,
               kv_cache_dtype_skip_layers=None)
    spec = NS(num_speculative_tokens=c["num_spec"]) if c["num_spec"] else None
    vc = NS(model_config=model, cache_config=cache, speculative_config=spec,
            parallel_config=NS(tensor_parallel_size=c["tp"]),
            compilation_config=NS(static_forward_context={}))
    if c["arch"] in MODELS_CONFIG_MAP:  # Qwen3.5: auto ssm dtype <- config mamba_ssm_dtype
        MODELS_CONFIG_MAP[c["arch"]].verify_and_update_config(vc)
    Platform._align_hybrid_block_size(vc, CPUAttentionBackend)
    out[c["id"]] = {"block_size": cache.block_size, "padded": cache.mamba_page_size_padded}
print("@@RESULT@@" + json.dumps(out))
"""


def test_hybrid_block_size_matches_vllm(cases, oracle):
    payload = []
    for cid, p, target, flags in cases:
        text = target.get("text_config", target)
        if not p.hybrid or "linear_num_key_heads" not in text:
            continue  # GDN here; every other family's alignment: the model-level oracle
        if all(s.kind == "mamba" for s in p.layers):
            continue  # no attention layer: vLLM finds no backend and does not align
        payload.append({
            "id": cid, "arch": target["architectures"][0], "tp": flags.tensor_parallel_size,
            "model_dtype": text["dtype"], "kv_cache_dtype": p.cache_dtype,
            "mamba_cache_dtype": flags.mamba_cache_dtype,
            "mamba_ssm_cache_dtype": flags.mamba_ssm_cache_dtype,
            "block_size": flags.block_size or flags.default_block_size,
            "num_spec": flags.num_speculative_tokens if flags.speculative_method else 0,
            "text": {k: v for k, v in text.items() if k.startswith(("linear_", "mamba_"))
                     or k in ("num_key_value_heads", "head_dim")},
        })
    got = _result(_run(oracle, ["-c", _ALIGN], payload))
    bad = []
    by_id = {cid: p for cid, p, _, _ in cases}
    for case in payload:
        p = by_id[case["id"]]
        mamba = next(s for s in p.target_layers if s.kind == "mamba")
        want = {"block_size": p.attention_block_size, "padded": mamba.page_size_padded}
        if got[case["id"]] != want:
            bad.append((case["id"], want, got[case["id"]]))
    assert not bad, bad[:5]
    assert len(payload) > N_CASES // 4


def _unify_patched_engines() -> list[tuple[str, str, list[Path]]]:
    """(engine, vLLM version, patches) of matrix.yaml's engines whose patches change
    vllm/v1/core/kv_cache_utils.py (the dflashfix engine's kv-page-size-pad-mamba.patch)."""
    from imagebuild.facts.record import touches
    from imagebuild.spec import matrix as mx

    out = []
    for name, engine in mx.load(REPO / "matrix.yaml").matrix.engines.items():
        for real in engine.realize.values():
            patches = [REPO / "patches" / p for p in real.patches]
            if any(touches(p) for p in patches) and (name, engine.vllm_version) not in [
                    (n, v) for n, v, _ in out]:
                out.append((name, engine.vllm_version, patches))
    return out


@pytest.mark.parametrize("engine, engine_version, patches", _unify_patched_engines())
def test_patched_unification_matches_the_patched_vllm(engine, engine_version, patches,
                                                      tmp_path):
    """The predictor answers for an engine whose patches change unify from the unification
    recorded from the patched code; the patched function itself agrees on every case."""
    from imagebuild.facts.record import touches

    python = need(engine_version)
    model = KVModel.of(facts_for(engine_version), engine_version, patches)
    assert model.unify_from.startswith(f"vLLM {engine_version} with ")
    cases = generate(engine_version)
    installed = _run(python, ["-c", "import vllm.v1.core.kv_cache_utils as m; "
                                    "print('@@RESULT@@' + __import__('json').dumps(m.__file__))"],
                     {})
    tree = tmp_path / "vllm" / "v1" / "core"
    tree.mkdir(parents=True)
    (tree / "kv_cache_utils.py").write_bytes(Path(_result(installed)).read_bytes())
    for patch in (p for p in patches if touches(p)):
        done = subprocess.run(
            ["git", "apply", "--include=vllm/v1/core/kv_cache_utils.py", str(patch)],
            cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
    payload = {"kv_cache_utils_path": str(tree / "kv_cache_utils.py"),
               "cases": [{"id": cid, **layout_for_oracle(p)} for cid, p, _, _ in cases]}
    results = {r["id"]: r for r in _oracle_json(_run(python, [str(ORACLE)], payload))["results"]}
    bad = []
    for cid, p, _, _ in cases:
        outcome, _, finals = simulate_unify(p.layers, model.does)
        got = results[cid]
        pages = {f.name: f.page_bytes for f in finals}
        if got["outcome"] != outcome or (outcome == "ok" and got["page_size_bytes"] != pages):
            bad.append((cid, outcome, got["outcome"]))
    assert not bad, bad[:5]
