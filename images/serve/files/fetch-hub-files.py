#!/usr/bin/env python3
"""Download pinned Hub files into an image layer and verify them against the lock.

Runs inside `docker build` (stdlib only). The manifest is written by build.py from
matrix.lock.json: repository, the full commit SHA, and every file's size and LFS sha256
(or git blob id). The HF token arrives as a BuildKit secret, never as an arg or layer,
and goes only to the Hub endpoint's own origin (scheme, host, port): the Hub redirects
weight files to a CDN on another host, which must never see it.
Usage: fetch-hub-files.py --manifest M.json --dest /model [--token-file F] FILE...
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


def _token(path: str = TOKEN_FILE) -> str | None:
    try:
        with open(path) as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), parts.port or default


class OriginAuth(urllib.request.HTTPRedirectHandler):
    """Carry the token across redirects within its origin only. urllib copies headers
    set with add_header to every redirect target, so the token is an unredirected header
    and is put back here only when the target has the same scheme, host and port."""

    def __init__(self, token: str | None, allowed: tuple[str, str, int | None]):
        self.token, self.allowed = token, allowed

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: N802 (urllib's)
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and self.token and origin(new.full_url) == self.allowed:
            new.add_unredirected_header("Authorization", f"Bearer {self.token}")
        return new


def _fetch(url: str, part: str, token: str | None, entry: dict) -> None:
    req = urllib.request.Request(url)
    if token:
        req.add_unredirected_header("Authorization", f"Bearer {token}")
    opener = urllib.request.build_opener(OriginAuth(token, origin(url)))
    sha256, blob = hashlib.sha256(), hashlib.sha1()
    blob.update(f"blob {entry['size']}\0".encode())
    size = 0
    with opener.open(req, timeout=60) as resp, open(part, "wb") as out:
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
    ap.add_argument("--token-file", default=TOKEN_FILE,
                    help=f"the Hub token (default: the BuildKit secret {TOKEN_FILE})")
    ap.add_argument("files", nargs="+")
    args = ap.parse_args(argv)
    with open(args.manifest) as fh:
        manifest = json.load(fh)
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    repo, rev = manifest["repository"], manifest["revision"]
    listed = {f["path"]: f for f in manifest["files"]}
    token = _token(args.token_file)
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
