"""upload-artifact's semantics the workflows use: newline-separated globs (** included),
paths kept relative to the workspace, `if-no-files-found: error|warn|ignore`."""
import glob
import os
import shutil
import sys
from pathlib import Path

dest = Path(os.environ["IMAGEBUILD_REHEARSAL_ARTIFACTS"]) / os.environ["NAME"]
files = []
for pattern in filter(None, (p.strip() for p in os.environ["PATHS"].splitlines())):
    for hit in glob.glob(pattern, recursive=True):
        p = Path(hit)
        files += [f for f in p.rglob("*") if f.is_file()] if p.is_dir() else [p]
if not files:
    msg = f"upload-artifact (stand-in): no files for {os.environ['NAME']}"
    if os.environ.get("IF_NONE") == "error":
        sys.exit(f"error: {msg}")
    print(f"warning: {msg}")
shutil.rmtree(dest, ignore_errors=True)  # a re-run's upload replaces the artifact
dest.mkdir(parents=True, exist_ok=True)
# like actions/upload-artifact: paths relative to the least common ancestor of the files
root = Path(os.path.commonpath([str(f.parent.resolve()) for f in files])) if files else None
for f in files:
    target = dest / f.resolve().relative_to(root)  # type: ignore[arg-type]
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(f, target)
print(f"upload-artifact (stand-in): {len(files)} file(s) as {os.environ['NAME']}")
