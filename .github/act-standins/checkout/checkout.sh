#!/usr/bin/env bash
# actions/checkout v5.0.0 (08c6903cd8c0fde910a37f88322edcfb5dd907a8) as the rehearsal
# stands it in, from the rehearsal's local origin: a clean workspace at exactly the ref
# asked for (default: the event's sha); fetch-depth 0 brings every branch as
# refs/remotes/origin/* and every tag (src/git-source-provider.ts), a depth N only that
# commit's history and no tags unless fetch-tags; persist-credentials (default true)
# leaves the token in the checkout's git config as `http.https://github.com/.extraheader`
# (src/git-auth-helper.ts:56-63), where any later step can read it; outputs ref, commit.
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
  depth=(--depth "${DEPTH:-1}")
  if [ "${FETCH_TAGS:-false}" = true ]; then depth+=(--tags); fi
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
if [ "${PERSIST:-true}" = true ]; then
  basic=$(printf 'x-access-token:%s' "${TOKEN:-}" | base64 -w0)
  git config --local http.https://github.com/.extraheader "AUTHORIZATION: basic $basic"
fi
commit=$(git rev-parse HEAD)
printf 'ref=%s\ncommit=%s\n' "$ref" "$commit" >> "${GITHUB_OUTPUT:-/dev/null}"
echo "checkout (stand-in): $ref at $commit"
