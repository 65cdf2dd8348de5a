"""Checkpoint and KV-cache rules against the locked metadata of the recorded Hub fixtures
(tests/data/hub: the real repos' config.json, weight maps, hf_quant_config.json), locked
into a tmp copy of matrix.yaml by the real lock code."""

from __future__ import annotations

import json
from pathlib import Path

from imagebuild.preflight.checkpoint import Checkpoint, derived_max_len, parse_len, quant_method
from tests.support.hub.fake import FakeHub
from tests.support.matrices import (
    blocking_rules,
    check,
    edit,
    lock_matrix,
    of,
)
from tests.support.paths import HUB_DATA

ZLAB = "z-lab/Qwen3.6-35B-A3B-DFlash"
HERETIC = "AEON-7/Qwen3.6-35B-A3B-heretic-NVFP4"
NVIDIA = "nvidia/Qwen3.6-35B-A3B-NVFP4"
ZLAB_PIN = "revision: 31977fbe13a86e8b961774f773058175676d89b8"


def relock_with_drafter(root: Path, tmp: Path, **changes) -> None:
    """Point the zlab drafter at a new recorded commit whose config.json has `changes`."""
    hub = FakeHub()
    cfg = hub.config(ZLAB, "31977fbe13a86e8b961774f773058175676d89b8")
    for key, value in changes.items():
        cfg[key] = value
    hub.add_revision("imagebuild-fixtures/edited-dflash", {"config.json": cfg}, tmp)
    edit(root, f"repository: {ZLAB}\n    # main was retrained (8 KV heads, window 4096) and "
               f"trips the KV page-size assert\n    {ZLAB_PIN}",
         "repository: imagebuild-fixtures/edited-dflash\n    track: main")
    lock_matrix(root, hub)


# --- KV page layout ---------------------------------------------------------------------

def test_retrained_zlab_main_is_refused_on_stock_vllm(locked: Path) -> None:
    edit(locked, ZLAB_PIN, "track: main")
    lock_matrix(locked)  # resolves main: the retrained drafter, 8 KV heads + sliding window
    findings = check(locked, target="gb10", engine="pr41703")
    assert blocking_rules(findings) == {"kv-page-unify"}
    found = of(findings, "kv-page-unify")
    assert {f.cell for f in found} == {"gb10/spark-heretic-zlab", "gb10/spark-nvfp4-zlab",
                                       "gb10/spark-ornith-zlab"}
    assert "AssertionError" in found[0].message and "4096 B per token" in found[0].message
    assert "31977fbe13a86e8b961774f773058175676d89b8" in (found[0].fix or "")


def test_retrained_zlab_main_serves_under_dflashfix_at_a_stated_memory_cost(locked: Path
                                                                            ) -> None:
    edit(locked, ZLAB_PIN, "track: main")
    lock_matrix(locked)
    findings = check(locked, target="gb10", engine="dflashfix")
    assert not blocking_rules(findings)
    (f, *_) = of(findings, "kv-page-padding")
    assert f.severity == "warning"
    # 30 GDN layers x 2,326,528 B x (2 + 11) state pages = 907,345,920 B = 865 MiB
    assert "865 MiB extra cache per request" in f.message


def test_small_page_and_aeon_drafters_print_their_block_size(locked: Path) -> None:
    findings = check(locked, target="gb10", engine="dflashfix")
    layout = {f.cell: f.message for f in of(findings, "kv-layout")}
    assert layout["gb10/spark-heretic-zlab"].startswith("attention block size 1136")
    assert layout["gb10/spark-heretic-aeon"].startswith("attention block size 1136")
    assert layout["gb10/spark-heretic-mtp"].startswith("attention block size 1072")


# --- checkpoint traps -------------------------------------------------------------------

def test_modelopt_checkpoint_is_read_from_its_quantization_config(locked: Path) -> None:
    edit(locked, "quantization: modelopt", "quantization: compressed-tensors")
    (f, *_) = of(check(locked, target="gb10", engine="dflashfix"),
                 "quantization-matches-checkpoint")
    assert "config.json says modelopt" in f.message


