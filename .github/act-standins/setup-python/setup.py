"""actions/setup-python v6.0.0 (e797f83bcb11b83ae66e0230d6156d7c80228e7c) as the rehearsal
stands it in, nothing downloaded: the version asked (`python-version`, else
`python-version-file`, else .python-version: setup-python.ts resolveVersionInput) must be
an interpreter already on this machine (python3.X on PATH, or python3 of that version),
as find-python.ts finds one in the tool cache; none: "The version 'X' with architecture
'x64' was not found for this operating system." Found: its directory goes first on PATH
(core.addPath), pythonLocation is exported, outputs python-version and python-path."""
import os
import shutil
import subprocess
import sys
from pathlib import Path


def version_asked(ws: Path) -> str:
    asked = os.environ.get("VERSION", "").strip()
    if asked:
        return asked.splitlines()[0].strip()
    f = os.environ.get("VERSION_FILE") or ".python-version"
    p = ws / f
    if p.is_file():
        return p.read_text().split()[0]
    return ""


def find(version: str) -> str | None:
    for exe in (f"python{version}", "python3"):
        path = shutil.which(exe)
        if not path:
            continue
        got = subprocess.run([path, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
                             capture_output=True, text=True).stdout.strip()
        if got == version or got.startswith(version + "."):
            return path
    return None


def main() -> int:
    ws = Path(os.environ.get("GITHUB_WORKSPACE") or ".")
    version = version_asked(ws)
    if not version:  # no version anywhere: the runner's python on PATH (setup-python warns)
        print("::warning::The `python-version` input is not set. The version of Python "
              "currently in `PATH` will be used.")
        return 0
    path = find(version)
    if path is None:
        print(f"::error::The version '{version}' with architecture 'x64' was not found for "
              "this operating system.")
        return 1
    exe = Path(path)
    bindir = exe.parent
    # a venv's python is a symlink: pythonLocation is the interpreter's prefix, as in the
    # tool cache, while PATH gets the directory holding `python` for this version
    link = Path(os.environ.get("RUNNER_TEMP") or "/tmp") / f"setup-python-{version}"
    link.mkdir(parents=True, exist_ok=True)
    for n in ("python", "python3", f"python{version}"):
        (link / n).unlink(missing_ok=True)
        (link / n).symlink_to(exe)
    with open(os.environ["GITHUB_PATH"], "a") as fh:
        fh.write(f"{link}\n")
    with open(os.environ["GITHUB_ENV"], "a") as fh:
        fh.write(f"pythonLocation={bindir.parent}\n")
    got = subprocess.run([path, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
                         capture_output=True, text=True).stdout.strip()
    with open(os.environ.get("GITHUB_OUTPUT", os.devnull), "a") as fh:
        fh.write(f"python-version={got}\npython-path={link / 'python'}\n")
    print(f"setup-python (stand-in): Python {got} at {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
