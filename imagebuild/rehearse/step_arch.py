"""Step (a): vLLM's own CMake picks the CUDA arches, with the patch series and without
each of its CMake patches. TORCH_CUDA_ARCH_LIST=12.1a must survive with the series (as
CUDA_ARCHS, FP4_ARCHS and the NVFP4 unit's -gencode) and collapse without the patch,
otherwise that patch is no longer needed and the step says so.

It also asserts the patch's stated reason (its header, docs/domain.md): without it the
NVFP4 kernels are still built, as family code of the same major (12.0f: NVIDIA's
family-specific targets run on every device of the family, 12.1 included), so the patch
keeps the arch-specific sm_121a build the target asks for; it does not rescue NVFP4 from
a Marlin fallback. Should a pin bump compile NVFP4 out without the patch, or keep 12.1a,
the step fails and says which reason now holds."""

from __future__ import annotations

import time
from pathlib import Path

from imagebuild.rehearse.arch_probe import ArchResult, ProbeFailed, configure, messages, write_probe
from imagebuild.rehearse.cmake_blocks import AnchorError
from imagebuild.rehearse.inputs import FP4_UNITS, GENERIC_UNITS, Inputs
from imagebuild.rehearse.steps import Step
from imagebuild.rehearse.toolchain import Tools
from imagebuild.vllmsource import tree


def gencode_for(expect_arch: str) -> str:
    """sm_121a -> arch=compute_121a,code=sm_121a (what vLLM passes for 12.1a)."""
    return f"arch=compute_{expect_arch.removeprefix('sm_')},code={expect_arch}"


def _survives(res: ArchResult, inputs: Inputs) -> tuple[bool, str]:
    want = inputs.arch_list.split(";")[0].strip()  # "12.1a"
    nvfp4 = FP4_UNITS[0]
    gencodes = res.gencodes(nvfp4)
    line = (f"CUDA_SUPPORTED_ARCHS={res.values.get('CUDA_SUPPORTED_ARCHS')}  "
            f"CUDA_ARCHS={res.values.get('CUDA_ARCHS') or '(none)'}  "
            f"FP4_ARCHS={res.values.get('FP4_ARCHS') or '(none)'}  "
            f"{Path(nvfp4).name}: {' '.join('-gencode ' + g for g in gencodes) or 'not built'}")
    ok = (want in res.archs("CUDA_ARCHS") and want in res.archs("FP4_ARCHS")
          and gencode_for(inputs.expect_arch) in gencodes)
    return ok, line


def family_of(arch: str) -> str:
    """12.1a -> 12.0f: the family target of the same major, as vLLM's lists name it."""
    return f"{arch.split('.')[0]}.0f"


def reason_without(res: ArchResult, inputs: Inputs) -> tuple[bool, str]:
    """Whether the build without the patch matches the patch's stated reason: NVFP4
    still built, as the family target (runs on the device), the requested arch gone."""
    want = inputs.arch_list.split(";")[0].strip()
    fp4 = res.archs("FP4_ARCHS")
    family = family_of(want)
    if not fp4:
        return False, ("without it NVFP4 is not built at all (FP4_ARCHS empty): the patch's "
                       "reason is now that NVFP4 is compiled out; update its header and "
                       "docs/domain.md")
    if family not in fp4:
        return False, (f"without it FP4_ARCHS={';'.join(fp4)}, not the family target "
                       f"{family}: re-read the patch's reason")
    return True, (f"without it NVFP4 is still built, as {family} family code (runs on "
                  f"{want.rstrip('af')} under NVIDIA's family rules), and no {want} code is "
                  "built: the patch keeps the arch-specific build, not NVFP4 itself")


def _probe(tree: Path, probe: Path, tools: Tools, inputs: Inputs) -> ArchResult:
    write_probe(tree, probe, list(GENERIC_UNITS), list(FP4_UNITS))
    return configure(probe, tools, inputs.arch_list, inputs.nvcc_threads)


def rehearse_arch(inputs: Inputs, tools: Tools, sdist_root: Path, checkout: Path,
                  workdir: Path) -> tuple[Step, ArchResult | None]:
    step = Step("a", "vLLM's CMake arch selection")
    start = time.monotonic()
    want = inputs.arch_list
    series = ", ".join(p.name for p in inputs.patches) or "no patches"
    try:
        with_res = _probe(checkout, workdir / "probe-with-series", tools, inputs)
        ok_with, line = _survives(with_res, inputs)
        step.details.append(f"with the series ({series}): {line}")
        step.details += [f"  cmake: {m}" for m in messages(with_res.log)]
        verdicts = []
        cmake_patches = tree.cmake_patches(list(inputs.patches))
        for patch in cmake_patches:
            rest = [p for p in cmake_patches if p != patch]
            cut = tree.cmake_only_tree(sdist_root, workdir / f"cmake-without-{patch.stem}", rest)
            res = _probe(cut, workdir / f"probe-without-{patch.stem}", tools, inputs)
            kept, line = _survives(res, inputs)
            step.details.append(f"without {patch.name}: {line}")
            step.details += [f"  cmake: {m}" for m in messages(res.log)]
            verdicts.append((patch.name, kept, res))
    except (ProbeFailed, AnchorError) as exc:
        step.seconds = time.monotonic() - start
        log = getattr(exc, "log", "")
        step.details += [f"  {line}" for line in log.strip().splitlines()[-15:]]
        return step.failed(f"the arch probe did not run: {exc}"), None
    step.seconds = time.monotonic() - start
    if not ok_with:
        return step.failed(f"TORCH_CUDA_ARCH_LIST={want} does not survive vLLM's CMake with "
                           f"the series: no {inputs.expect_arch} code for the NVFP4 kernels"), \
            with_res
    stale = [name for name, kept, _ in verdicts if kept]
    if stale:
        return step.failed(f"{want} survives without {', '.join(stale)} as well: vLLM's own "
                           "arch list keeps it, drop the patch from the series"), with_res
    if not verdicts:
        return step.passed(f"{want} survives with the series; the series has no CMake patch, "
                           "so there is nothing to compare against"), with_res
    reasons = [(name, *reason_without(res, inputs)) for name, _, res in verdicts]
    step.details += [f"reason for {name}: {why}" for name, _, why in reasons]
    broken = [f"{name}: {why}" for name, holds, why in reasons if not holds]
    if broken:
        return step.failed("; ".join(broken)), with_res
    collapsed = "; ".join(
        f"without {name}: CUDA_ARCHS={res.values.get('CUDA_ARCHS') or '(none)'}, "
        f"FP4_ARCHS={res.values.get('FP4_ARCHS') or '(none)'}" for name, _, res in verdicts)
    return step.passed(f"{want} survives with the series (CUDA_ARCHS, FP4_ARCHS, "
                       f"-gencode {gencode_for(inputs.expect_arch)}) and collapses "
                       f"{collapsed}; {reasons[0][2]}"), with_res
