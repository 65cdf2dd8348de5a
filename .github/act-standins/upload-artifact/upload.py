"""actions/upload-artifact v5.0.0 (330a01c490aca151604b8cf639adc76d48f6c5d4) as the
rehearsal stands it in: src/upload/upload-artifact.ts run() and src/shared/search.ts
findFilesToUpload, into ../lib/artifact_store.py (README.md lists the rules)."""
import glob
import os
import sys
from pathlib import Path

# act runs a copy of this action's folder alone: lib/ is found through the
# rehearsal's IMAGEBUILD_REHEARSAL_STANDINS (beside this file in a checkout)
sys.path.insert(0, str(Path(os.environ.get("IMAGEBUILD_REHEARSAL_STANDINS")
                             or Path(__file__).resolve().parent.parent) / "lib"))
import artifact_store  # noqa: E402


def search_path(pattern: str) -> str:
    """@actions/glob getSearchPaths: the pattern up to its first segment with a glob."""
    parts = Path(pattern).parts
    keep = []
    for part in parts:
        if any(c in part for c in "*?[{"):
            break
        keep.append(part)
    return str(Path(*keep)) if keep else "."


def hidden(path: Path, root: Path) -> bool:
    rel = path.relative_to(root) if path.is_relative_to(root) else path
    return any(p.startswith(".") for p in rel.parts)


def main() -> int:
    name = os.environ.get("NAME") or "artifact"
    patterns = [p.strip() for p in os.environ["PATHS"].splitlines() if p.strip()]
    include_hidden = os.environ.get("INCLUDE_HIDDEN") == "true"
    ws = Path(os.environ.get("GITHUB_WORKSPACE") or ".").resolve()
    files, searches = [], []
    for pattern in patterns:
        full = pattern if os.path.isabs(pattern) else str(ws / pattern)
        searches.append(Path(search_path(full)).resolve())
        for hit in sorted(glob.glob(full, recursive=True)):
            p = Path(hit).resolve()
            found = [f for f in p.rglob("*") if f.is_file()] if p.is_dir() else [p]
            files += [f for f in found if include_hidden or not hidden(f, ws)]
    files = list(dict.fromkeys(files))
    search_text = "\n".join(patterns)
    if not files:
        msg = (f"No files were found with the provided path: {search_text}. No artifacts "
               "will be uploaded.")
        mode = os.environ.get("IF_NONE") or "warn"
        if mode == "error":
            print(f"::error::{msg}")
            return 1
        print(f"::warning::{msg}" if mode == "warn" else msg)
        return 0
    if len(searches) > 1:
        root = Path(os.path.commonpath([str(s) for s in searches]))
    elif len(files) == 1 and searches[0] == files[0]:
        root = files[0].parent
    else:
        root = searches[0]
    if os.environ.get("OVERWRITE") == "true":
        artifact_store.delete(name)
    try:
        rec = artifact_store.create(name, [(f, str(f.relative_to(root))) for f in files])
    except artifact_store.ArtifactError as exc:
        print(f"::error::{exc}")
        return 1
    with open(os.environ.get("GITHUB_OUTPUT", os.devnull), "a") as fh:
        fh.write(f"artifact-id={rec['id']}\n")
    print(f"Artifact {name} has been successfully uploaded! (stand-in: {len(files)} file(s)) "
          f"Artifact ID is {rec['id']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
