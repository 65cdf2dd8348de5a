"""What a rehearsal of one target takes from matrix.yaml: the source pin, the patch
series, TORCH_CUDA_ARCH_LIST, the arch the gate expects, nvcc threads; and which
translation units it compiles."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from imagebuild.errors import UserError
from imagebuild.spec import matrix as mx

# Small, real units of vLLM 0.23's _C_stable_libtorch (no CUTLASS, which is fetched from
# GitHub): its C++ bindings, a plain CUDA kernel file (CUDA_ARCHS) and the NVFP4
# quantization kernels (FP4_ARCHS, the code GB10's NVFP4 models run). ~25 s of CPU.
GENERIC_UNITS = ("csrc/libtorch_stable/torch_bindings.cpp",
                 "csrc/libtorch_stable/activation_kernels.cu")
FP4_UNITS = ("csrc/libtorch_stable/quantization/fp4/nvfp4_quant_kernels.cu",)


@dataclass(frozen=True)
class Inputs:
    target: str
    engine: str
    vllm_version: str
    repository: str
    commit: str
    patches: tuple[Path, ...]
    arch_list: str  # TORCH_CUDA_ARCH_LIST
    expect_arch: str  # sm_121a
    nvcc_threads: int | None
    root: Path  # the matrix's directory

    @property
    def units(self) -> tuple[str, ...]:
        return GENERIC_UNITS + FP4_UNITS


def load_inputs(matrix_path: Path | None, target: str, engine: str | None) -> Inputs:
    lm = mx.load(matrix_path)
    where = lm.located.where(("targets",))
    tgt = lm.matrix.targets.get(target)
    if tgt is None:
        raise UserError(f"unknown target {target!r}", where=where,
                        fix=f"use one of: {', '.join(lm.matrix.targets)}")
    if tgt.engine_from != "source":
        raise UserError(f"target {target} installs a wheel; only a source build is rehearsed",
                        where=lm.located.where(("targets", target, "engine_from")),
                        fix="rehearse a target with engine_from: source (gb10)")
    arch_list = tgt.build_args.get("TORCH_CUDA_ARCH_LIST")
    if not arch_list or not tgt.expect_cuda_arch:
        raise UserError(f"target {target} needs build_args.TORCH_CUDA_ARCH_LIST and "
                        "expect_cuda_arch for a rehearsal",
                        where=lm.located.where(("targets", target)),
                        fix="set both (gb10: \"12.1a\" and sm_121a)")
    candidates = [name for name, e in lm.matrix.engines.items()
                  if target in e.realize and e.realize[target].source]
    if engine is None:
        if not candidates:
            raise UserError(f"no engine is built from source for target {target}",
                            where=lm.located.where(("engines",)),
                            fix=f"add realize.{target}.source to an engine")
        engine = candidates[0]
    elif engine not in candidates:
        raise UserError(f"engine {engine!r} is not built from source for target {target}",
                        where=lm.located.where(("engines",)),
                        fix=f"use one of: {', '.join(candidates) or '(none)'}")
    eng = lm.matrix.engines[engine]
    real = eng.realize[target]
    assert real.source is not None
    return Inputs(target, engine, eng.vllm_version, real.source.repository, real.source.commit,
                  tuple(lm.root / "patches" / p for p in real.patches), arch_list,
                  tgt.expect_cuda_arch, tgt.nvcc_threads, lm.root)
