#!/bin/sh
# fetch-vllm-source.sh REPOSITORY COMMIT DEST
#
# Fetch exactly one commit of a source repository into DEST (created if missing, must be
# empty), without branches or tags, and verify HEAD is COMMIT. Runs inside the gb10 engine
# build and in the GB10 rehearsal; POSIX sh + git only.
#
#   REPOSITORY  anything `git fetch` takes: https://github.com/vllm-project/vllm, a
#               file:// URL or a local path (the rehearsal serves a local repository)
#   COMMIT      the full 40-hex commit SHA (a branch or tag could move under us)
#   DEST        the directory that becomes the work tree
#
# Exit 0: DEST holds COMMIT checked out (detached). Exit 1: the fetch failed or HEAD is
# not COMMIT. Exit 2: bad usage (not a full SHA, DEST not empty).
#
# The version is NOT taken from git here: a SHA fetched alone carries no tag, so
# setuptools-scm would call the package 0.1.dev1+g<sha>. build-vllm-wheel.sh pins the
# version instead (SETUPTOOLS_SCM_PRETEND_VERSION_FOR_VLLM).
set -eu

prog=fetch-vllm-source
if [ "$#" -ne 3 ]; then
    echo "usage: $0 REPOSITORY COMMIT DEST" >&2
    exit 2
fi
repo=$1 commit=$2 dest=$3
case $commit in
    *[!0-9a-f]*|'') ok=no ;;
    *) if [ "${#commit}" -eq 40 ]; then ok=yes; else ok=no; fi ;;
esac
if [ "$ok" != yes ]; then
    echo "$prog: COMMIT must be a full 40-hex lowercase commit SHA, got '$commit'" >&2
    exit 2
fi
mkdir -p "$dest"
if [ -n "$(ls -A "$dest")" ]; then
    echo "$prog: $dest is not empty" >&2
    exit 2
fi
cd "$dest"
git init -q .
git remote add origin "$repo"
# --depth 1: only this commit's tree (vLLM's history is ~1 GB); servers that refuse a
# bare SHA in `want` (uploadpack.allowReachableSHA1InWant off) fail here, loudly.
if ! git -c protocol.version=2 fetch -q --depth 1 origin "$commit"; then
    echo "$prog: cannot fetch $commit from $repo (network, or the server refuses fetching a commit by SHA)" >&2
    exit 1
fi
git checkout -q --detach FETCH_HEAD
head=$(git rev-parse HEAD)
if [ "$head" != "$commit" ]; then
    echo "$prog: $repo gave $head for $commit" >&2
    exit 1
fi
echo "$prog: $repo at $commit"
