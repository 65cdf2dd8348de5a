"""actions/download-artifact v6.0.0 (018cc2cf5baa6db3ef3c5f8a56943fffe632ef53) as the
rehearsal stands it in: src/download-artifact.ts run() over ../lib/artifact_store.py.
`name`: that artifact (the newest of the name) into `path`, or "Unable to download
artifact(s): Artifact not found for name: NAME"; otherwise every artifact of the run
(latest of each name) matching `pattern` (minimatch), each into `path/<name>/` unless
`merge-multiple` or only one matched (then into `path`); none matching is no error.
`path` defaults to $GITHUB_WORKSPACE; output download-path."""
import fnmatch
import os
import shutil
import sys
from pathlib import Path

# act runs a copy of this action's folder alone: lib/ is found through the
# rehearsal's IMAGEBUILD_REHEARSAL_STANDINS (beside this file in a checkout)
sys.path.insert(0, str(Path(os.environ.get("IMAGEBUILD_REHEARSAL_STANDINS")
                             or Path(__file__).resolve().parent.parent) / "lib"))
import artifact_store  # noqa: E402


def main() -> int:
    name, pattern = os.environ.get("NAME", ""), os.environ.get("PATTERN", "")
    ws = os.environ.get("GITHUB_WORKSPACE") or os.getcwd()
    dest = Path(os.path.expanduser(os.environ.get("DEST") or ws))
    if not dest.is_absolute():
        dest = Path(ws) / dest
    arts = {m["name"]: m for m in artifact_store.listed()}  # latest: highest id per name
    if name:
        if name not in arts:
            print(f"::error::Unable to download artifact(s): Artifact not found for name: {name}")
            return 1
        chosen = [name]
    else:
        chosen = [n for n in sorted(arts) if not pattern or fnmatch.fnmatchcase(n, pattern)]
    merge = os.environ.get("MERGE") == "true"
    for art in chosen:
        into = dest if (name or merge or len(chosen) == 1) else dest / art
        shutil.copytree(artifact_store.store() / art, into, dirs_exist_ok=True)
        print(f"download-artifact (stand-in): {art} (ID {arts[art]['id']}) -> {into}")
    print(f"Total of {len(chosen)} artifact(s) downloaded")
    with open(os.environ.get("GITHUB_OUTPUT", os.devnull), "a") as fh:
        fh.write(f"download-path={dest}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