def test_modelopt_is_recognised_from_hf_quant_config_alone() -> None:
    hf_quant = json.loads((HUB_DATA / NVIDIA /
                           "491c2f1ea524c639598bf8fa787a93fed5a6fbce" /
                           "hf_quant_config.json").read_text())
    cp = Checkpoint("models", "m", NVIDIA, config={"text_config": {}}, hf_quant=hf_quant)
    assert quant_method(cp) == "modelopt"
    assert quant_method(Checkpoint("models", "m", None, config={})) is None


def test_missing_quantization_flag_on_a_quantized_checkpoint_warns(locked: Path) -> None:
    edit(locked, "    quantization: modelopt\n", "")
    findings = check(locked, target="gb10", engine="dflashfix")
    assert not blocking_rules(findings)
    assert {f.severity for f in of(findings, "quantization-matches-checkpoint")} == {"warning"}


def test_vision_weights_under_the_language_model_are_refused(locked: Path) -> None:
    edit(locked, f"repository: {HERETIC}", "repository: imagebuild-fixtures/misplaced-vision-NVFP4")
    lock_matrix(locked)
    findings = check(locked, target="gb10", engine="dflashfix")
    assert blocking_rules(findings) == {"vision-weights-nested"}
    (f, *_) = of(findings, "vision-weights-nested")
    assert f.message.startswith("333 vision tensors") and "model.language_model.visual." in (
        f.message)


def test_dflash_target_layers_beyond_the_target_are_refused(locked: Path, tmp_path: Path
                                                            ) -> None:
    hub = FakeHub()
    cfg = hub.config(ZLAB, "31977fbe13a86e8b961774f773058175676d89b8")
    relock_with_drafter(locked, tmp_path / "hub",
                        dflash_config={**cfg["dflash_config"],
                                       "target_layer_ids": [1, 10, 19, 28, 40]})
    findings = check(locked, target="gb10", engine="dflashfix")
    assert blocking_rules(findings) == {"dflash-target-layers"}
    (f, *_) = of(findings, "dflash-target-layers")
    assert "[40] outside the target's 40 layers (0..39)" in f.message


def test_drafter_with_another_vocabulary_is_refused(locked: Path, tmp_path: Path) -> None:
    relock_with_drafter(locked, tmp_path / "hub", vocab_size=151936)
    findings = check(locked, target="gb10", engine="dflashfix")
    assert blocking_rules(findings) == {"drafter-fits-target"}
    (f, *_) = of(findings, "drafter-fits-target")
    assert "vocab_size 151936" in f.message and "has 248320" in f.message


def test_drafter_with_another_hidden_size_is_refused(locked: Path, tmp_path: Path) -> None:
    relock_with_drafter(locked, tmp_path / "hub", hidden_size=4096)
    findings = check(locked, target="gb10", engine="dflashfix")
    assert "drafter-fits-target" in blocking_rules(findings)


def test_max_model_len_beyond_the_config_is_refused(locked: Path) -> None:
    edit(locked, "max-model-len: 262144", "max-model-len: 524288")
    findings = check(locked, target="gb10", engine="dflashfix")
    assert blocking_rules(findings) == {"max-model-len-supported"}
    (f, *_) = of(findings, "max-model-len-supported")
    assert "524288 exceeds the 262144" in f.message


def test_long_max_model_len_allowed_by_env_only_warns(locked: Path) -> None:
    edit(locked, "max-model-len: 262144", "max-model-len: 524288")  # `spark`, inherited
    edit(locked, "    acceptance_floor: 0.2\n  spark-dflash-aeon:",
         "    env:\n      VLLM_ALLOW_LONG_MAX_MODEL_LEN: \"1\"\n    acceptance_floor: 0.2\n"
         "  spark-dflash-aeon:")
    findings = check(locked, target="gb10", engine="dflashfix")
    sev = {f.cell: f.severity for f in of(findings, "max-model-len-supported")}
    assert sev["gb10/spark-heretic-zlab"] == "warning"  # spark-dflash sets the env
    assert sev["gb10/spark-heretic-mtp"] == "error"  # spark-mtp does not


