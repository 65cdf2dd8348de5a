"""The cpu cell's build, as the end-to-end tests run it (shared by conftest and tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from imagebuild import REPO_ROOT

TAG = "2026-06-18-dflashfix"
CPU_SERVE_REF = "127.0.0.1:5000/vllm-spark/cpu-tiny-ngram:2026-06-18-v0.23.0-dflashfix"
# Secret values the build receives (as BuildKit secrets only); none may leak anywhere.
HF_TOKEN_MARKER = "hf_imagebuildLeakCanary7f3a9c"
CA_MARKER = "imagebuild-ca-leak-canary-51d2e8"


@dataclass(frozen=True)
class CpuBuild:
    out: Path  # build dir: records, logs, contexts
    ref: str  # the local serve image
    output: str  # what the build command printed


def run_cpu_build(out: Path, env: dict[str, str] | None = None
                  ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "build.py", "build", "--tag", TAG, "--target", "cpu",
         "--out", str(out)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=3000,
        env={**os.environ, **(env or {})})
