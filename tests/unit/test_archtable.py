"""The GPU-code table's rules (build/archtable.py): what counts as code for the target, and
which selected kernel family without it is an error."""

from __future__ import annotations

from pathlib import Path

from imagebuild.builder.archtable import Row, classify, library_of, problems, required


def test_classify_against_sm121a():
    assert classify(["sm_90a", "sm_121a"], [], "sm_121a") == "sm_121a"
    assert classify(["sm_120"], [], "sm_121a") == "sm_120 family"  # a 12.0f unit lists so
    # arch-specific code of another arch does not run on sm_121
    assert classify(["sm_120a"], [], "sm_121a") == "none"
    assert classify(["sm_90a"], ["sm_90"], "sm_121a") == "PTX-only"
    assert classify([], ["sm_121a"], "sm_121a") == "PTX-only"
    assert classify([], ["sm_120a"], "sm_121a") == "none"
    assert classify(["sm_80"], [], "sm_121a") == "none"


def test_libraries_are_top_level_packages():
    root = Path("/sp")
    assert library_of(root / "vllm/_C.abi3.so", root) == "vllm"
    assert library_of(root / "vllm/vllm_flash_attn/_fa2.so", root) == "vllm/vllm_flash_attn"
    assert library_of(root / "flashinfer_cubin/cubins/moe/x.cubin", root) == "flashinfer_cubin"


def _row(lib: str, verdict: str, cubins: tuple[str, ...] = ()) -> Row:
    return Row(lib, verdict, 1, list(cubins), [], verdict)


def test_selected_families_need_code_for_the_target():
    assert set(required({"attention": "FLASH_ATTN", "moe": "FLASHINFER_CUTLASS"})) == {
        "vllm", "vllm/vllm_flash_attn", "flashinfer", "flashinfer_cubin",
        "flashinfer_jit_cache"}
    rows = [_row("vllm", "sm_121a", ("sm_121a",)),
            _row("flashinfer_cubin", "none", ("sm_90a", "sm_100a"))]
    bad = problems(rows, {"moe": "FLASHINFER_CUTLASS"}, gpu=True, expect="sm_121a")
    assert len(bad) == 1 and bad[0].startswith("moe FLASHINFER_CUTLASS needs flashinfer or ")
    assert "flashinfer_cubin: none (sm_90a, sm_100a)" in bad[0]
    # FlashInfer's MoE with only sm_120 family code on sm_121a: the flashinfer#3294 trap
    rows.append(_row("flashinfer_jit_cache", "sm_120 family", ("sm_120",)))
    (bad,) = problems(rows, {"moe": "FLASHINFER_CUTLASS"}, gpu=True, expect="sm_121a")
    assert "no sm_121a code (family code is wrong there, flashinfer#3294)" in bad
    # family code is enough for FlashInfer's other kernels, and for MoE on a family target
    assert problems(rows, {"attention": "FLASHINFER"}, gpu=True, expect="sm_121a") == []
    assert problems(rows, {"moe": "FLASHINFER_CUTLASS"}, gpu=True, expect="sm_121") == []
    # one FlashInfer package with the target's own code is enough (cubins or JIT cache)
    rows.append(_row("flashinfer", "sm_121a", ("sm_121a",)))
    assert problems(rows, {"moe": "FLASHINFER_CUTLASS"}, gpu=True, expect="sm_121a") == []
    # vLLM's own kernels are always needed on a GPU target, never on the cpu target
    assert problems([], {}, gpu=True)[0].startswith("vLLM's own kernels needs vllm")
    assert problems([], {"attention": "CPU_ATTN"}, gpu=False) == []


def test_release_notes_show_the_build_records_table(matrix_dir):
    from dataclasses import asdict

    from imagebuild.plan import load_plan
    from imagebuild.release.notes import ImageFacts, release_notes

    plan = load_plan(matrix_dir / "matrix.yaml", "2026-06-18-dflashfix", "gb10")
    job = plan.jobs[0]
    rows = [asdict(_row("vllm", "sm_121a", ("sm_121a",))),
            asdict(_row("flashinfer_cubin", "sm_120 family", ("sm_120",)))]
    text = release_notes(plan.lm, plan.jobs, {job.id: ImageFacts(None, None, None,
                                                                 gpu_code=rows)})
    assert "GPU code per library (build/archtable.py)" in text
    assert "| library | code for sm_121a |" in text
    assert "| flashinfer_cubin | sm_120 family | sm_120 family | 1 | sm_120 | - |" in text
    without = release_notes(plan.lm, plan.jobs, {job.id: ImageFacts(None, None, None)})
    assert "GPU code per library" not in without
