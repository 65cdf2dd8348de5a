"""The hash-pinned vLLM an engine's patch series is applied to, for trying the series
before any build (`check`, `lock`, `render`).

A wheel realization (cpu): the members the series touches of the very wheel the engine
installs, found by its pinned sha256 (wheel.py); apply-patches.sh patches the installed
package, whose paths are the wheel's. A source realization (gb10): the sdist of the
engine's vLLM version, the tree `lock` proves the source pin was built from (sdist.py).
Both come from the cache (.cache/vllm-src); `fetch` downloads what is missing (lock, and
check or render of a release about to be built); without it an uncached source is None
and the caller says the series was not tried.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from imagebuild.spec.config import EngineRealization
from imagebuild.vllmsource import sdist, wheel
from imagebuild.vllmsource.patches import touched_files


@dataclass(frozen=True)
class Pinned:
    tree: Path  # the root patches apply to with -p1
    what: str  # how messages name it


def describe(real: EngineRealization, version: str) -> str:
    if real.wheel is not None:
        w = real.wheel
        return f"{w.package} {w.version} wheel (sha256 {w.sha256[:12]})"
    return f"the vLLM {version} sdist (the tree the source pin was built from)"


@contextmanager
def pinned_source(real: EngineRealization, version: str, patches: list[Path], *,
                  fetch: bool, cache_dir: Path | None = None) -> Iterator[Pinned | None]:
    """The pinned source of `real` holding (at least) the files `patches` touch."""
    what = describe(real, version)
    if real.wheel is not None:
        w = real.wheel
        path = (wheel.fetch_wheel(w.package, w.version, w.sha256, cache_dir) if fetch
                else wheel.cached_wheel(w.sha256, cache_dir))
        if path is None:
            yield None
            return
        with tempfile.TemporaryDirectory(prefix="imagebuild-pinned.") as scratch:
            touched = sorted({rel for p in patches for rel in touched_files(p)})
            wheel.wheel_members(path, touched, Path(scratch))
            yield Pinned(Path(scratch), what)
        return
    if fetch or sdist.cached_tree(version, cache_dir) is not None:
        yield Pinned(sdist.sdist_tree(version, cache_dir), what)
    else:
        yield None
