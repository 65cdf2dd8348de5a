#!/usr/bin/env python3
"""Download pinned Hub files into an image layer and verify them against the lock.

Runs inside `docker build` (stdlib only). The manifest is written by build.py from
matrix.lock.json: repository, the full commit SHA, and every file's size and LFS sha256
(or git blob id). The HF token arrives as a BuildKit secret, never as an arg or layer.
Usage: fetch-hub-files.py --manifest M.json --dest /model FILE...
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

TOKEN_FILE = "/run/secrets/hf_token"
CHUNK = 8 * 2**20


def _token() -> str | None:
    try:
        with open(TOKEN_FILE) as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def _fetch(url: str, part: str, token: str | None, entry: dict) -> None:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    sha256, blob = hashlib.sha256(), hashlib.sha1()
    blob.update(f"blob {entry['size']}\0".encode())
    size = 0
    with urllib.request.urlopen(req, timeout=60) as resp, open(part, "wb") as out:
        while chunk := resp.read(CHUNK):
            out.write(chunk)
            sha256.update(chunk)
            blob.update(chunk)
            size += len(chunk)
    if size != entry["size"]:
        raise ValueError(f"size {size} != locked {entry['size']}")
    if entry.get("lfs_sha256") and sha256.hexdigest() != entry["lfs_sha256"]:
        raise ValueError(f"sha256 {sha256.hexdigest()} != locked {entry['lfs_sha256']}")
    git_blob = not entry.get("lfs_sha256") and entry.get("blob_id")
    if git_blob and blob.hexdigest() != entry["blob_id"]:
        raise ValueError(f"git blob {blob.hexdigest()} != locked {entry['blob_id']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--manifest", required=True)
    ap.add_argument("--dest", required=True)
    ap.add_argument("files", nargs="+")
    args = ap.parse_args(argv)
    with open(args.manifest) as fh:
        manifest = json.load(fh)
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    repo, rev = manifest["repository"], manifest["revision"]
    listed = {f["path"]: f for f in manifest["files"]}
    token = _token()
    for name in args.files:
        entry = listed.get(name)
        if entry is None:
            print(f"error: {name} is not in the locked file list of {repo}@{rev}",
                  file=sys.stderr)
            return 1
        dest = os.path.join(args.dest, name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        url = f"{endpoint}/{repo}/resolve/{rev}/{urllib.parse.quote(name)}"
        for attempt in range(1, 5):
            try:
                _fetch(url, dest + ".part", token, entry)
                os.replace(dest + ".part", dest)
                print(f"fetched {repo}@{rev[:12]}:{name} ({entry['size']} bytes, verified)")
                break
            except (urllib.error.URLError, OSError, ValueError) as exc:
                if attempt == 4 or isinstance(exc, urllib.error.HTTPError) and exc.code in (
                        401, 403, 404):
                    print(f"error: {name}: {exc}", file=sys.stderr)
                    return 1
                time.sleep(2 ** attempt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
