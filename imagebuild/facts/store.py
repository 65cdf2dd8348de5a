"""Where recorded vLLM facts live and how a rule finds the ones of its cell's version.

One folder per vLLM version, `<root>/<version>/`, holding one JSON file per part
(record.PARTS) and meta.json (what recorded them). Roots, first match wins:
- the folders a caller passes (a matrix's own, `<matrix dir>/locked/vllm/`, written by
  `build.py facts record` for a version this package does not ship);
- the facts shipped in the package (imagebuild/facts/recorded/).
A version with no folder has no facts: rules say so and name the command that records
them (record_command), never answering from another version's facts.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

SHIPPED = Path(__file__).resolve().parent / "recorded"
PARTS = ("serve_args", "modalities", "kv", "envs", "logs", "metrics", "kernel_select")
META = "meta.json"
UNIFY_MODULE_PATH = "vllm/v1/core/kv_cache_utils.py"  # the file unification lives in


def locked_dir(matrix_root: Path) -> Path:
    """Where a matrix keeps the facts recorded for its engines: beside its lock."""
    return Path(matrix_root) / "locked" / "vllm"


def record_command(version: str | None = None) -> str:
    """The command that records a version's facts (in words a user can run)."""
    what = f"vLLM {version}" if version else "that vLLM"
    return (f"python build.py facts record --python <python of a venv with {what} "
            "installed> (docs/upgrading-vllm.md, step 5: that venv from the engine's "
            "requirement set and wheel)")


def _same_version(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return False


@dataclass
class VllmFacts:
    """The recorded facts of one vLLM version, read part by part when first asked."""

    version: str
    root: Path
    meta: dict[str, Any]
    _parts: dict[str, Any] = field(default_factory=dict, repr=False)

    def part(self, name: str) -> dict[str, Any] | None:
        if name not in self._parts:
            path = self.root / f"{name}.json"
            self._parts[name] = json.loads(path.read_text()) if path.is_file() else None
        return self._parts[name]

    def has(self, name: str) -> bool:
        return (self.root / f"{name}.json").is_file()

    @functools.cached_property
    def where(self) -> str:
        """The folder, as messages name it (relative to the package or the cwd; computed
        once: every prediction names it)."""
        for base in (SHIPPED.parents[2], Path.cwd()):
            try:
                return str(self.root.resolve().relative_to(base.resolve()))
            except ValueError:
                continue
        return str(self.root)

    @property
    def said(self) -> str:
        """How a finding names the facts it used."""
        return f"vLLM {self.version}'s recorded facts"

    def missing(self, part: str) -> str:
        """Why a part is absent, for a finding: a failed recording says its error."""
        info = (self.meta.get("parts") or {}).get(part) or {}
        if info.get("error"):
            return (f"vLLM {self.version}'s facts have no {part} (recording it failed: "
                    f"{info['error']})")
        return f"vLLM {self.version}'s facts ({self.where}) have no {part}"

    # --- parts as rules read them ---------------------------------------------------------
    @property
    def serve_args(self) -> dict[str, Any] | None:
        return self.part("serve_args")

    @property
    def modalities(self) -> dict[str, Any] | None:
        return self.part("modalities")

    @property
    def kv(self) -> dict[str, Any] | None:
        return self.part("kv")

    @property
    def envs(self) -> dict[str, Any] | None:
        return self.part("envs")

    @property
    def logs(self) -> dict[str, Any] | None:
        return self.part("logs")

    @property
    def metrics(self) -> dict[str, Any] | None:
        return self.part("metrics")

    @property
    def kernel_select(self) -> dict[str, Any] | None:
        return self.part("kernel_select")

    def patched_unify(self, key: str) -> dict[str, Any] | None:
        """The unification recorded with a patch set applied (record.patch_key)."""
        return self.part(f"kv_patched_{key}")


_CACHE: dict[tuple[str, int], VllmFacts] = {}


@functools.cache
def _recorder_common() -> Any:
    """The recorder's own common.py (stdlib only: it runs in vLLM's interpreter, so it is
    not an imagebuild module), loaded once for its part_sha256."""
    path = Path(__file__).resolve().parent / "recorder" / "common.py"
    spec = importlib.util.spec_from_file_location("_imagebuild_recorder_common", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@functools.cache
def _recorder_sha256(part: str) -> str:
    """Today's recorder hash of one part: its files hashed once per process, not once per
    cell `check` asks about."""
    return str(_recorder_common().part_sha256(part))


def stale_parts(facts: VllmFacts) -> list[str]:
    """The recorded parts whose recorder differs from today's (its hash in meta.json): they
    say what an older recorder understood of that version, which may no longer be what
    the rules expect (a part re-recorded answers anew)."""
    parts = facts.meta.get("parts") or {}
    return [name for name, entry in sorted(parts.items())
            if facts.has(name) and isinstance(entry, dict)
            and entry.get("recorder_sha256") != _recorder_sha256(name)]


def _load(folder: Path) -> VllmFacts | None:
    meta_path = folder / META
    if not meta_path.is_file():
        return None
    key = (str(folder.resolve()), meta_path.stat().st_mtime_ns)
    if key not in _CACHE:
        meta = json.loads(meta_path.read_text())
        _CACHE[key] = VllmFacts(version=str(meta.get("vllm_version") or folder.name),
                                root=folder, meta=meta)
    return _CACHE[key]


def roots(extra_dirs: Iterable[Path] = ()) -> list[Path]:
    return [*(Path(d) for d in extra_dirs), SHIPPED]


def facts_for(version: str, extra_dirs: Iterable[Path] = ()) -> VllmFacts | None:
    """The recorded facts of vLLM `version` (PEP 440 equal: 0.32 is 0.32.0), or None."""
    for root in roots(extra_dirs):
        if not root.is_dir():
            continue
        direct = root / version
        found = _load(direct) if direct.is_dir() else None
        if found is not None:
            return found
        for folder in sorted(p for p in root.iterdir() if p.is_dir()):
            if _same_version(folder.name, version):
                found = _load(folder)
                if found is not None:
                    return found
    return None


def versions(extra_dirs: Iterable[Path] = ()) -> dict[str, Path]:
    """Every version with recorded facts -> its folder (the first root holding it)."""
    out: dict[str, Path] = {}
    for root in roots(extra_dirs):
        if root.is_dir():
            for folder in sorted(p for p in root.iterdir() if (p / META).is_file()):
                out.setdefault(folder.name, folder)
    return out
