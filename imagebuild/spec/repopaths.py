"""Files matrix.yaml names (patches, requirement sets, generator scripts) must be files
inside the repository: relative, no '..', no symlink leading out. They are copied into
build contexts and hashed into image inputs, so a path outside would make a build depend
on whatever the machine holds there."""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

from imagebuild.spec.values import BadValue

CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# check_relative for the JSON Schema: not blank, not absolute (/, ~, C:), no '..' step,
# no control character or backslash
RELATIVE_JSON = (r"^(?!\s*$)(?![/~])(?![A-Za-z]:)(?!(?:.*/)?\.\.(?:/|$))"
                 r"[^\x00-\x1f\x7f\\]+$")


def check_relative(value: str, what: str) -> str:
    """Syntax only (the schema has no repository root): a relative POSIX path, no '..'."""
    fix = f"write the {what} as a path relative to the repository, e.g. patches/x.patch"
    if not value.strip():
        raise BadValue(f"{what} path is empty", fix)
    if CONTROL.search(value) or "\\" in value:
        raise BadValue(f"{what} path {value!r} holds a control character or backslash", fix)
    if value.startswith(("/", "~")) or re.match(r"^[A-Za-z]:", value):
        raise BadValue(f"{what} path {value!r} is absolute", fix)
    if ".." in PurePosixPath(value).parts:
        raise BadValue(f"{what} path {value!r} leaves its folder with '..'", fix)
    return value


def inside(root: Path, folder: Path, rel: str, what: str) -> Path:
    """The existing regular file `folder/rel`, resolved, which must stay under `folder`
    (itself under the repository `root`) after following symlinks."""
    check_relative(rel, what)
    path = folder / rel
    try:
        real = path.resolve(strict=True)
    except (FileNotFoundError, RuntimeError):  # RuntimeError: a symlink loop
        raise BadValue(f"{what} {rel!r} not found under {_show(root, folder)}",
                       f"add the file or correct the name of the {what}") from None
    base = folder.resolve()
    if not real.is_relative_to(base):
        raise BadValue(f"{what} {rel!r} is a symlink leading out of {_show(root, folder)} "
                       f"(to {real})", f"copy the file into {_show(root, folder)} instead")
    if not real.is_file():
        raise BadValue(f"{what} {rel!r} is not a regular file",
                       f"point the {what} at a file")
    return real


def _show(root: Path, folder: Path) -> str:
    rel = folder.resolve().relative_to(root.resolve()) if folder.resolve().is_relative_to(
        root.resolve()) else folder
    return "the repository" if str(rel) == "." else f"{rel}/"
