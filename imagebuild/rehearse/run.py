"""`build.py rehearse`: the GB10 rehearsal's steps in order, then one table.

source -> (a) arch selection -> (b) compile + arch gate -> (c) Python-only package and its
version -> (d) runtime self-check. A step whose input is missing is "not rehearsed"; what
only a GB10 (or GitHub) can show is listed as not rehearsed, with the reason.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from imagebuild import REPO_ROOT
from imagebuild.errors import ImagebuildError
from imagebuild.rehearse.arch_probe import LEFT_OUT
from imagebuild.rehearse.inputs import Inputs, load_inputs
from imagebuild.rehearse.step_arch import rehearse_arch
from imagebuild.rehearse.step_compile import rehearse_compile
from imagebuild.rehearse.step_package import rehearse_package
from imagebuild.rehearse.step_selfcheck import rehearse_selfcheck
from imagebuild.rehearse.steps import Step, exit_code, table
from imagebuild.rehearse.toolchain import ToolMissing, Tools, find_tools
from imagebuild.render import VLLM_PATHS
from imagebuild.vllmsource import tree
from imagebuild.vllmsource.sdist import sdist_pin, sdist_tree

ONLY_ON_GB10 = [
    Step("-", "the full vLLM build", summary=LEFT_OUT),
    Step("-", "docker build of the gb10 images",
         summary="linux/arm64 nvcr.io CUDA images on an arm64 runner; this machine is x86-64 "
                 "and reaches no image registry but its own"),
    Step("-", "GPU execution", summary="loading the extensions, the NVFP4 kernels on sm_121, "
                                       "serving, smoke and bench need a GB10"),
]


def pin_mismatch(pinned: str, built_from: str | None) -> str | None:
    """Why the rehearsed tree (the sdist's) is not the pinned one, or None when it is."""
    if built_from and pinned.startswith(built_from):
        return None
    return (f"the sdist was built from commit {built_from or '(none recorded)'}, the recipe "
            f"pins {pinned[:12]}: what is rehearsed is not what is built; pin the sdist's "
            "commit in matrix.yaml (`build.py lock` refuses any other)")


def _source_step(inputs: Inputs, workdir: Path) -> tuple[Step, Path | None, Path | None]:
    step = Step("src", "pinned source + patch series")
    start = time.monotonic()
    try:
        pin = sdist_pin(inputs.vllm_version)
        sdist = sdist_tree(inputs.vllm_version)
        checkout = tree.prepare(sdist, workdir, inputs.vllm_version, list(inputs.patches),
                                  sorted(VLLM_PATHS.values()))
    except ImagebuildError as exc:
        return step.failed(exc.render()), None, None
    except tree.ScriptFailed as exc:
        step.seconds = time.monotonic() - start
        step.details += exc.output.splitlines()
        return step.failed(f"the recipe's {exc.script} failed (its output below)"), None, None
    step.seconds = time.monotonic() - start
    step.details += checkout.log
    mismatch = pin_mismatch(inputs.commit, checkout.sdist_commit)
    if mismatch:
        return step.failed(mismatch), sdist, checkout.root
    step.details.append(f"the sdist was built from commit {checkout.sdist_commit}, the commit "
                        f"the recipe pins ({inputs.commit[:12]})")
    return step.passed(
        f"{pin.filename} (sha256 {pin.sha256[:12]}, built from the pinned commit) served as "
        f"a repository and fetched by fetch-vllm-source.sh (commit {checkout.head[:12]}, "
        f"no tags); apply-patches.sh: "
        f"{', '.join(p.name for p in inputs.patches) or 'no patches'}; check-source-tree.sh: "
        f"{len(VLLM_PATHS)} recipe paths present"), sdist, checkout.root


def rehearse(inputs: Inputs, workdir: Path, jobs: int,
             progress: Callable[[Step], None] = lambda s: None) -> list[Step]:
    workdir.mkdir(parents=True, exist_ok=True)
    steps: list[Step] = []

    def add(*more: Step) -> None:
        for step in more:
            steps.append(step)
            progress(step)

    tools: Tools | None = None
    missing = ""
    try:
        tools = find_tools()
    except ToolMissing as exc:
        missing = str(exc)
    src, sdist, checkout = _source_step(inputs, workdir)
    add(src)
    if tools is None or sdist is None or checkout is None:
        for key, title in (("a", "vLLM's CMake arch selection"),
                           ("b", f"compile for {inputs.expect_arch} + arch gate")):
            # a missing tool fails the rehearsal: it exists to run these steps
            add(Step(key, title).failed(missing) if tools is None
                else Step(key, title).skipped("the source step failed"))
    else:
        step_a, arch = rehearse_arch(inputs, tools, sdist, checkout, workdir)
        add(step_a)
        add(rehearse_compile(inputs, tools, arch, jobs)[0])
    add(rehearse_package(inputs, tools, checkout, workdir))
    add(*rehearse_selfcheck(inputs, tools))
    steps += ONLY_ON_GB10
    return steps


def main(args: argparse.Namespace) -> int:
    inputs = load_inputs(args.matrix.resolve() if args.matrix else None, args.target,
                         args.engine)
    workdir = (args.workdir or REPO_ROOT / "build" / "rehearse" / inputs.target).resolve()
    print(f"GB10 rehearsal of target {inputs.target}, engine {inputs.engine} "
          f"(vLLM {inputs.vllm_version}, TORCH_CUDA_ARCH_LIST={inputs.arch_list}, "
          f"expect {inputs.expect_arch}) in {workdir}", flush=True)
    try:
        for line in find_tools().describe():
            print(f"  {line}", flush=True)
    except ToolMissing as exc:
        print(f"  {exc}", flush=True)

    def progress(step: Step) -> None:
        print(f"[{step.key}] {step.title}: {step.status}", flush=True)

    steps = rehearse(inputs, workdir, args.jobs, progress)
    print()
    print(table(steps))
    for s in steps:
        if s.details:
            print(f"\n[{s.key}] {s.title}")
            for line in s.details:
                print(f"  {line}")
    code = exit_code(steps)
    print(f"\nrehearsal {'FAILED' if code else 'passed'}: "
          + ", ".join(f"{sum(s.status == st for s in steps)} {st}"
                      for st in ("passed", "failed", "not rehearsed")))
    return code
