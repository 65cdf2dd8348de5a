#!/bin/sh
# apply-patches.sh DIR PATCH...
# Apply an engine patch set in order, inside a Docker build: DIR is the vLLM source tree
# (gb10) or the site-packages dir holding vllm/ (cpu); patches use a/vllm/... paths (-p1).
# Each patch is checked before it is applied, so a patch that no longer fits stops the
# build with one line naming it instead of leaving a half-patched tree.
set -eu

prog=apply-patches
if [ "$#" -lt 1 ]; then
    echo "usage: $0 DIR [PATCH...]" >&2
    exit 2
fi
dir=$1
shift
if [ ! -d "$dir" ]; then
    echo "$prog: $dir is not a directory" >&2
    exit 2
fi

# Resolve patch paths before leaving the caller's directory.
for p in "$@"; do
    if [ ! -f "$p" ]; then
        echo "$prog: patch $p not found" >&2
        exit 2
    fi
done

if command -v git >/dev/null 2>&1; then
    # Inside an enclosing repository `git apply` silently skips paths outside the current
    # directory and reports success; stop repository discovery above DIR.
    GIT_CEILING_DIRECTORIES=$(cd "$dir/.." && pwd -P)
    export GIT_CEILING_DIRECTORIES
    tool=git
else
    tool=patch
fi

check() {
    if [ "$tool" = git ]; then
        git -C "$dir" apply --check -p1 "$1"
    else
        # --forward: an already-applied patch is an error, not a prompt to reverse it.
        (cd "$dir" && patch --dry-run --forward --batch -s -p1) < "$1"
    fi
}

apply() {
    if [ "$tool" = git ]; then
        git -C "$dir" apply -p1 "$1"
    else
        (cd "$dir" && patch --forward --batch -s -p1) < "$1"
    fi
}

for p in "$@"; do
    case $p in
        /*) abs=$p ;;
        *) abs=$(pwd -P)/$p ;;
    esac
    name=$(basename "$p")
    if ! out=$(check "$abs" 2>&1); then
        # One line: the most telling line of the tool's output, else its first line.
        reason=$(printf '%s\n' "$out" \
            | grep -m1 -E 'patch failed|does not exist|No such file|FAILED|can.t find|Reversed|already exists' \
            || printf '%s\n' "$out" | head -n1)
        echo "$prog: $name does not apply to $dir ($tool): $reason" >&2
        exit 1
    fi
    apply "$abs"
    echo "$prog: applied $name"
done
