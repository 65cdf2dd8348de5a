#!/bin/sh
# ensure-serve-user.sh [--check] UID NAME HOME
#
# Make NAME the user with UID (and a group NAME with GID UID when that GID is free or is
# the user's own group), with HOME as its home and HOME/.cache owned by it. Idempotent.
#
# Why not a plain `useradd --uid 1000`: Ubuntu 24.04 images (every
# nvcr.io/nvidia/cuda:*-ubuntu24.04) already ship the user `ubuntu` with UID 1000, and
# useradd then exits "UID 1000 is not unique". That user is renamed (with its group and
# home) instead; the debootstrapped cpu base has no UID 1000 and gets a new user.
#
# --check: change nothing; say what would be done and fail (exit 1) when it cannot be
# done (NAME taken by another UID, UID's primary group taken by someone else, the shadow
# tools missing). The gb10 engine runs this before its long compile.
#
# Exit 0: done (or, with --check, doable). Exit 1: not possible (the reason is printed).
# Exit 2: bad usage. Needs root and the shadow tools (useradd, usermod, groupmod).
set -eu

prog=ensure-serve-user
check=no
if [ "${1:-}" = --check ]; then
    check=yes
    shift
fi
if [ "$#" -ne 3 ]; then
    echo "usage: $0 [--check] UID NAME HOME" >&2
    exit 2
fi
uid=$1 name=$2 home=$3
case $uid in *[!0-9]*|'') echo "$prog: UID must be a number, got '$uid'" >&2; exit 2 ;; esac
for tool in getent useradd usermod groupmod; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "$prog: $tool is missing; fix: install the passwd package in the image" >&2
        exit 1
    fi
done

fail() {
    echo "$prog: $*" >&2
    exit 1
}

by_uid=$(getent passwd "$uid" | cut -d: -f1 || true)
by_name_uid=$(getent passwd "$name" | cut -d: -f3 || true)
if [ -n "$by_name_uid" ] && [ "$by_name_uid" != "$uid" ]; then
    fail "user $name exists with UID $by_name_uid, not $uid; fix: serve as UID $by_name_uid" \
         "or remove that user from the base image"
fi
group_of_gid=$(getent group "$uid" | cut -d: -f1 || true)
group_by_name_gid=$(getent group "$name" | cut -d: -f3 || true)

if [ -n "$by_uid" ]; then
    primary_gid=$(getent passwd "$uid" | cut -d: -f4)
    primary=$(getent group "$primary_gid" | cut -d: -f1 || true)
    plan="reuse $by_uid (UID $uid)"
    [ "$by_uid" != "$name" ] && plan="rename user $by_uid (UID $uid) to $name"
    if [ "$primary" != "$name" ] && [ "$primary_gid" = "$uid" ]; then
        if [ -n "$group_by_name_gid" ]; then
            fail "group $name exists with GID $group_by_name_gid; cannot rename $primary to it"
        fi
        plan="$plan, rename group $primary to $name"
    fi
else
    if [ -n "$group_of_gid" ] && [ "$group_of_gid" != "$name" ]; then
        fail "GID $uid belongs to group $group_of_gid with no user $uid; fix: remove it from" \
             "the base image or serve as another UID"
    fi
    plan="create user $name (UID $uid, group GID $uid)"
fi
plan="$plan, home $home"
if [ "$check" = yes ]; then
    echo "$prog: can $plan"
    exit 0
fi

if [ -n "$by_uid" ]; then
    if [ "$by_uid" != "$name" ]; then
        old_home=$(getent passwd "$uid" | cut -d: -f6)
        usermod --login "$name" "$by_uid"
        if [ -d "$old_home" ] && [ "$old_home" != "$home" ]; then
            usermod --home "$home" --move-home "$name"
        else
            usermod --home "$home" "$name"
        fi
    elif [ "$(getent passwd "$uid" | cut -d: -f6)" != "$home" ]; then
        usermod --home "$home" --move-home "$name"
    fi
    primary_gid=$(getent passwd "$uid" | cut -d: -f4)
    primary=$(getent group "$primary_gid" | cut -d: -f1 || true)
    if [ "$primary_gid" = "$uid" ] && [ "$primary" != "$name" ]; then
        groupmod --new-name "$name" "$primary"
    fi
elif [ -n "$group_of_gid" ]; then
    useradd --uid "$uid" --gid "$uid" --create-home --home-dir "$home" "$name"
else
    useradd --uid "$uid" --user-group --create-home --home-dir "$home" "$name"
fi
gid=$(getent passwd "$uid" | cut -d: -f4)
mkdir -p "$home/.cache"
chown -R "$uid:$gid" "$home"
echo "$prog: $plan: $(getent passwd "$uid")"
