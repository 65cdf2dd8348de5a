"""What is inside the running container: the locked files, no credentials, read-only."""

from __future__ import annotations

import json
import re

import pytest

from imagebuild.docker import engine
from imagebuild.expectations import SMALL_FILE

# Runs inside the container (its python3): size of every file, hashes of the small ones.
HASHER = f"""
import hashlib, json, os, sys
out = {{}}
for path in sys.argv[1:]:
    try:
        size = os.path.getsize(path)
    except OSError as exc:
        out[path] = {{"error": str(exc)}}
        continue
    rec = {{"size": size}}
    if size < {SMALL_FILE}:
        data = open(path, "rb").read()
        rec["sha256"] = hashlib.sha256(data).hexdigest()
        rec["git_blob"] = hashlib.sha1(b"blob %d\\0" % size + data).hexdigest()
    out[path] = rec
print(json.dumps(out))
"""
SECRET_NAME = re.compile(r"TOKEN|PASSWORD|PASSWD|SECRET|API_KEY|ACCESS_KEY|CREDENTIAL", re.I)


def test_served_files_match_the_lock(smoke, expect, record_property):
    want = expect.get("files")
    if want is None:
        pytest.skip("no file list for this cell in matrix.lock.json (run `build.py lock`)")
    code, out = engine().exec(smoke["container"], ["python3", "-c", HASHER, *sorted(want)])
    assert code == 0, f"hashing inside the container failed: {out[-500:]}"
    got = json.loads(out)
    record_property("files", len(want))
    record_property("hashed", sum("sha256" in w or "git_blob" in w for w in want.values()))
    bad = []
    for path, w in sorted(want.items()):
        g = got.get(path, {})
        if "error" in g:
            bad.append(f"{path}: {g['error']}")
            continue
        for key in ("size", "sha256", "git_blob"):
            if key in w and g.get(key) != w[key]:
                bad.append(f"{path}: {key} {g.get(key)} in the container, {w[key]} in the lock")
    assert not bad, f"{len(bad)} served file(s) differ from the lock:\n" + "\n".join(bad[:20])


def test_no_credentials_in_the_environment(smoke):
    env = engine().container_env(smoke["container"])
    names = [e.split("=", 1)[0] for e in env]
    leaked = [n for n in names if SECRET_NAME.search(n)]
    assert not leaked, f"credential-like variables in the container environment: {leaked}"


def test_model_is_read_only(smoke):
    code, out = engine().exec(smoke["container"],
                              ["python3", "-c", "open('/model/.smoke-write-probe', 'w')"])
    assert code != 0, "the container could write into /model"
    assert "Read-only file system" in out or "Permission denied" in out, out[-300:]
