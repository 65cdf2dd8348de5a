#!/bin/sh
# fetch-git-commit.sh REPOSITORY COMMIT DEST [all | SUBMODULE_PATH...]
#
# One git source of vLLM's CMake (FetchContent: CUTLASS, vllm-flash-attn, DeepGEMM, ...),
# fetched by its locked commit with fetch-vllm-source.sh (looked up next to this script:
# one commit, HEAD checked), then its submodules as FetchContent would initialize them:
# `all` (FetchContent's default: every submodule, recursively) or the listed paths (with
# theirs). Each submodule is checked out at the commit the fetched tree records for it;
# nothing a branch or tag says is used. Runs in the gb10 engine's source stage; POSIX sh
# + git only.
#
# Exit 0: DEST holds COMMIT and its submodules. Exit 1: a fetch failed, or HEAD or a
# submodule is not at its recorded commit. Exit 2: bad usage (see fetch-vllm-source.sh).
set -eu

prog=fetch-git-commit
if [ "$#" -lt 3 ]; then
    echo "usage: $0 REPOSITORY COMMIT DEST [all | SUBMODULE_PATH...]" >&2
    exit 2
fi
repo=$1 commit=$2 dest=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd -P)
case $commit in
    unresolved:*)
        echo "$prog: the lock pins no commit for $repo ${commit#unresolved:} (a tag): run" \
             "\`python build.py lock --update TARGET\` where GitHub is reachable, and commit" \
             "the lock" >&2
        exit 2 ;;
esac
sh "$here/fetch-vllm-source.sh" "$repo" "$commit" "$dest"
[ "$#" -eq 0 ] && exit 0
cd "$dest"
if [ "$1" = all ]; then
    [ -f .gitmodules ] || exit 0
    git -c protocol.version=2 submodule update -q --init --recursive --depth 1 \
        || { echo "$prog: cannot fetch the submodules of $repo at $commit" >&2; exit 1; }
    status=$(git submodule status --recursive)
else
    git -c protocol.version=2 submodule update -q --init --recursive --depth 1 -- "$@" \
        || { echo "$prog: cannot fetch submodule(s) $* of $repo at $commit" >&2; exit 1; }
    status=$(git submodule status --recursive -- "$@")
fi
# A leading '-' is an uninitialized submodule, '+' one not at the recorded commit, 'U' a
# conflict: only ' ' is the tree's own pin.
bad=$(printf '%s\n' "$status" | grep -v '^ ' | grep -v '^$' || true)
if [ -n "$bad" ]; then
    echo "$prog: submodules of $repo at $commit are not at their recorded commits:" >&2
    printf '%s\n' "$bad" >&2
    exit 1
fi
printf '%s\n' "$status" | while read -r sub path _; do
    # `[ -z ] ||`, not `[ -n ] &&`: an empty status (a .gitmodules listing nothing) must not
    # end the loop, and under set -e the script, with status 1
    [ -z "$path" ] || echo "$prog:   submodule $path at $sub"
done
exit 0
