"""Targets are described by what they are: properties (accelerator, compute capability,
unified memory, platform) drive the serve-flag rules, the runner, the disk estimate and
host detection, never the target's name; each kind of target has the fields it needs.

Before: the GB10 rules were keyed by the name `gb10` (renamed `spark2`, four blocking
errors vanished and `check` passed), a source target without runtime_image rendered
`FROM None AS runtime` with exit 0, detection knew only GB10 (a 5090 host was `cpu`),
and the disk estimate was keyed by target name."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from imagebuild.builder import builder
from imagebuild.cli import main
from imagebuild.errors import UserError
from imagebuild.host import parse_gpus
from imagebuild.plan import detect_target
from imagebuild.spec import hardware
from imagebuild.spec import matrix as mx
from imagebuild.spec.hardware import Gpu, Host
from tests.support.matrices import blocking_rules, check, edit, lock_matrix

TAG = "2026-06-18-dflashfix"
GB10_HOST = Host("linux/arm64", (Gpu("NVIDIA GB10", "12.1"),))
RTX5090_HOST = Host("linux/amd64", (Gpu("NVIDIA GeForce RTX 5090", "12.0"),))
RTX_TARGET = """  rtx5090:
    description: an RTX 5090 workstation
    platform: linux/amd64
    accelerator: cuda
    compute_capability: "12.0"
    base_image: nvcr.io/nvidia/cuda:13.0.1-devel-ubuntu24.04
    runtime_image: nvcr.io/nvidia/cuda:13.0.1-runtime-ubuntu24.04
    engine_from: source
    expect_cuda_arch: sm_120a
    smoke_concurrency: [1]
    boot_timeout_s: 600
    memory_limit: 48g
