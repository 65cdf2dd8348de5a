#!/bin/sh
# build-vllm-wheel.sh SRC OUTDIR VERSION
#
# Build the vLLM wheel from the source tree SRC into OUTDIR, versioned VERSION (the
# engine's vllm_version), and check the result with check-vllm-version.py (looked up next
# to this script). Runs in the gb10 engine build and in the GB10 rehearsal (which sets
# VLLM_TARGET_DEVICE=empty for the Python-only package).
#
# The version: the source is fetched by SHA with no tags, so setuptools-scm alone would
# call it 0.1.dev1+g<sha>. Both pretend variables pin it: vLLM 0.23.0's setup.py calls
# setuptools-scm's get_version() without a distribution name, which reads only the plain
# SETUPTOOLS_SCM_PRETEND_VERSION; the setuptools hook reads the _FOR_VLLM one. vLLM's setup.py
# still appends its own local suffix on top (+cu<NNN> when nvcc is not its main CUDA
# version, +empty, ...), exactly as for its release wheels.
#
# MAX_JOBS is the number of compile jobs wanted. vLLM's setup.py (compute_num_jobs) runs
# MAX_JOBS // NVCC_THREADS jobs when nvcc is the compiler, so setup.py is handed
# MAX_JOBS x NVCC_THREADS: 12 jobs of 2 nvcc threads, not 6.
#
# Environment used when set: VLLM_TARGET_DEVICE, MAX_JOBS, NVCC_THREADS, CMAKE_ARGS,
# TORCH_CUDA_ARCH_LIST, CMAKE_{C,CXX,CUDA}_COMPILER_LAUNCHER (ccache or sccache: its
# statistics are printed before and after), PYTHON (default python3).
#
# Exit 0: OUTDIR holds vllm-VERSION[+local]-*.whl. Non-zero: the build or the version
# check failed (its output says which). Exit 2: bad usage.
set -eu

prog=build-vllm-wheel
if [ "$#" -ne 3 ]; then
    echo "usage: $0 SRC OUTDIR VERSION" >&2
    exit 2
fi
src=$1 out=$2 version=$3
here=$(cd "$(dirname "$0")" && pwd -P)
py=${PYTHON:-python3}
if [ ! -f "$src/setup.py" ]; then
    echo "$prog: $src has no setup.py" >&2
    exit 2
fi
launcher=${CMAKE_CXX_COMPILER_LAUNCHER:-}
stats() {
    if [ -n "$launcher" ] && command -v "$launcher" >/dev/null 2>&1; then
        "$launcher" --show-stats || true
    fi
}
mkdir -p "$out"
export SETUPTOOLS_SCM_PRETEND_VERSION="$version" SETUPTOOLS_SCM_PRETEND_VERSION_FOR_VLLM="$version"
jobs=${MAX_JOBS:-unset}
if [ -n "${MAX_JOBS:-}" ] && [ -n "${NVCC_THREADS:-}" ]; then
    MAX_JOBS=$((MAX_JOBS * NVCC_THREADS))
    export MAX_JOBS
fi
echo "$prog: building vLLM $version from $src (target device ${VLLM_TARGET_DEVICE:-auto}," \
     "$jobs compile jobs x NVCC_THREADS=${NVCC_THREADS:-unset}: setup.py gets" \
     "MAX_JOBS=${MAX_JOBS:-unset}, launcher ${launcher:-none})"
stats
# vLLM's docker/Dockerfile runs `setup.py bdist_wheel --py-limited-api=cp38`; pip wheel
# runs the same setup.py through PEP 517 (direct setup.py calls are deprecated). Its
# extensions are abi3 either way; only the wheel's file tag differs (cp312 here).
"$py" -m pip wheel --no-build-isolation --no-deps -w "$out" "$src"
stats
"$py" "$here/check-vllm-version.py" --expect "$version" --wheel "$out"
