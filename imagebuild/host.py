"""What this machine has: its platform and NVIDIA GPUs (name, compute capability), read
from `uname` and `nvidia-smi`. spec/hardware.match picks the target from it."""

from __future__ import annotations

import platform
import subprocess

from imagebuild.spec.hardware import Gpu, Host

MACHINES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
QUERY = ["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"]


def parse_gpus(text: str) -> tuple[Gpu, ...]:
    """nvidia-smi's CSV lines (`NVIDIA GB10, 12.1`); lines it could not fill are skipped."""
    out = []
    for line in text.splitlines():
        name, sep, cap = line.rpartition(",")
        cap = cap.strip()
        if sep and name.strip() and len(cap.split(".")) == 2 and cap.replace(".", "").isdigit():
            out.append(Gpu(name.strip(), cap))
    return tuple(out)


def probe_host() -> Host:
    machine = platform.machine().lower()
    try:
        proc = subprocess.run(QUERY, capture_output=True, text=True, timeout=10)
        gpus = parse_gpus(proc.stdout) if proc.returncode == 0 else ()
    except (OSError, subprocess.TimeoutExpired):
        gpus = ()
    return Host(platform=f"linux/{MACHINES.get(machine, machine)}", gpus=gpus)
