"""Step (c): vLLM's Python-only package (VLLM_TARGET_DEVICE=empty) built from the
recipe-shaped checkout by the recipe's build-vllm-wheel.sh, whose version logic
(SETUPTOOLS_SCM_PRETEND_VERSION_FOR_VLLM) and check-vllm-version.py must make it the
engine's version; then the same check on the installed package, as the runtime stage runs
it. First, a control: without the pin, setuptools-scm must call this checkout
0.1.dev1+g<sha> (a tagless fetch), or the step would prove nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from imagebuild.rehearse.buildenv import BuildEnvFailed, build_python
from imagebuild.rehearse.inputs import Inputs
from imagebuild.rehearse.steps import Step
from imagebuild.rehearse.toolchain import Tools
from imagebuild.render import VLLM_PATHS
from imagebuild.vllmsource.tree import FILES


def _env_without_cargo(extra: dict[str, str]) -> dict[str, str]:
    """The build image has no Rust toolchain, so vLLM's optional Rust frontend is skipped
    there; keep it skipped here (it would fetch crates from outside the package indexes)."""
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep)
            if p and not (Path(p) / "cargo").exists()]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CMAKE_", "SETUPTOOLS_SCM", "VLLM_"))}
    return {**env, "PATH": os.pathsep.join(path), **extra}


def _tail(text: str, n: int = 12) -> list[str]:
    return [f"  {line}" for line in text.strip().splitlines()[-n:]]


def rehearse_package(inputs: Inputs, tools: Tools | None, checkout: Path | None,
                     workdir: Path) -> Step:
    step = Step("c", "Python-only package + version")
    if checkout is None or tools is None:
        return step.skipped("no source checkout or no torch Python (see above)")
    start = time.monotonic()
    try:
        python = build_python(tools.torch_python, checkout / VLLM_PATHS["build_requirements"])
    except (BuildEnvFailed, subprocess.CalledProcessError) as exc:
        step.details += _tail(getattr(exc, "output", "") or str(exc))
        return step.failed(f"no build Python: {exc}")
    scm = subprocess.run([python, "-c", "import setuptools_scm as s; "
                          f"print(s.get_version(root={str(checkout)!r}))"],
                         capture_output=True, text=True, check=False,
                         env=_env_without_cargo({}))
    unpinned = scm.stdout.strip()
    step.details.append(f"control: setuptools-scm without the pin calls this checkout "
                        f"{unpinned or scm.stderr.strip()[-200:]}")
    if not unpinned.startswith("0.1.dev"):
        step.seconds = time.monotonic() - start
        return step.failed("the rehearsal's checkout is not tagless, so it cannot show the "
                           "recipe's version logic at work")
    out = workdir / "wheels"
    shutil.rmtree(out, ignore_errors=True)
    env = _env_without_cargo({"PYTHON": python, "VLLM_TARGET_DEVICE": "empty"})
    proc = subprocess.run(["sh", str(FILES / "build-vllm-wheel.sh"), str(checkout), str(out),
                           inputs.vllm_version], capture_output=True, text=True, env=env,
                          check=False)
    log = proc.stdout + proc.stderr
    (workdir / "build-vllm-wheel.log").write_text(log)
    step.details += [line for line in log.splitlines()
                     if line.startswith(("ok ", "BAD ", "build-vllm-wheel:", "check-vllm"))]
    if proc.returncode != 0:
        step.seconds = time.monotonic() - start
        step.details += _tail(log)
        verdict = [line for line in log.splitlines() if line.startswith("check-vllm-version:")]
        why = verdict[-1].split(". ")[0] if verdict else f"see {workdir / 'build-vllm-wheel.log'}"
        return step.failed(f"build-vllm-wheel.sh exited {proc.returncode}: {why}")
    wheel = next(out.glob("vllm-*.whl"))
    target = workdir / "installed"
    shutil.rmtree(target, ignore_errors=True)
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                    str(wheel)], check=True, capture_output=True)
    # Only the installed package on the path (-S: no site-packages, so no other vLLM)
    check = subprocess.run([python, "-S", str(FILES / "check-vllm-version.py"), "--expect",
                            inputs.vllm_version], capture_output=True, text=True, check=False,
                           env={**os.environ, "PYTHONPATH": str(target)})
    step.seconds = time.monotonic() - start
    step.details += [f"installed: {line}" for line in
                     (check.stdout + check.stderr).strip().splitlines()]
    if check.returncode != 0:
        return step.failed(f"check-vllm-version.py on the installed {wheel.name} exited "
                           f"{check.returncode}")
    return step.passed(f"{wheel.name} from the tagless checkout (unpinned it would be "
                       f"{unpinned.split('+')[0]}+g…); check-vllm-version.py --expect "
                       f"{inputs.vllm_version} ok on the wheel and installed")
