"""Step (d): the runtime stage's self-check, as the rendered engine Dockerfile runs it
(its ENV and its runtime-selfcheck.py command lines), on this machine: the CUDA 13
toolkit stands in for /usr/local/cuda and the torch Python's environment (torch 2.11
CUDA, Triton, the NVRTC wheel) for /opt/vllm.

flashinfer-jit-cache cannot be rehearsed: that environment is the CPU oracle's, without
FlashInfer, and the jit-cache wheel lives on FlashInfer's own index. The script is told so
(--may-skip: it skips only when FlashInfer is absent altogether, never a missing
jit-cache beside a present flashinfer) and the step reports it as not rehearsed, never as
passed.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

from imagebuild.rehearse.inputs import Inputs
from imagebuild.rehearse.runtime_stage import engine_dockerfile, localize, read_runtime_stage
from imagebuild.rehearse.steps import Step
from imagebuild.rehearse.toolchain import Tools
from imagebuild.vllmsource.tree import FILES

NEEDS_FLASHINFER = ("flashinfer-jit-cache",)
_LINE = re.compile(r"^(ok|FAIL|skip)\s+([\w-]+): (.*)$")


def outcomes(text: str) -> dict[str, tuple[str, str]]:
    """check name -> (ok | FAIL | skip, detail) from the script's output: a skip is only
    what the script itself printed as one, never inferred from a failure's words."""
    return {m.group(2): (m.group(1), m.group(3))
            for line in text.splitlines() if (m := _LINE.match(line.strip()))}


def tally(text: str) -> dict[str, list[str]]:
    """{"ok": [...], "FAIL": [...], "skip": [...]}: the script's own verdict per check."""
    out: dict[str, list[str]] = {"ok": [], "FAIL": [], "skip": []}
    for name, (status, _detail) in outcomes(text).items():
        out[status].append(name)
    return out


def rehearse_selfcheck(inputs: Inputs, tools: Tools | None) -> list[Step]:
    step = Step("d", "runtime-stage self-check")
    if tools is None:
        return [step.skipped("no CUDA toolkit or torch Python (see above)")]
    dockerfile = engine_dockerfile(inputs.root, inputs.target, inputs.engine)
    if not dockerfile.is_file():
        return [step.failed(f"{dockerfile} is missing: run `python build.py render`")]
    stage = read_runtime_stage(dockerfile.read_text())
    if not stage.selfchecks:
        return [step.failed(f"the runtime stage of {dockerfile.name} runs no "
                            "runtime-selfcheck.py")]
    venv = str(Path(tools.torch_python).parent.parent)
    env = {**os.environ, **localize(stage.env, tools.cuda_home, venv),
           "CUDA_HOME": tools.cuda_home}
    start = time.monotonic()
    passed, failed, skipped = [], [], []
    for args in stage.selfchecks:
        cmd = ["python3", str(FILES / "runtime-selfcheck.py"), *args,
               "--may-skip", ",".join(NEEDS_FLASHINFER)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False,
                              timeout=600)
        step.details.append("$ " + " ".join(["python3", "runtime-selfcheck.py", *cmd[2:]]))
        step.details += [f"  {line}" for line in (proc.stdout + proc.stderr).strip().splitlines()]
        found = tally(proc.stdout + proc.stderr)
        if not any(found.values()):
            failed.append(f"exit {proc.returncode} without results")
        elif proc.returncode and not found["FAIL"]:
            # some checks passed, then it crashed: the checks after the crash never ran
            failed.append(f"exit {proc.returncode} after {len(found['ok'])} ok")
        passed += found["ok"]
        failed += found["FAIL"]
        skipped += found["skip"]
    step.seconds = time.monotonic() - start
    step.details.append("env from the runtime stage: "
                        + ", ".join(f"{k}={v}" for k, v in localize(
                            stage.env, tools.cuda_home, venv).items() if k.startswith("TRITON")))
    extra = [Step("d", f"self-check {name}").skipped(
        "no FlashInfer in the torch Python's environment (the CPU oracle's); its jit-cache "
        "wheel is on FlashInfer's own index") for name in skipped]
    if failed:
        return [step.failed(f"failed: {', '.join(failed)}; passed: {', '.join(passed)}"), *extra]
    return [step.passed(f"{len(passed)} checks of the runtime stage's command lines passed: "
                        f"{', '.join(passed)}"), *extra]
