"""The GB10 rehearsal's logic, fast: cutting vLLM's CMake code, the arch verdict, the
outcome table, its inputs from matrix.yaml, the runtime stage read from the rendered
engine Dockerfile. The real runs are in tests/e2e/test_gb10_rehearsal_runs.py."""

from __future__ import annotations

import pytest

from imagebuild import REPO_ROOT
from imagebuild.cli import main as cli_main
from imagebuild.errors import UserError
from imagebuild.rehearse.arch_probe import ArchResult
from imagebuild.rehearse.buildenv import without_torch
from imagebuild.rehearse.cmake_blocks import AnchorError, Piece, cut, extract
from imagebuild.rehearse.inputs import load_inputs
from imagebuild.rehearse.runtime_stage import (
    engine_dockerfile,
    localize,
    read_runtime_stage,
)
from imagebuild.rehearse.step_arch import _survives, gencode_for, reason_without
from imagebuild.rehearse.steps import FAILED, NOT_REHEARSED, PASSED, Step, exit_code, table
from imagebuild.vllmsource.tree import cmake_patches

CMAKE = """\
project(x)
set(LIST "a;b"  # a comment with ( an unbalanced paren
)
if(DEFINED V AND
   V VERSION_GREATER_EQUAL 13.0)
  # inner comment endif()
  set(ARCHS "12.0")
  if(NESTED)
    message("inner")
  endif()
elseif(OTHER)
  set(ARCHS "12.1")
else()
  set(ARCHS "9.0")
endif()

if(ARCHS)
  message(STATUS "next block")
endif()
message(STATUS "tail (with parens)")
include(FetchContent)
"""


def test_statement_spans_lines_and_ignores_parens_in_comments():
    first, last, body = cut(CMAKE, Piece("list", r"^set\(LIST"))
    assert (first, last) == (2, 3)
    assert body.endswith(")")


def test_block_is_the_innermost_if_around_the_anchor():
    first, last, body = cut(CMAKE, Piece("archs", r'set\(ARCHS "12\.0"\)', "block"))
    assert (first, last) == (4, 15)
    assert body.startswith("if(DEFINED V AND") and body.endswith("endif()")
    # an anchor on the if() line itself gives the same block
    assert cut(CMAKE, Piece("if", r"^if\(DEFINED V AND\s*\n\s*V VERSION", "block"))[:2] == (4, 15)
    # an anchor inside the nested block gives the nested one
    assert cut(CMAKE, Piece("in", r'message\("inner"\)', "block"))[:2] == (8, 10)


def test_block_and_next_and_until():
    assert cut(CMAKE, Piece("two", r'set\(ARCHS "9\.0"\)', "block+next"))[:2] == (4, 19)
    first, last, body = cut(CMAKE, Piece("u", r"^if\(ARCHS\)", "until", until=r"^include\("))
    assert (first, last) == (17, 20)
    assert "include" not in body


def test_anchor_must_match_exactly_once():
    with pytest.raises(AnchorError, match="matches 0 times"):
        cut(CMAKE, Piece("gone", r"^set\(CUDA_SUPPORTED_ARCHS"))
    with pytest.raises(AnchorError, match="matches 2 times"):
        cut(CMAKE, Piece("twice", r"set\(ARCHS \"12"))
    with pytest.raises(AnchorError, match="not inside an if"):
        cut(CMAKE, Piece("top", r"^project\(x\)", "block"))


def test_extract_labels_each_piece_with_its_lines():
    text = extract(CMAKE, [Piece("list", r"^set\(LIST")], "CMakeLists.txt")
    assert text.startswith("# --- list: CMakeLists.txt lines 2-3, verbatim ---\nset(LIST")


def _arch(cuda: str, fp4: str, gencode: str) -> ArchResult:
    unit = "csrc/libtorch_stable/quantization/fp4/nvfp4_quant_kernels.cu"
    entry = {"command": f"nvcc -O2 -gencode {gencode} -x cu -c {unit} -o x.o",
             "directory": "/b", "output": "x.o", "file": unit}
    return ArchResult({"CUDA_ARCHS": cuda, "FP4_ARCHS": fp4}, {unit: entry})


