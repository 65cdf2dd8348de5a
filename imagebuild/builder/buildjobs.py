"""How many compile jobs a from-source vLLM build may run: MAX_JOBS and NVCC_THREADS.

The deployment notes (docs/domain.md) build vLLM on a 128 GB, 20-core Spark with MAX_JOBS ~12
and NVCC_THREADS=2, and lower MAX_JOBS when the compiler is OOM-killed: the heavy CUTLASS
and Marlin units peak at ~8 GB per nvcc job. Memory is the limit first, cores second.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

GIB = 1 << 30

# Memory kept back from the build for the kernel, dockerd/BuildKit, the linker and page
# cache; on the Spark's unified memory nothing else gives it back.
RESERVE_FRACTION = 0.10
RESERVE_MIN_BYTES = 2 * GIB

# nvcc --threads runs one compilation per -gencode target in parallel; a gb10 unit has
# at most two (12.1a cubins, plus PTX for Marlin's 8.0+PTX), so a third thread idles.
MAX_NVCC_THREADS = 2

# Compile steps wait on disk and on the host compiler now and then; total threads
# (MAX_JOBS x NVCC_THREADS) up to 1.2x the cores keeps them busy without thrashing.
# 20 cores -> 24 threads -> 12 jobs of 2 threads: the Spark's MAX_JOBS=12/NVCC_THREADS=2.
OVERSUBSCRIBE = 1.2


def _usable_bytes(mem_bytes: int) -> int:
    return mem_bytes - max(RESERVE_MIN_BYTES, int(mem_bytes * RESERVE_FRACTION))


def _jobs_by_memory(mem_bytes: int, gb_per_job: float) -> int:
    if gb_per_job <= 0:
        raise ValueError(f"gb_per_job must be positive, got {gb_per_job}")
    return max(0, math.floor(_usable_bytes(mem_bytes) / (gb_per_job * GIB)))


def choose_nvcc_threads(mem_bytes: int, cores: int, gb_per_job: float = 8.0) -> int:
    """NVCC_THREADS: 2 when memory, not cores, caps the job count, so that the cores the
    jobs cannot use go to a second device compile inside each job; otherwise 1.

    gb_per_job (GiB) is the peak of one whole nvcc job, threads included: the ~8 GB
    figure comes from builds run with NVCC_THREADS=2.
    """
    by_mem = _jobs_by_memory(mem_bytes, gb_per_job)
    if by_mem < 1 or cores <= by_mem:
        return 1
    return min(MAX_NVCC_THREADS, math.ceil(cores / by_mem))


def choose_max_jobs(
    mem_bytes: int, cores: int, gb_per_job: float = 8.0, nvcc_threads: int = 1
) -> int:
    """MAX_JOBS: as many ~gb_per_job GiB jobs as fit in memory after a reserve, capped by
    the cores (counting each job's nvcc threads, OVERSUBSCRIBE-fold), at least 1.

    128 GiB / 20 cores with 2 threads -> 12; 24 GiB / 2 cores -> 2; 4 GiB -> 1.
    """
    if cores < 1:
        raise ValueError(f"cores must be at least 1, got {cores}")
    if nvcc_threads < 1:
        raise ValueError(f"nvcc_threads must be at least 1, got {nvcc_threads}")
    by_cpu = cores if nvcc_threads == 1 else math.floor(cores * OVERSUBSCRIBE / nvcc_threads)
    return max(1, min(_jobs_by_memory(mem_bytes, gb_per_job), by_cpu))


def choose_parallelism(mem_bytes: int, cores: int, gb_per_job: float = 8.0) -> tuple[int, int]:
    """(MAX_JOBS, NVCC_THREADS) chosen together, the way a build should use them."""
    threads = choose_nvcc_threads(mem_bytes, cores, gb_per_job)
    return choose_max_jobs(mem_bytes, cores, gb_per_job, threads), threads


def _read_int(path: Path) -> int | None:
    """An integer limit from a cgroup file; None for "max", missing or unreadable."""
    try:
        text = path.read_text().split()
    except OSError:
        return None
    if not text or not text[0].isdigit():
        return None
    return int(text[0])


def _cgroup_dirs(root: Path, controller: str) -> list[Path]:
    """This process's cgroup dir and its ancestors, for v2 ("") or a v1 controller."""
    base = root / "sys/fs/cgroup" / controller if controller else root / "sys/fs/cgroup"
    rel = "/"
    try:
        lines = (root / "proc/self/cgroup").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, ctrls, path = line.split(":", 2)
        if (controller and controller in ctrls.split(",")) or (not controller and ctrls == ""):
            rel = path
            break
    parts = [p for p in rel.split("/") if p]
    # Walk up: a limit on any ancestor applies. With a cgroup namespace the process
    # sees its own cgroup at the mount root, which the walk reaches last.
    return [base.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]


def cgroup_memory_limit(root: Path = Path("/")) -> int | None:
    """Smallest cgroup memory limit over this process's cgroup and its ancestors."""
    limits = [_read_int(d / "memory.max") for d in _cgroup_dirs(root, "")]
    limits += [_read_int(d / "memory.limit_in_bytes") for d in _cgroup_dirs(root, "memory")]
    # cgroup v1 spells "no limit" as a page-rounded 2**63-1.
    real = [v for v in limits if v is not None and v < (1 << 62)]
    return min(real) if real else None


def cgroup_cpu_limit(root: Path = Path("/")) -> int | None:
    """Cores allowed by a CFS quota (v2 cpu.max, v1 cfs_quota_us/period), rounded up."""
    quotas: list[float] = []
    for d in _cgroup_dirs(root, ""):
        try:
            quota, period = (d / "cpu.max").read_text().split()[:2]
        except (OSError, ValueError):
            continue
        if quota != "max":
            quotas.append(int(quota) / int(period))
    for d in _cgroup_dirs(root, "cpu"):
        q, p = _read_int(d / "cpu.cfs_quota_us"), _read_int(d / "cpu.cfs_period_us")
        if q and p:  # -1 (no quota) does not parse as digits
            quotas.append(q / p)
    return max(1, math.ceil(min(quotas))) if quotas else None


def _meminfo_total(root: Path) -> int:
    for line in (root / "proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024  # reported in kB (KiB)
    raise OSError(f"no MemTotal in {root / 'proc/meminfo'}")


def host_resources(root: Path = Path("/")) -> tuple[int, int]:
    """(memory bytes, cores) this process may use: MemTotal and the CPU affinity, each
    lowered by a cgroup limit when one is set (a container or CI slice)."""
    mem = _meminfo_total(root)
    limit = cgroup_memory_limit(root)
    if limit is not None:
        mem = min(mem, limit)
    cores = len(os.sched_getaffinity(0))
    quota = cgroup_cpu_limit(root)
    if quota is not None:
        cores = min(cores, quota)
    return mem, cores
