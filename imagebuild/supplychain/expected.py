"""What the lock says a cell's serve image holds: the engine (vLLM version, the wheel or
source it came from, patches, compile dependencies), the base images, the Python pins of
the engine's requirements file, and the model and drafter files. The SBOM is read from
the image (probe.py); this is what it is compared with (sbom.findings)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imagebuild.lock.lockfile import served_files
from imagebuild.spec.servecmd import DRAFTER_DIR, MODEL_DIR

if TYPE_CHECKING:
    from imagebuild.lock.lockfile import Lock
    from imagebuild.plan import Job

PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;#\\]+)")


def normalize(name: str) -> str:
    """PEP 503 name: what pip and importlib.metadata agree on."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_pins(text: str) -> dict[str, str]:
    """name == version lines of a requirements file (normalized name -> version)."""
    return {normalize(m.group(1)): m.group(2) for line in text.splitlines()
            if (m := PIN.match(line))}


@dataclass(frozen=True)
class Weights:
    """A model or drafter as the lock pins it and where the image carries it."""

    role: str  # model | drafter
    name: str  # its name in matrix.yaml
    path: str  # its folder in the image
    repository: str | None = None  # a Hub repository
    revision: str | None = None  # the pinned commit
    generated: str | None = None  # the script that makes it (the cpu tiny model)
    seed: int | None = None
    files: list[dict[str, Any]] | None = None  # the lock's files (path, size, sha256)


@dataclass(frozen=True)
class Expected:
    cell: str
    target: str
    engine_name: str
    vllm_version: str | None
    engine: dict[str, Any]  # the lock's engine entry for the target
    base: dict[str, Any]  # the lock's base entry for the target
    python_pins: dict[str, str] = field(default_factory=dict)
    weights: list[Weights] = field(default_factory=list)

    @property
    def wheel(self) -> dict[str, Any] | None:
        return self.engine.get("wheel")

    @property
    def source(self) -> dict[str, Any] | None:
        return self.engine.get("source")


def _weights(role: str, name: str, path: str, pin: Any, entry: dict[str, Any] | None
             ) -> Weights:
    entry = entry or {}
    files = entry.get("files")
    exclude = list(getattr(pin, "exclude", None) or [])
    generate = getattr(pin, "generate", None)
    return Weights(role=role, name=name, path=path,
                   repository=getattr(pin, "repository", None),
                   revision=entry.get("sha") or getattr(pin, "revision", None),
                   generated=generate.script if generate else None,
                   seed=generate.seed if generate else None,
                   files=served_files(files, exclude) if files is not None else None)


def expected_for(job: Job, lock: Lock, root: Path) -> Expected:
    cell = job.cell
    engine = (lock.entry("engines", cell.engine_name) or {}).get(cell.target_name) or {}
    base = lock.entry("bases", cell.target_name) or {}
    pins: dict[str, str] = {}
    wheel = engine.get("wheel") or {}
    if wheel.get("requirements"):
        req = root / wheel["requirements"]
        if req.is_file():
            pins = requirement_pins(req.read_text())
    if wheel.get("package") and wheel.get("version"):
        pins[normalize(wheel["package"])] = wheel["version"]
    weights = [_weights("model", cell.model_name, MODEL_DIR, cell.model,
                        lock.entry("models", cell.model_name))]
    if cell.drafter_model:
        weights.append(_weights("drafter", cell.drafter_name, DRAFTER_DIR, cell.drafter,
                                lock.entry("drafters", cell.drafter_name)))
    return Expected(cell=cell.id, target=cell.target_name, engine_name=cell.engine_name,
                    vllm_version=engine.get("vllm_version"), engine=engine, base=base,
                    python_pins=pins, weights=weights)
