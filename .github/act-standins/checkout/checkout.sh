#!/usr/bin/env bash
# actions/checkout's behaviour that the workflows rely on: a clean workspace at exactly the
# ref asked for (default: the event's sha); fetch-depth 0 brings every branch as
# refs/remotes/origin/* and every tag, a depth N only that commit's history.
set -euo pipefail
origin=${IMAGEBUILD_REHEARSAL_ORIGIN:?the rehearsal sets IMAGEBUILD_REHEARSAL_ORIGIN}
ref=${REF:-$GITHUB_SHA}
cd "$GITHUB_WORKSPACE"
find . -mindepth 1 -maxdepth 1 -exec rm -rf {} +
git init -q .
git remote add origin "$origin"
if [ "${DEPTH:-1}" = 0 ]; then
  git fetch -q --tags origin '+refs/heads/*:refs/remotes/origin/*'
else
  depth=(--depth "$DEPTH")
  case $ref in
    refs/tags/*) git fetch -q "${depth[@]}" origin "+$ref:$ref" ;;
    refs/heads/*) git fetch -q "${depth[@]}" origin "+$ref:refs/remotes/origin/${ref#refs/heads/}" ;;
    *) git fetch -q "${depth[@]}" origin "$ref" ;;
  esac
fi
case $ref in
  refs/heads/*) git checkout -q --detach "refs/remotes/origin/${ref#refs/heads/}" ;;
  *) git checkout -q --detach "$( { git rev-parse -q --verify "$ref^{commit}" || git rev-parse FETCH_HEAD; } )" ;;
esac
echo "checkout (stand-in): $ref at $(git rev-parse HEAD)"
