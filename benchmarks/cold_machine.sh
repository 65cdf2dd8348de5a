#!/usr/bin/env bash
# Time the README's main command on this machine made as cold as a fresh one, then put the
# machine back as it was. DESTRUCTIVE while it runs (needs root and --yes):
#   - stops the Docker engine and the registry on 127.0.0.1:5000, moves Docker's data root
#     (image store, BuildKit cache), the host pip cache and ~/.docker aside;
#   - removes what scripts/setup.sh installs (docker.io, docker-registry, mmdebstrap,
#     apache2-utils, docker-compose, with the packages only they pulled in), so set-up
#     installs them again from the package registry as on a fresh machine. Removed, never
#     purged: purging docker.io deletes everything under /var/lib/docker, the moved-aside
#     store included;
#   - runs benchmarks/time_fresh_clone.py (a fresh clone, its own empty registry), then
#     stops that engine, deletes its data and restores everything moved aside.
#
#   flock /tmp/imagebuild-heavy.lock bash benchmarks/cold_machine.sh --yes [--json FILE]
#
# What stays warm and cannot be made cold here: the host's apt lists and Python itself.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
[ "${1:-}" = "--yes" ] || { sed -n '2,13p' "$0"; echo "cold_machine: pass --yes" >&2; exit 2; }
shift
json="${repo}/.cache/cold-machine.json"
[ "${1:-}" = "--json" ] && json="${2:?--json needs a file}"
[ "$(id -u)" -eq 0 ] || { echo "cold_machine: needs root" >&2; exit 2; }
if docker ps -q 2>/dev/null | grep -q .; then
  echo "cold_machine: containers are running; stop them first" >&2; exit 1
fi
stamp=$(date +%s)
aside="/var/tmp/cold-machine-${stamp}"
warm="/var/lib/docker/.warm-${stamp}"
mkdir -p "$aside"
log() { printf '[cold] %s\n' "$*"; }

stop_engine() {
  pkill -x dockerd 2>/dev/null || true
  for _ in $(seq 1 60); do pgrep -x dockerd >/dev/null || break; sleep 0.5; done
  pkill -x containerd 2>/dev/null || true
}

restore() {
  log "restoring the machine"
  if [ -n "${work:-}" ] && [ -d "${work}/fresh" ]; then
    bash "${work}/fresh/scripts/start-registry.sh" --stop || true
    cp "${work}/run.log" "${json%.json}.log" 2>/dev/null || true
    rm -rf "$work"
  fi
  stop_engine
  if [ -d "$warm" ]; then
    find /var/lib/docker -mindepth 1 -maxdepth 1 ! -path "$warm" -exec rm -rf {} +
    find "$warm" -mindepth 1 -maxdepth 1 -exec mv {} /var/lib/docker/ \;
    rmdir "$warm"
  fi
  [ -d "${aside}/pip" ] && { rm -rf /root/.cache/pip; mv "${aside}/pip" /root/.cache/pip; }
  [ -d "${aside}/dotdocker" ] && { rm -rf /root/.docker; mv "${aside}/dotdocker" /root/.docker; }
  rm -rf "$aside"
  bash scripts/setup.sh >/dev/null && log "engine, registry and login back"
}
trap restore EXIT

log "stopping the registry on 127.0.0.1:5000 and the Docker engine"
bash scripts/start-registry.sh --stop || true
stop_engine
# Docker's data root may be a mount point (it is here): its contents move into a hidden
# folder inside it, which the engine ignores
mkdir "$warm"
find /var/lib/docker -mindepth 1 -maxdepth 1 ! -path "$warm" -exec mv {} "$warm"/ \;
[ -d /root/.cache/pip ] && mv /root/.cache/pip "${aside}/pip"
[ -d /root/.docker ] && mv /root/.docker "${aside}/dotdocker"
log "removing what set-up installs"
DEBIAN_FRONTEND=noninteractive apt-get remove --autoremove -y -qq docker.io docker-registry \
  debootstrap mmdebstrap apache2-utils docker-compose >/dev/null

log "timing the README's main command from a fresh clone"
work=$(mktemp -d /var/tmp/imagebuild-cold-XXXX)
code=0
# the clone must run set-up as a fresh machine does: no venv of this checkout on PATH
env -u VIRTUAL_ENV python3 benchmarks/time_fresh_clone.py --source "$repo" --json "$json" --keep --cold \
  --workdir "$work" || code=$?
log "figures: $json"
exit "$code"