def test_arch_verdict_needs_12_1a_everywhere():
    inputs = load_inputs(None, "gb10", None)
    assert gencode_for("sm_121a") == "arch=compute_121a,code=sm_121a"
    assert _survives(_arch("12.1a", "12.1a", "arch=compute_121a,code=sm_121a"), inputs)[0]
    # what vLLM 0.23 + CUDA 13 does without the patch: 12.0 and the 12.0f family target
    collapsed = _arch("12.0", "12.0f", "arch=compute_120f,code=sm_120f")
    ok, line = _survives(collapsed, inputs)
    assert not ok and "FP4_ARCHS=12.0f" in line and "compute_120f" in line
    # the arch lists alone are not enough: the unit's own -gencode decides
    assert not _survives(_arch("12.1a", "12.1a", "arch=compute_120,code=sm_120"), inputs)[0]


def test_outcomes_and_exit_code():
    done = Step("a", "one").passed("fine")
    skipped = Step("c", "two").skipped("needs a GB10")
    assert exit_code([done, skipped]) == 0  # not rehearsed is not a failure...
    assert skipped.status == NOT_REHEARSED != PASSED  # ...and never a pass
    broken = Step("b", "three").failed("nvcc failed")
    assert broken.status == FAILED and exit_code([done, skipped, broken]) == 1
    text = table([done, skipped, broken])
    for word in ("passed", "not rehearsed", "failed", "needs a GB10", "nvcc failed"):
        assert word in text


def test_inputs_from_the_matrix():
    inputs = load_inputs(None, "gb10", None)
    assert (inputs.engine, inputs.arch_list, inputs.expect_arch) == ("dflashfix", "12.1a",
                                                                     "sm_121a")
    assert [p.name for p in inputs.patches] == ["cuda13-keep-sm121a.patch",
                                                "kv-page-size-pad-mamba.patch"]
    assert [p.name for p in cmake_patches(list(inputs.patches))] == ["cuda13-keep-sm121a.patch"]
    with pytest.raises(UserError, match="installs a wheel"):
        load_inputs(None, "cpu", None)
    with pytest.raises(UserError, match="not built from source"):
        load_inputs(None, "gb10", "nope")


