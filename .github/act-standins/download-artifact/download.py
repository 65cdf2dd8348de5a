"""download-artifact's semantics the workflows use: one `name` into `path`, or every
artifact matching `pattern`, into `path/<name>/` unless `merge-multiple`."""
import fnmatch
import os
import shutil
import sys
from pathlib import Path

store = Path(os.environ["IMAGEBUILD_REHEARSAL_ARTIFACTS"])
name, pattern = os.environ.get("NAME", ""), os.environ.get("PATTERN", "")
dest = Path(os.environ.get("DEST") or ".")
have = sorted(p.name for p in store.iterdir()) if store.is_dir() else []
if name:
    if name not in have:
        sys.exit(f"error: download-artifact (stand-in): no artifact {name!r} in this run")
    shutil.copytree(store / name, dest, dirs_exist_ok=True)
    print(f"download-artifact (stand-in): {name} -> {dest}")
    sys.exit(0)
merge = os.environ.get("MERGE") == "true"
for art in have:
    if fnmatch.fnmatchcase(art, pattern or "*"):
        shutil.copytree(store / art, dest if merge else dest / art, dirs_exist_ok=True)
        print(f"download-artifact (stand-in): {art} -> {dest}")
