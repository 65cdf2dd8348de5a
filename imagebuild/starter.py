"""`build.py init [DIR]`: a project folder started from the example matrix the package
carries (installed, imagebuild reads no matrix the user did not give it: spec/matrix.py).

The folder gets what a checkout keeps beside its matrix and the matrix names: matrix.yaml,
its lock and locked metadata, the schema its modeline names, every patch, requirements
file and generator script of the matrix, and the rendered files, so `render --check` and
`lock --check` agree with it from the start. Nothing is overwritten: a folder already
holding one of these files is refused before anything is written (exit 2)."""

from __future__ import annotations

import shutil
from pathlib import Path

from imagebuild import REPO_ROOT
from imagebuild.errors import UserError
from imagebuild.lock.lockfile import LOCK_NAME, read_lock
from imagebuild.render import render_all, write
from imagebuild.spec import matrix as mx

SCHEMA_FILE = "docs/matrix.schema.json"  # the example's `yaml-language-server` modeline


def project_files(lm: mx.LoadedMatrix) -> list[str]:
    """Every file of the project, relative to its root: the matrix, its lock, the locked
    metadata, and what the matrix names (patches, requirements, generator scripts)."""
    root = lm.root
    names = ["matrix.yaml", LOCK_NAME, SCHEMA_FILE]
    names += sorted(str(p.relative_to(root)) for p in (root / "locked").rglob("*")
                    if p.is_file() and "__pycache__" not in p.parts)
    for engine in lm.matrix.engines.values():
        for real in engine.realize.values():
            names += [f"patches/{p}" for p in real.patches]
            if real.wheel:
                names.append(real.wheel.requirements)
    names += [m.generate.script for m in lm.matrix.models.values() if m.generate]
    return list(dict.fromkeys(names))


def init(dest: Path, source: Path | None = None) -> list[Path]:
    """Copy the example project (`source`, default the package's own) into `dest` and
    render it; the paths written."""
    lm = mx.load((source or REPO_ROOT) / "matrix.yaml")
    files = project_files(lm)
    taken = [name for name in files + ["rendered"] if (dest / name).exists()]
    if taken:
        raise UserError(f"{dest} already holds {', '.join(taken[:5])}"
                        + (f" and {len(taken) - 5} more" if len(taken) > 5 else ""),
                        fix="give an empty or new folder: `python build.py init DIR`")
    written = []
    for name in files:
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(lm.root / name, target)
        written.append(target)
    copied = mx.load(dest / "matrix.yaml")
    rendered, _ = render_all(copied, mx.expand(copied), read_lock(copied.root))
    return written + write(rendered, dest / "rendered")
