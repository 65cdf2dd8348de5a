"""A wheel engine's download stage, dropped from BuildKit's cache once the engine is built.

The cpu engine's first stage downloads its whole pinned wheel set (~3 GB: the slimming plan
is derived from every wheel, the GPU ones included), and the stubs and install steps read
it through bind mounts. Once the engine image exists nothing reads that stage again: the
engine is found by its inputs tag (build avoidance), serve images build FROM it, and a
patch-only change reuses the install layers, which BuildKit matches by their cache keys
(measured: with dflashfix's download stage gone, the pr41703 engine, the same wheel with
other patches, built in 22.4 s, 5 steps run and 10 cached, the download step among the
cached). Kept, the stage holds ~3 GB per engine version for as long as
BuildKit's cache lives: two engines (0.23 and 0.32) ran a CI machine out of disk. So after
a wheel engine build its records are removed, found by the download script their step
runs; a later build that changes what comes before the patches downloads again (~20-40 s
from a local index).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from imagebuild.docker import DockerEngine

# the wheels stage's RUN runs it (images/engine/Dockerfile.j2); no other step names it
MARK = "/opt/imagebuild/download-wheels.py"


def download_records(eng: DockerEngine) -> list[dict]:
    """BuildKit's records of a wheels stage's download step, not in use by a build."""
    return [r for r in eng.build_cache()
            if MARK in (r.get("Description") or "") and not r.get("InUse")]


def drop_download_stages(eng: DockerEngine, log: Callable[[str], None]) -> int:
    """Remove every download stage's records from BuildKit's cache; the bytes freed."""
    freed = sum(eng.prune_build_cache(r["ID"]) for r in download_records(eng))
    if freed:
        log(f"[engine] dropped the wheel downloads ({freed / 1e9:.1f} GB) from BuildKit's "
            "cache: the engine image holds what was installed from them")
    return freed