def test_cli_refuses_a_wheel_target_with_exit_2(capsys):
    assert cli_main(["rehearse", "--target", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "installs a wheel" in err and "fix:" in err and "Traceback" not in err


def test_build_requirements_without_torch():
    reqs = ("# comment\n--extra-index-url https://example.invalid/whl\ncmake>=3.26.1\n"
            "torch==2.11.0\nsetuptools>=77.0.3,<81.0.0  # pinned\nprotobuf >= 5.29.6\n")
    assert without_torch(reqs) == ["cmake>=3.26.1", "setuptools>=77.0.3,<81.0.0",
                                   "protobuf >= 5.29.6"]


DOCKERFILE = """\
FROM base AS build
ENV TRITON_PTXAS_PATH=/nowhere
RUN python3 /opt/imagebuild/runtime-selfcheck.py --arch sm_90a
FROM runtime-image AS runtime
ENV PATH=/opt/vllm/bin:$PATH \\
    TRITON_PTXAS_PATH=/usr/local/cuda/bin/ptxas \\
    LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:${LD_LIBRARY_PATH}
# RUN python3 /opt/imagebuild/runtime-selfcheck.py --arch commented
RUN python3 /opt/imagebuild/runtime-selfcheck.py --arch sm_121a --phase toolchain \\
    && sh /opt/imagebuild/other.sh --check 1000
RUN pip install x && python3 /opt/imagebuild/runtime-selfcheck.py --arch sm_121a --phase installed
"""


def test_runtime_stage_env_and_selfchecks(monkeypatch):
    stage = read_runtime_stage(DOCKERFILE)
    assert stage.selfchecks == [["--arch", "sm_121a", "--phase", "toolchain"],
                                ["--arch", "sm_121a", "--phase", "installed"]]
    monkeypatch.setenv("PATH", "/bin")
    monkeypatch.setenv("LD_LIBRARY_PATH", "/x")
    env = localize(stage.env, "/opt/cuda-13.0", "/venv")
    assert env == {"PATH": "/venv/bin:/bin", "TRITON_PTXAS_PATH": "/opt/cuda-13.0/bin/ptxas",
                   "LD_LIBRARY_PATH": "/usr/local/nvidia/lib64:/opt/cuda-13.0/lib64:/x"}


def test_the_rendered_gb10_runtime_stage_runs_its_selfcheck():
    stage = read_runtime_stage(engine_dockerfile(REPO_ROOT, "gb10", "dflashfix").read_text())
    phases = [args[args.index("--phase") + 1] for args in stage.selfchecks]
    assert phases == ["toolchain", "installed"]
    assert all(args[args.index("--arch") + 1] == "sm_121a" for args in stage.selfchecks)
    assert stage.env["TRITON_PTXAS_PATH"].startswith("/usr/local/cuda/")


def test_source_step_fails_when_the_pin_is_not_the_sdists_commit(tmp_path, monkeypatch):
    """What is rehearsed must be what is built: the sdist's commit is the pinned one. The
    recipe's scripts run in the e2e rehearsal; here only their checkout is stood in for."""
    import dataclasses

    from imagebuild.rehearse.run import _source_step
    from imagebuild.vllmsource import tree as source

    def prepare(sdist, workdir, version, patches, paths):
        return source.Checkout(workdir, "f" * 40, source.sdist_commit(sdist), [])

    monkeypatch.setattr(source, "prepare", prepare)
    inputs = load_inputs(None, "gb10", None)
    step, _, _ = _source_step(inputs, tmp_path)
    assert step.status == PASSED, step.summary
    assert any("built from commit 91df0fad4" in d for d in step.details)
    other = dataclasses.replace(inputs, commit="0fc695fc6d1d82e9a5ac6835ac8e4e1c83703665")
    step, sdist, _ = _source_step(other, tmp_path)
    assert step.status == FAILED and sdist is not None  # later steps still run on the tree
    assert "built from commit 91df0fad4, the recipe pins 0fc695fc6d1d" in step.summary


def test_step_a_asserts_the_patchs_reason():
    """cuda13-keep-sm121a.patch is kept for the arch-specific build; without it vLLM 0.23
    still builds NVFP4 (12.0f family code, which 12.1 runs), so no Marlin fallback."""
    inputs = load_inputs(None, "gb10", None)
    holds, why = reason_without(_arch("12.0", "12.0f", "arch=compute_120f,code=sm_120f"), inputs)
    assert holds and "12.0f family code" in why and "not NVFP4 itself" in why
    holds, why = reason_without(_arch("12.0", "", "arch=compute_120,code=sm_120"), inputs)
    assert not holds and "compiled out" in why  # a pin bump that changes the reason fails
    assert not reason_without(_arch("12.0", "12.0a", "arch=compute_120a,code=sm_120a"),
                              inputs)[0]


@pytest.mark.parametrize("returncode, status", [(0, PASSED), (1, FAILED)])
def test_selfcheck_that_crashes_after_some_ok_lines_fails(monkeypatch, returncode, status):
    """Checks after a crash never ran: a nonzero exit with no FAIL line is still a failure."""
    import subprocess

    from imagebuild.rehearse import step_selfcheck
    from imagebuild.rehearse.toolchain import Tools

    def run(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, returncode, "ok toolchain-ptxas: sm_121a\n",
                                           "Traceback (most recent call last):\n" * returncode)

    monkeypatch.setattr(step_selfcheck.subprocess, "run", run)
    tools = Tools("/cuda/bin/nvcc", "/cuda", "/usr/bin/cmake", "/venv/bin/python", "cuobjdump")
    step = step_selfcheck.rehearse_selfcheck(load_inputs(None, "gb10", None), tools)[0]
    assert step.status == status, step.summary
    if returncode:
        assert "exit 1 after 1 ok" in step.summary
