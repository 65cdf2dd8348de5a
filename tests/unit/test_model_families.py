"""Model-family rules apply to the family they are about, decided from the checkpoint's
own config.json (architecture, model type, layer kinds), never from the matrix's names.

Before: the Qwen3.6 rules fired on other families (the vision rule told a Gemma 3 user to
add `video: 2`, which Gemma 3 does not take; the Gated DeltaNet rule about
--mamba-block-size refused every model)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from imagebuild import REPO_ROOT
from imagebuild.facts import facts_for
from imagebuild.preflight.families import family, modalities
from imagebuild.preflight.flags import RULES
from tests.support.hub.fake import FakeHub
from tests.support.matrices import check, edit, lock_matrix, of
from tests.support.paths import CONFIGS as CONFIGS_DIR
from tests.support.paths import HUB_DATA

CONFIGS = CONFIGS_DIR
HUB = HUB_DATA
HERETIC = ("    repository: AEON-7/Qwen3.6-35B-A3B-heretic-NVFP4\n    track: main  # no revision "
           "is known offline; `lock` resolves and pins it\n    quantization: compressed-tensors\n")


def _config(name: str) -> dict:
    return json.loads((CONFIGS / name).read_text())


def _recorded(repo: str) -> dict:
    return json.loads(next((HUB / repo).glob("*/config.json")).read_text())


def test_family_traits_come_from_the_config() -> None:
    qwen = family(_config("qwen36-35b-a3b.json"))
    assert qwen.architecture == "Qwen3_5MoeForConditionalGeneration"
    assert qwen.traits == {"vision", "gdn", "hybrid"}
    assert family(_config("gemma3-4b-it.json")).traits == {"vision"}
    assert family(_config("qwen3-8b.json")).traits == frozenset()
    nemotron = family(_recorded("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-FP8"))
    assert nemotron.architecture == "NemotronHForCausalLM"
    assert nemotron.traits == {"hybrid"}  # Mamba-2 layers, no Gated DeltaNet
    assert family(_recorded("meta-llama/Llama-3.1-8B-Instruct")).traits == frozenset()


def test_modalities_are_vllms_own() -> None:
    gemma, qwen = family(_config("gemma3-4b-it.json")), family(_config("qwen36-35b-a3b.json"))
    v023 = facts_for("0.23.0")
    assert modalities(gemma, v023)[0] == ["image"]
    assert modalities(qwen, v023)[0] == ["image", "video"]
    takes, why = modalities(family(_config("qwen3-8b.json")), v023)
    assert takes == [] and "not a multimodal architecture of vLLM 0.23.0" in why
    assert modalities(gemma, facts_for("9.9.9"), "9.9.9") == (
        None, "no recorded facts for vLLM 9.9.9")


@pytest.fixture
def gemma_heretic(locked: Path, tmp_path: Path) -> Path:
    """The real matrix with the heretic model pointed at a Gemma 3 checkpoint."""
    hub = FakeHub()
    hub.add_revision("imagebuild-fixtures/gemma-3", {"config.json": _config("gemma3-4b-it.json")},
                     tmp_path / "hub")
    edit(locked, HERETIC, "    repository: imagebuild-fixtures/gemma-3\n    track: main\n")
    lock_matrix(locked, hub)
    return locked


def _heretic(findings: list, rule: str) -> list:
    return [f for f in of(findings, rule) if "heretic" in f.cell]


def test_gemma3_is_never_told_to_add_video(gemma_heretic: Path) -> None:
    edit(gemma_heretic, "    multimodal: {image: 4, video: 2}\n    targets: [gb10]\n  nvfp4:",
         "    targets: [gb10]\n  nvfp4:")
    findings = check(gemma_heretic, target="gb10", engine="dflashfix")
    (f, *_) = _heretic(findings, "keep-vision-on")
    assert f.blocking and "Gemma3ForConditionalGeneration" in f.message
    assert f.fix == "set the model's multimodal: {image: 4} (Gemma3ForConditionalGeneration)"
    assert "video" not in f.fix


def test_a_limit_for_a_modality_the_model_does_not_take_is_named(gemma_heretic: Path) -> None:
    findings = check(gemma_heretic, target="gb10", engine="dflashfix")
    assert not _heretic(findings, "keep-vision-on")
    (f, *_) = _heretic(findings, "multimodal-modalities")
    assert f.severity == "warning" and "names video" in f.message
    assert f.fix == "set the model's multimodal: {image: 4}"


def test_images_promised_for_a_text_only_model_are_refused(locked: Path) -> None:
    edit(locked, "    served_names: [tiny, tiny-alias]\n",
         "    served_names: [tiny, tiny-alias]\n    multimodal: {image: 1}\n")
    (f,) = of(check(locked, target="cpu", engine="dflashfix"), "multimodal-modalities")
    assert f.blocking and "Qwen3ForCausalLM is not a multimodal architecture" in f.message
    assert f.fix == "remove the model's multimodal limits"


def test_the_gated_deltanet_rule_leaves_other_hybrids_alone(locked: Path,
                                                           tmp_path: Path) -> None:
    rule = RULES[[r.id for r in RULES].index("no-mamba-block-size")]
    assert rule.model == ("gdn",)
    # Qwen3.6 (Gated DeltaNet) is refused ...
    mamba = ("      max-num-seqs: 64\n", "      max-num-seqs: 64\n      mamba-block-size: 256\n")
    edit(locked, *mamba)
    assert of(check(locked, target="gb10", engine="dflashfix"), "no-mamba-block-size")
    # ... a NemotronH (Mamba-2) checkpoint on a GB10 target is not
    root = tmp_path / "nemotron"
    shutil.copytree(REPO_ROOT / "examples" / "spark-nemotron", root)
    edit(root, *mamba)
    lock_matrix(root)
    findings = check(root, engine="spark")
    assert findings and not of(findings, "no-mamba-block-size")
