"""The act rehearsal's stand-in for GitHub's attestation actions and `gh attestation
verify` (.github/act-standins/attestations/attest.py), loaded for unit tests, with its
ORAS client talking to an in-memory registry (tests/support/memregistry.py)."""

from __future__ import annotations

import importlib.util
from types import ModuleType
from typing import Any

from imagebuild import REPO_ROOT

PATH = REPO_ROOT / ".github" / "act-standins" / "attestations" / "attest.py"
HOST = "127.0.0.1:5999"  # MemRegistry's


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("attest_standin", PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def on(mem: Any, monkeypatch: Any) -> ModuleType:
    """The stand-in whose registry requests go to `mem` (a MemRegistry)."""
    module = load()
    real = module.Registry.__init__

    def init(self: Any, name: str) -> None:
        real(self, name)
        self.oras.session = mem

    monkeypatch.setattr(module.Registry, "__init__", init)
    return module


def attest(module: ModuleType, monkeypatch: Any, tmp: Any, kind: str, name: str,
           digest: str, sbom: Any = None, repository: str = "Org/imagebuild") -> str:
    """One attest step as the action runs it; the pushed bundle's digest."""
    out = tmp / f"output-{kind}"
    for key, value in {"SUBJECT_NAME": name, "SUBJECT_DIGEST": digest, "PUSH": "true",
                       "SBOM_PATH": str(sbom or ""), "RUNNER_TEMP": str(tmp),
                       "GITHUB_OUTPUT": str(out), "GITHUB_REPOSITORY": repository,
                       "DOCKER_CONFIG": str(tmp / "no-docker-config")}.items():
        monkeypatch.setenv(key, value)
    assert module.attest(kind) == 0
    outputs = dict(line.split("=", 1) for line in out.read_text().splitlines())
    return outputs["attestation-digest"]
