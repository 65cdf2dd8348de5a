"""Step (b): the rehearsed units compiled with the nvcc command lines vLLM's CMake wrote
in step (a), then every CUDA object through the image's arch gate."""

from __future__ import annotations

import time
from pathlib import Path

from imagebuild.rehearse.arch_probe import ArchResult
from imagebuild.rehearse.compile import Compiled, Unit, compile_units
from imagebuild.rehearse.gate import run_gate
from imagebuild.rehearse.inputs import Inputs
from imagebuild.rehearse.steps import Step
from imagebuild.rehearse.toolchain import Tools, nvcc_version


def units_of(res: ArchResult, sources: tuple[str, ...]) -> list[Unit]:
    """The compile_commands.json entries of `sources`; KeyError names a missing one."""
    missing = [s for s in sources if s not in res.commands]
    if missing:
        raise KeyError(f"no compile command for {', '.join(missing)}")
    return [Unit.from_entry(s, res.commands[s]) for s in sources]


def rehearse_compile(inputs: Inputs, tools: Tools, arch: ArchResult | None,
                     jobs: int) -> tuple[Step, list[Compiled]]:
    step = Step("b", f"compile for {inputs.expect_arch} + arch gate")
    if arch is None:
        return step.skipped("step (a) produced no compile commands"), []
    start = time.monotonic()
    try:
        units = units_of(arch, inputs.units)
    except KeyError as exc:
        return step.failed(str(exc.args[0])), []
    results = compile_units(units, jobs=jobs)
    step.seconds = time.monotonic() - start
    for r in results:
        state = "ok" if r.ok else f"FAILED (exit {r.returncode})"
        step.details.append(f"{r.unit.source}: {state} in {r.seconds:.1f}s")
        if not r.ok:
            step.details += [f"  {line}" for line in r.error_tail().splitlines()]
    failed = [r.unit.source for r in results if not r.ok]
    if failed:
        return step.failed(f"nvcc failed on {', '.join(Path(f).name for f in failed)}"), results
    cuda_objects = [r.unit.output for r in results if r.unit.is_cuda]
    gate = run_gate(cuda_objects, inputs.expect_arch, tools.cuobjdump)
    step.seconds = time.monotonic() - start
    step.details += [f"gate: {line}" for line in gate.lines]
    names = ", ".join(Path(r.unit.source).name for r in results)
    if not gate.ok:
        return step.failed(f"compiled {names}; the arch gate rejected them "
                           f"(exit {gate.returncode})"), results
    return step.passed(f"compiled {names} with nvcc {nvcc_version(tools.nvcc)}; "
                       f"check-cuda-arch.py --expect {inputs.expect_arch}: "
                       f"{len(cuda_objects)} CUDA object(s) ok"), results
