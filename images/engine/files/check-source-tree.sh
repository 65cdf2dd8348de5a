#!/bin/sh
# check-source-tree.sh DIR PATH...
#
# Fail fast when the source tree lacks a file the recipe uses: every PATH (relative to
# DIR) must exist after the patch series is applied. Runs in the gb10 engine build right
# after apply-patches.sh, seconds after the fetch and long before the compile; the
# conformance tests run the same list against the pinned vLLM sdist.
#
# Exit 0: all present. Exit 1: some missing (each named, with the fix). Exit 2: usage.
set -eu

prog=check-source-tree
if [ "$#" -lt 2 ]; then
    echo "usage: $0 DIR PATH..." >&2
    exit 2
fi
dir=$1
shift
if [ ! -d "$dir" ]; then
    echo "$prog: $dir is not a directory" >&2
    exit 2
fi
missing=0
for p in "$@"; do
    if [ ! -e "$dir/$p" ]; then
        echo "$prog: $dir/$p does not exist" >&2
        missing=$((missing + 1))
    fi
done
if [ "$missing" -gt 0 ]; then
    echo "$prog: $missing path(s) the recipe uses are missing from this vLLM source;" \
         "fix: update images/engine/Dockerfile.j2 (and render.VLLM_SOURCE_PATHS) for this" \
         "vLLM version, as its own docker/Dockerfile does" >&2
    exit 1
fi
echo "$prog: all $# path(s) present in $dir"
