#!/usr/bin/env bash
# Start a local distribution registry (Debian's docker-registry) with htpasswd auth on
# 127.0.0.1, for .ci/run and the README's main command. Idempotent: a registry already
# answering on the port with these credentials is left alone.
#
#   scripts/start-registry.sh [--port 5000] [--dir DIR] [--user U --password P] [--stop]
#
# Credentials default to IMAGEBUILD_REGISTRY_USER / IMAGEBUILD_REGISTRY_PASSWORD, then to
# local-only defaults. The password never appears on a command line (htpasswd -i reads
# stdin; curl reads a netrc-style config on stdin), so `ps` does not show it.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
port=5000
dir="${repo_root}/.cache/registry"
user="${IMAGEBUILD_REGISTRY_USER:-imagebuild}"
password="${IMAGEBUILD_REGISTRY_PASSWORD:-imagebuild-local}"
stop=0

die() { echo "start-registry: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
  case "$1" in
    --port) port="${2:?--port needs a value}"; shift 2 ;;
    --dir) dir="${2:?--dir needs a value}"; shift 2 ;;
    --user) user="${2:?--user needs a value}"; shift 2 ;;
    --password) password="${2:?--password needs a value}"; shift 2 ;;
    --stop) stop=1; shift ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "start-registry: unknown argument: $1" >&2; exit 2 ;;
  esac
done
case "$port" in ''|*[!0-9]*) echo "start-registry: --port must be a number" >&2; exit 2 ;; esac

url="http://127.0.0.1:${port}"
pidfile="${dir}/registry.pid"

# HTTP status of GET /v2/ (000 when nothing answers); never through a proxy.
v2_status() {
  if [ "${1:-}" = "--auth" ]; then
    # user:password goes to curl on stdin (-K -), not on its command line
    printf 'user = "%s:%s"\n' "$user" "$password" | \
      curl -s -o /dev/null -w '%{http_code}' --noproxy '*' -m 2 -K - "${url}/v2/" || true
    return
  fi
  curl -s -o /dev/null -w '%{http_code}' --noproxy '*' -m 2 "${url}/v2/" || true
}

if [ "$stop" = 1 ]; then
  if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    kill "$(cat "$pidfile")"
    echo "start-registry: stopped registry pid $(cat "$pidfile")"
  fi
  rm -f "$pidfile"
  exit 0
fi

command -v docker-registry >/dev/null || die "docker-registry not found (apt-get install docker-registry)"
command -v htpasswd >/dev/null || die "htpasswd not found (apt-get install apache2-utils)"

status="$(v2_status)"
if [ "$status" = 401 ]; then
  [ "$(v2_status --auth)" = 200 ] || \
    die "a registry already runs on ${url} but rejects these credentials (IMAGEBUILD_REGISTRY_USER/IMAGEBUILD_REGISTRY_PASSWORD); stop it with --stop or pick another --port"
  echo "$url"
  exit 0
elif [ "$status" != 000 ]; then
  die "port ${port} answers /v2/ with HTTP ${status}: not an htpasswd-protected registry; pick another --port"
fi

mkdir -p "${dir}/data"
chmod 700 "$dir"
printf '%s' "$password" | htpasswd -Bin "$user" > "${dir}/htpasswd" 2>/dev/null
# A random HTTP secret keeps upload state unforgeable; it only needs to be stable per run.
secret="$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
cat > "${dir}/config.yml" <<EOF
version: 0.1
log:
  level: info
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: ${dir}/data
  delete:
    enabled: true
  cache:
    blobdescriptor: inmemory
http:
  addr: 127.0.0.1:${port}
  secret: ${secret}
  headers:
    X-Content-Type-Options: [nosniff]
auth:
  htpasswd:
    realm: imagebuild-registry
    path: ${dir}/htpasswd
EOF

setsid docker-registry serve "${dir}/config.yml" > "${dir}/registry.log" 2>&1 < /dev/null &
echo $! > "$pidfile"

for _ in $(seq 1 100); do
  [ "$(v2_status)" = 401 ] && { echo "$url"; exit 0; }
  kill -0 "$(cat "$pidfile")" 2>/dev/null || {
    tail -n 20 "${dir}/registry.log" >&2
    die "registry exited at start (log: ${dir}/registry.log)"
  }
  sleep 0.1
done
die "registry did not answer ${url}/v2/ within 10 s (log: ${dir}/registry.log)"