"""


def _rename_gb10(root: Path, new: str) -> None:
    path = root / "matrix.yaml"
    text = re.sub(r"\bgb10\b(?=:|\]|\n)", new, path.read_text())
    path.write_text(text)
    assert set(mx.load(path).matrix.targets) == {new, "cpu"}


def _add_target(root: Path, block: str) -> None:
    edit(root, "  cpu:\n    description: any x86-64", block + "  cpu:\n    description: any x86-64")


# --- rules follow properties ------------------------------------------------------------

TRAPS = {  # the four GB10 rules that went silent under another name, and an edit for each
    "gpu-mem-util-unified": ("gpu-memory-utilization: 0.85", "gpu-memory-utilization: 0.95"),
    "max-batched-tokens-ceiling": ("max-num-batched-tokens: 16384",
                                   "max-num-batched-tokens: 65536"),
    "no-force-fp8-marlin": ("    acceptance_floor: 0.2\n  spark-dflash-aeon:",
                            "    env:\n      VLLM_TEST_FORCE_FP8_MARLIN: \"1\"\n"
                            "    acceptance_floor: 0.2\n  spark-dflash-aeon:"),
    "attention-backend-flash-attn": ("attention-backend: flash_attn",
                                     "attention-backend: triton_attn"),
}


@pytest.mark.parametrize("rule", sorted(TRAPS))
def test_a_renamed_gb10_keeps_its_rules(locked: Path, rule: str) -> None:
    _rename_gb10(locked, "spark2")
    lock_matrix(locked)  # the lock's engine and base entries are per target name
    assert not blocking_rules(check(locked, target="spark2", engine="dflashfix"))
    edit(locked, *TRAPS[rule])
    findings = check(locked, target="spark2", engine="dflashfix")
    assert blocking_rules(findings, kernels=False) == {rule}


def test_rules_follow_the_property_they_are_about(locked: Path) -> None:
    """A Spark described without unified memory loses exactly the unified-memory rules;
    the compute-capability and FP4 ones stay."""
    for old, new in TRAPS.values():
        edit(locked, old, new)
    edit(locked, "    unified_memory: true\n", "")
    rules = blocking_rules(check(locked, target="gb10", engine="dflashfix"))
    assert "gpu-mem-util-unified" not in rules
    assert {"max-batched-tokens-ceiling", "no-force-fp8-marlin",
            "attention-backend-flash-attn"} <= rules


def test_traits_of_the_targets() -> None:
    lm = mx.load()
    assert hardware.traits(lm.matrix.targets["gb10"]) == {
        "cuda", "arm64", "unified-memory", "sm_121", "native-fp4"}
    assert hardware.traits(lm.matrix.targets["cpu"]) == {"cpu", "amd64"}


# --- each kind of target has what it needs ----------------------------------------------

@pytest.mark.parametrize(("old", "new", "message"), [
    ("    runtime_image: nvcr.io/nvidia/cuda:13.0.1-base-ubuntu24.04\n", "",
     "missing: runtime_image"),
    ("    expect_cuda_arch: sm_121a\n", "", "missing: expect_cuda_arch"),
    ('    compute_capability: "12.1"\n', "", "a cuda target needs compute_capability"),
    ("    expect_cuda_arch: sm_121a\n", "    expect_cuda_arch: sm_120a\n",
     "is for compute capability 12.0, but the target's compute_capability is 12.1"),
    ("    accelerator: cpu\n", "    accelerator: cpu\n    unified_memory: true\n",
     "describe a GPU, but this target's accelerator is cpu"),
])
def test_a_target_missing_what_its_kind_needs_is_refused_where_it_is(
        matrix_dir: Path, capsys, old: str, new: str, message: str) -> None:
    edit(matrix_dir, old, new)
    out = matrix_dir / "out"
    code = main(["render", "--matrix", str(matrix_dir / "matrix.yaml"), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "fix:" in err, err
    assert re.search(r"matrix\.yaml:\d+:\d+: targets\.(gb10|cpu)", err), err
    assert not out.exists()  # nothing rendered, never `FROM None`


# --- detection matches a host by what it has ---------------------------------------------

def test_a_5090_host_is_detected_as_the_rtx_target(matrix_dir: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("IMAGEBUILD_TARGET", raising=False)
    _add_target(matrix_dir, RTX_TARGET)
    lm = mx.load(matrix_dir / "matrix.yaml")
    assert detect_target(lm, RTX5090_HOST)[0] == "rtx5090"
    assert detect_target(lm, GB10_HOST)[0] == "gb10"
    assert detect_target(lm, Host("linux/amd64"))[0] == "cpu"
    # an x86 host whose GPU no target is for gets the CPU engine, and is told so
    target, why = detect_target(lm, Host("linux/amd64", (Gpu("NVIDIA H100", "9.0"),)))
    assert target == "cpu" and "no target of matrix.yaml is for its GPU" in why


def test_a_host_no_target_fits_or_several_fit_is_an_error(matrix_dir: Path,
                                                          monkeypatch) -> None:
    monkeypatch.delenv("IMAGEBUILD_TARGET", raising=False)
    lm = mx.load(matrix_dir / "matrix.yaml")
    with pytest.raises(UserError, match="no target of matrix.yaml fits this host"):
        detect_target(lm, Host("linux/arm64"))
    _add_target(matrix_dir, RTX_TARGET.replace("rtx5090:", "rtx-a:") + RTX_TARGET.replace(
        "rtx5090:", "rtx-b:"))
    with pytest.raises(UserError, match="several targets fit this host") as info:
        detect_target(mx.load(matrix_dir / "matrix.yaml"), RTX5090_HOST)
    assert "rtx-a, rtx-b" in info.value.message and "--target" in (info.value.fix or "")


def test_nvidia_smi_lines_are_read() -> None:
    assert parse_gpus("NVIDIA GB10, 12.1\nNVIDIA GeForce RTX 5090, 12.0\n[N/A], [N/A]\n") == (
        Gpu("NVIDIA GB10", "12.1"), Gpu("NVIDIA GeForce RTX 5090", "12.0"))


# --- runner and disk estimate follow properties -----------------------------------------

def test_runner_labels_come_from_the_properties_unless_given(matrix_dir: Path, capsys) -> None:
    _add_target(matrix_dir, RTX_TARGET)
    lm = mx.load(matrix_dir / "matrix.yaml")
    assert hardware.runner(lm.matrix.targets["rtx5090"]) == ["self-hosted", "linux", "X64",
                                                             "sm_120"]
    assert hardware.runner(lm.matrix.targets["gb10"]) == ["self-hosted", "linux", "ARM64",
                                                          "gb10"]  # written in matrix.yaml
    code = main(["plan", "--matrix", str(matrix_dir / "matrix.yaml"), "--tag", TAG,
                 "--target", "all", "--format", "targets"])
    out, err = capsys.readouterr()
    assert code == 0, err
    targets = {t["target"]: t for t in json.loads(out)["include"]}
    assert set(targets) == {"gb10", "cpu"}  # targets with cells in this release
    assert targets["gb10"]["runner"] == ["self-hosted", "linux", "ARM64", "gb10"]
    assert targets["gb10"]["cells"] == 7 and targets["cpu"]["runner"] == ["ubuntu-24.04"]
    code = main(["plan", "--matrix", str(matrix_dir / "matrix.yaml"), "--tag", TAG,
                 "--target", "all", "--format", "github"])
    cells = json.loads(capsys.readouterr().out)["include"]
    assert {c["target"]: c["runner"][-1] for c in cells} == {"gb10": "gb10",
                                                            "cpu": "ubuntu-24.04"}


def test_the_disk_estimate_follows_how_the_engine_is_built(locked: Path) -> None:
    _rename_gb10(locked, "spark2")
    lm = mx.load(locked / "matrix.yaml")
    gib = 2**30
    need = {name: builder.disk_need(t.engine_from, "engine", prefix_cached=False)
            for name, t in lm.matrix.targets.items()}
    assert need == {"spark2": 60 * gib, "cpu": 8 * gib}


def test_an_image_outside_the_matrix_asks_for_gpus_by_what_it_is() -> None:
    """`smoke IMAGE_REF` of an image whose cell left matrix.yaml: GPUs are requested when
    the image is built on NVIDIA's CUDA images, whatever its target was called."""
    from imagebuild.expectations import expectations_from_labels

    def info(cell: str, env: list[str]) -> dict:
        return {"Id": "sha256:" + "9" * 64, "Config": {"Cmd": [], "Env": env, "Labels": {
            "io.imagebuild.cell": cell, "io.imagebuild.engine": "gone"}}}

    cuda_env = ["PATH=/usr/bin", "NVIDIA_VISIBLE_DEVICES=all", "CUDA_VERSION=13.0.1"]
    assert expectations_from_labels("x", info=info("spark2/a", cuda_env))["gpu"] is True
    assert expectations_from_labels("x", info=info("laptop/a", ["PATH=/usr/bin"]))["gpu"] is False