def test_rope_scaling_extends_the_supported_length() -> None:
    text = {"max_position_embeddings": 32768,
            "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                             "original_max_position_embeddings": 32768}}
    assert derived_max_len(text)[0] == 131072
    assert derived_max_len({"max_position_embeddings": 8192,
                            "rope_scaling": {"type": "linear", "factor": 2}})[0] == 16384
    assert derived_max_len({"max_position_embeddings": 8192,
                            "rope_scaling": {"rope_type": "llama3", "factor": 8}})[0] == 8192
    assert (parse_len("262144"), parse_len("256K"), parse_len("1k")) == (262144, 262144, 1000)


def test_served_names_colliding_side_by_side_are_refused(locked: Path) -> None:
    edit(locked, "      max-num-seqs: 64\n", "      max-num-seqs: 64\n"
                                            "      served-model-name: qwen36\n")
    findings = check(locked, target="gb10", engine="dflashfix")
    assert blocking_rules(findings) == {"served-name-collision"}
    cells = {f.cell for f in of(findings, "served-name-collision")}
    # heretic's cells come first and own the name; the other models' cells collide
    assert cells == {"gb10/spark-nvfp4-zlab", "gb10/spark-nvfp4-mtp",
                     "gb10/spark-ornith-zlab", "gb10/spark-ornith-mtp"}


def test_one_model_with_several_drafters_is_not_a_collision(locked: Path) -> None:
    findings = check(locked, target="gb10", engine="dflashfix")
    assert not of(findings, "served-name-collision")


# --- metadata the lock does not have ----------------------------------------------------

def test_unresolved_pin_warns_that_its_checks_cannot_run(matrix_dir: Path) -> None:
    lock_matrix(matrix_dir, FakeHub(offline=(HERETIC,)))
    edit(matrix_dir, "quantization: compressed-tensors", "quantization: modelopt", count=2)
    findings = check(matrix_dir, target="gb10", engine="dflashfix")
    (missing,) = [f for f in of(findings, "pin-unresolved") if "heretic" in f.message]
    assert missing.severity == "warning" and missing.cell == "gb10/spark-heretic-zlab"
    assert "is unresolved in matrix.lock.json (missing: sha, files, metadata): cannot check " \
           "quantization-matches-checkpoint" in missing.message
    assert not of(findings, "metadata-missing")
    # the unresolved model's quantization cannot be judged; ornith (resolved) is refused
    assert {f.cell for f in of(findings, "quantization-matches-checkpoint")} == {
        "gb10/spark-ornith-zlab", "gb10/spark-ornith-mtp"}


def test_metadata_listed_in_the_lock_but_absent_warns(locked: Path) -> None:
    for path in (locked / "locked" / NVIDIA).glob("*/config.json"):
        path.unlink()
    findings = check(locked, target="gb10", engine="dflashfix")
    assert not blocking_rules(findings)
    found = of(findings, "metadata-missing")
    assert {f.cell for f in found} == {"gb10/spark-nvfp4-zlab", "gb10/spark-nvfp4-mtp"}
    assert "config.json is listed in matrix.lock.json but absent" in found[0].message


def test_keep_vision_on_never_guesses_from_the_target_name(matrix_dir: Path) -> None:
    """Without the checkpoint's config the rule cannot know the model has a vision tower:
    it says it is skipped (the pin warning lists it; build refuses the pin anyway) instead
    of deciding from the target being called gb10."""
    lock_matrix(matrix_dir, FakeHub(offline=(HERETIC,)))
    edit(matrix_dir, "    multimodal: {image: 4, video: 2}\n    targets: [gb10]\n  nvfp4:",
         "    targets: [gb10]\n  nvfp4:")
    findings = check(matrix_dir, target="gb10", engine="dflashfix")
    assert not [f for f in of(findings, "keep-vision-on") if "heretic" in f.cell]
    (pin, *_) = [f for f in of(findings, "pin-unresolved") if "heretic" in f.message]
    assert "keep-vision-on" in pin.message


def test_edited_locked_metadata_is_refused(locked: Path) -> None:
    config = next((locked / "locked" / NVIDIA).glob("*/config.json"))
    config.write_text(config.read_text().replace('"modelopt"', '"compressed-tensors"'))
    findings = check(locked, target="gb10", engine="dflashfix")
    assert "metadata-matches-lock" in blocking_rules(findings)
