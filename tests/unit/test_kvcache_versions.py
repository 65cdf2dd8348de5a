"""The KV predictor answers for the vLLM version the engine names, from that version's
recorded facts (imagebuild/facts/recorded/<version>/kv.json), and for no other.

Qwen3.6-35B-A3B on the CPU platform (CPU_ATTN, block 128) with DFlash drafters:
- the retrained zlab drafter's page (8 KV heads x 256 B x 2 x block) is twice the GDN state
  page: stock 0.23 asserts in unify (the state page cannot grow), 0.32 pads the state pages
  (V32 v1/core/kv_cache_utils.py:1326-1335);
- a 3-KV-head drafter's page does not divide the largest: 0.23 raises NotImplementedError,
  0.32 pads a non-MLA attention page (:1342-1345).
"""

from __future__ import annotations

import json

import pytest

from imagebuild.errors import UserError
from imagebuild.facts import facts_for
from imagebuild.preflight.kv.unify import LayerSpec, simulate_unify
from imagebuild.preflight.kvcache import CannotPredict, KVFlags, KVModel, predict
from tests.support.paths import CONFIGS


def cfg(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def flags(version: str, **kw) -> KVFlags:
    base = dict(vllm_version=version, platform="cpu", default_block_size=128,
                attention_backend="cpu_attn", speculative_method="dflash",
                num_speculative_tokens=11, max_num_batched_tokens=16384,
                enable_prefix_caching=True)
    return KVFlags(**{**base, **kw})


def narrow_drafter() -> dict:
    d = cfg("zlab-dflash-31977fbe")
    d.update(num_key_value_heads=3, num_attention_heads=24)
    return d


def test_oversized_drafter_asserts_on_023_and_is_padded_on_032():
    target, drafter = cfg("qwen36-35b-a3b"), cfg("zlab-dflash-retrained")
    old = predict(target, drafter, flags("0.23.0"))
    assert old.outcome == "AssertionError" and old.unify_from == "stock vLLM 0.23.0"
    new = predict(target, drafter, flags("0.32.0"))
    assert new.outcome == "ok" and new.padded_by_unify
    assert (new.vllm_version, new.unify_from) == ("0.32.0", "stock vLLM 0.32.0")
    # every GDN page padded to the drafter's: 30 layers x (4,718,592 - 2,359,296) B x 13
    assert new.max_page_bytes == 4_718_592
    assert new.extra_bytes_per_request == 30 * (4_718_592 - 2_359_296) * 13


def test_non_dividing_drafter_page_is_padded_on_032_only():
    target = cfg("qwen36-35b-a3b")
    assert predict(target, narrow_drafter(), flags("0.23.0")).outcome == "NotImplementedError"
    p = predict(target, narrow_drafter(), flags("0.32.0"))
    assert p.outcome == "ok" and p.padded_by_unify
    assert {f.page_bytes for f in p.final_layers} == {p.max_page_bytes}


@pytest.mark.parametrize(("version", "outcomes"), [
    ("0.23.0", ("NotImplementedError", "NotImplementedError", "AssertionError")),
    ("0.32.0", ("ok", "NotImplementedError", "ok")),
])
def test_unify_follows_the_versions_recorded_behaviour(version, outcomes):
    """A page that does not divide the largest: non-MLA attention, MLA, and a dividing
    state page, each through the version's own recorded unification."""
    model = KVModel.of(facts_for(version), version)
    big = LayerSpec("big", "target", "full", 16, "bfloat16", 4096)
    cases = (LayerSpec("a", "drafter", "full", 16, "bfloat16", 3072),
             LayerSpec("m", "target", "full", 16, "bfloat16", 3072, mla=True),
             LayerSpec("s", "target", "mamba", 16, "float32", 2048))
    got = tuple(simulate_unify([big, small], model.does)[0] for small in cases)
    assert got == outcomes


def test_a_version_without_recorded_facts_is_never_another_versions_answer():
    with pytest.raises(CannotPredict, match=r"no recorded facts for vLLM 0\.31\.0: .*facts "
                                            r"record"):
        predict(cfg("qwen36-35b-a3b"), None, flags("0.31.0", speculative_method=None))


def test_cache_dtypes_are_the_versions_own():
    target = cfg("qwen3-8b")
    p = predict(target, None, flags("0.32.0", speculative_method=None,
                                    kv_cache_dtype="int4_per_token_head"))
    assert p.vllm_version == "0.32.0"
    with pytest.raises(UserError, match="not one vLLM 0.23.0 accepts"):
        predict(target, None, flags("0.23.0", speculative_method=None,
                                    kv_cache_dtype="int4_per_token_head"))


def test_check_on_an_engine_version_without_facts_says_so_and_no_unify_ok(locked):
    """The cpu cells of an engine moved to a vLLM without recorded facts: a finding naming
    the record command, and no KV verdict taken from 0.23's facts."""
    from tests.support.matrices import check, edit

    edit(locked, "  dflashfix:\n    vllm_version: 0.23.0", "  dflashfix:\n    vllm_version: 0.31.0")
    findings = [f for f in check(locked, target="cpu", engine="dflashfix")]
    missing = [f for f in findings if f.rule == "vllm-facts-missing"]
    assert missing and all("facts record" in (f.fix or "") + f.message for f in missing)
    kv = [f for f in findings if f.rule.startswith("kv-")]
    assert not any("unify ok" in f.message for f in kv), [f.message for f in kv]
    assert not any("0.23.0" in f.message for f in findings if f.rule.startswith("kv-"))


def test_check_on_a_032_engine_uses_032s_facts(locked):
    from tests.support.matrices import check, edit

    edit(locked, "  pr41703:\n    vllm_version: 0.23.0", "  pr41703:\n    vllm_version: 0.32.0")
    kv = [f for f in check(locked, target="cpu", engine="pr41703") if f.rule.startswith("kv-")]
    assert kv
    for f in kv:
        assert "0.32.0" in f.message and "0.23.0" not in f.message, f.message


# vLLM 0.28.0's unify probes as `build.py facts record` writes them from its own
# v1/core/kv_cache_utils.py unify_kv_cache_spec_page_size (:1083-1095): an attention page
# that does not divide the largest is padded only when the spec's
# indexes_kv_by_block_stride is set (by the model runner from the layer's backend)
NOT_IMPLEMENTED = {"does": "raise", "raises": "NotImplementedError",
                   "message": "Layer <layer>: page size is not divisible by the maximum "
                              "page size and cannot be padded."}
PAD = {"does": "pad", "block_size": 16}
UNIFY_028 = {"attention_divides": {"does": "scale"}, "attention_divides_by_block_stride":
             {"does": "scale"}, "attention_not_dividing": NOT_IMPLEMENTED,
             "attention_not_dividing_by_block_stride": PAD, "mla_not_dividing":
             NOT_IMPLEMENTED, "mla_not_dividing_by_block_stride": PAD,
             "mamba_divides": PAD, "mamba_not_dividing": PAD}


def model_028(stride: dict[str, bool]) -> KVModel:
    # 0.23's pages stand in for 0.28's (CPU_ATTN takes multiples of 16 in both)
    return KVModel("0.28.0", {**facts_for("0.23.0").kv, "block_stride_backends": stride},
                   UNIFY_028, "stock vLLM 0.28.0")


def test_a_non_dividing_page_is_padded_where_the_backend_indexes_by_block_stride():
    """0.28 pads or refuses by the layer's backend: its recorded answer picks the probe;
    a backend without one cannot be predicted (never the other probe's answer)."""
    model = model_028({"CPU_ATTN": False, "FLASH_ATTN": True})
    big = LayerSpec("big", "target", "full", 16, "bfloat16", 4096)
    small = LayerSpec("a", "drafter", "full", 16, "bfloat16", 3072)

    def on(backend):
        return simulate_unify([big, small], lambda s: model.does(s, backend))[0]

    assert (on("flash_attn"), on("cpu_attn")) == ("ok", "NotImplementedError")
    for unknown in (None, "flashinfer"):
        with pytest.raises(CannotPredict, match="indexes KV pages by block stride"):
            on(unknown)
    state = LayerSpec("s", "target", "mamba", 16, "float32", 2048)
    assert simulate_unify([big, state], lambda s: model.does(s, None))[0] == "ok"


@pytest.mark.parametrize(("strided", "outcome"), [(False, "NotImplementedError"),
                                                  (True, "ok")])
def test_predict_asks_the_cells_backend_how_unify_treats_its_page(strided, outcome):
    """predict hands the cell's backend to the recorded unification: 0.28's probes on
    0.32's pages and hybrid alignment (0.28's alignment is not recorded: CannotPredict)."""
    model = KVModel("0.32.0", {**facts_for("0.32.0").kv,
                               "block_stride_backends": {"CPU_ATTN": strided}},
                    UNIFY_028, "vLLM 0.28.0's unification")
    p = predict(cfg("qwen36-35b-a3b"), narrow_drafter(), flags("0.32.0"), model=model)
    assert p.outcome == outcome
