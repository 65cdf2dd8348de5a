"""MAX_JOBS / NVCC_THREADS choice and the host probe behind it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from imagebuild.builder.buildjobs import (
    GIB,
    choose_max_jobs,
    choose_nvcc_threads,
    choose_parallelism,
    host_resources,
)

# DGX Spark: "128 GB" of LPDDR5X; its kernel reports about 119 GiB MemTotal.
SPARK_NOMINAL = 128 * GIB
SPARK_MEMTOTAL = 119 * GIB


@pytest.mark.parametrize("mem", [SPARK_NOMINAL, SPARK_MEMTOTAL])
def test_spark_matches_the_deployment_notes(mem):
    # docs/domain.md: MAX_JOBS ~12 and NVCC_THREADS=2 on the 128 GB, 20-core Spark.
    assert choose_parallelism(mem, 20) == (12, 2)
    assert choose_nvcc_threads(mem, 20) == 2
    assert choose_max_jobs(mem, 20, nvcc_threads=2) == 12


def test_spark_single_threaded_nvcc_is_memory_bound():
    # 128 GiB less a 10% reserve holds 14 jobs of 8 GiB; 20 cores would allow 20.
    assert choose_max_jobs(SPARK_NOMINAL, 20) == 14


def test_this_machine_size():
    # 24 GiB, 2 cores: two 8 GiB jobs fit, cores are the cap, no spare core for threads.
    assert choose_parallelism(24 * GIB, 2) == (2, 1)


@pytest.mark.parametrize("mem", [0, 1 * GIB, 4 * GIB, 9 * GIB])
def test_tiny_memory_still_builds_with_one_job(mem):
    assert choose_max_jobs(mem, 16) == 1
    assert choose_nvcc_threads(mem, 16) == 1


def test_cores_cap_jobs_when_memory_is_plenty():
    assert choose_parallelism(1024 * GIB, 8) == (8, 1)
    assert choose_max_jobs(1024 * GIB, 1) == 1


def test_heavier_jobs_mean_fewer_jobs():
    assert choose_max_jobs(SPARK_NOMINAL, 20, gb_per_job=16) == 7
    assert choose_max_jobs(SPARK_NOMINAL, 20, gb_per_job=4) == 20


def test_threads_never_exceed_two():
    # 64 GiB: 7 jobs by memory leave 13 of 20 cores idle; still only 2 threads per job.
    assert choose_parallelism(64 * GIB, 20) == (7, 2)


@pytest.mark.parametrize(
    "kwargs",
    [{"cores": 0}, {"gb_per_job": 0}, {"nvcc_threads": 0}],
)
def test_nonsense_inputs_are_rejected(kwargs):
    args = {"mem_bytes": 64 * GIB, "cores": 8, **kwargs}
    with pytest.raises(ValueError):
        choose_max_jobs(**args)


def _fake_root(tmp_path: Path, mem_kib: int, cgroup: str, files: dict[str, str]) -> Path:
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/meminfo").write_text(
        f"MemTotal:       {mem_kib} kB\nMemFree:        1000 kB\n"
    )
    (tmp_path / "proc/self/cgroup").write_text(cgroup)
    for rel, text in files.items():
        p = tmp_path / "sys/fs/cgroup" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


AFFINITY = len(os.sched_getaffinity(0))


def test_no_cgroup_limit_reports_memtotal(tmp_path):
    root = _fake_root(tmp_path, 24683656, "0::/\n", {"memory.max": "max\n"})
    assert host_resources(root) == (24683656 * 1024, AFFINITY)


def test_cgroup_v2_limit_on_an_ancestor_is_respected(tmp_path):
    root = _fake_root(
        tmp_path,
        128 * 1024 * 1024,
        "0::/ci.slice/job-1\n",
        {
            "ci.slice/job-1/memory.max": "max\n",
            "ci.slice/memory.max": f"{12 * GIB}\n",
            "ci.slice/job-1/cpu.max": "100000 100000\n",
        },
    )
    mem, cores = host_resources(root)
    assert mem == 12 * GIB
    assert cores == 1
    assert choose_max_jobs(mem, cores) == 1


def test_cgroup_v1_limit_is_respected_and_unlimited_ignored(tmp_path):
    cgroup = "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n"
    files = {
        "memory/memory.limit_in_bytes": "9223372036854771712\n",  # v1 "no limit"
        "memory/docker/abc/memory.limit_in_bytes": f"{20 * GIB}\n",
        "cpu/docker/abc/cpu.cfs_quota_us": "-1\n",
        "cpu/docker/abc/cpu.cfs_period_us": "100000\n",
    }
    root = _fake_root(tmp_path, 64 * 1024 * 1024, cgroup, files)
    assert host_resources(root) == (20 * GIB, AFFINITY)


def test_cgroup_v1_unlimited_everywhere(tmp_path):
    files = {"memory/memory.limit_in_bytes": "9223372036854771712\n"}
    root = _fake_root(tmp_path, 2 * 1024 * 1024, "4:memory:/x\n", files)
    assert host_resources(root) == (2 * GIB, AFFINITY)


def test_real_host_probe_is_sane():
    mem, cores = host_resources()
    assert 0 < mem <= os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert 1 <= cores <= (os.cpu_count() or 1)
