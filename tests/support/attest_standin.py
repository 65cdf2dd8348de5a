"""The act rehearsal's stand-ins for GitHub's attestation services (actions/attest,
`gh attestation verify`, .github/act-standins/{attest,lib}), loaded for unit tests and
run against an in-memory registry that asks for basic auth as the embedded one does, with
the job's runner context (permissions, runs-on, the event's repository) in files as the
rehearsal hands it over."""

from __future__ import annotations

import base64
import importlib
import json
import sys
from pathlib import Path
from typing import Any

import requests
import yaml

from imagebuild import REPO_ROOT
from tests.support.memregistry import MemRegistry

STANDINS = REPO_ROOT / ".github" / "act-standins"
HOST = "127.0.0.1:5999"  # MemRegistry's
USER, PASSWORD = "u", "p"  # what MemRegistry.client() sends
REPOSITORY = "Org/imagebuild"
WORKFLOW_REF = f"{REPOSITORY}/.github/workflows/release.yml@refs/heads/main"
SIGNER_PERMISSIONS = {"contents": "read", "packages": "write", "id-token": "write",
                      "attestations": "write", "artifact-metadata": "write"}


def modules() -> dict[str, Any]:
    """The stand-ins' modules (attest.py and lib/*), imported fresh."""
    for folder in (STANDINS / "lib", STANDINS / "attest"):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    names = ("oci_credentials", "oci_attach", "runner_context", "github_api", "gh_verify",
             "attest", "artifact_store")
    return {n: importlib.reload(importlib.import_module(n)) for n in names}


class AuthRegistry(MemRegistry):
    """MemRegistry behind basic auth (401 + `WWW-Authenticate: Basic`, as distribution
    with htpasswd): every Authorization it was sent is kept."""

    def __init__(self) -> None:
        super().__init__()
        self.authorizations: list[str] = []
        self.good = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()

    def request(self, method, url, headers=None, data=None, **kw):  # type: ignore[override]
        auth = (headers or {}).get("Authorization", "")
        if auth:
            self.authorizations.append(auth)
        if auth != self.good:
            r = requests.Response()
            r.status_code = 401
            r._content = b'{"errors":[{"code":"UNAUTHORIZED"}]}'  # noqa: SLF001
            r.headers["WWW-Authenticate"] = 'Basic realm="Registry Realm"'
            return r
        return super().request(method, url, headers=headers, data=data, **kw)


def login(home: Path, registry: str = HOST, user: str = USER, password: str = PASSWORD,
          **extra: Any) -> Path:
    """`$home/.docker/config.json` with one auths entry (as `make registry-login`)."""
    path = home / ".docker" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    path.write_text(json.dumps({"auths": {registry: {"auth": auth}}, **extra}))
    return path


def job_env(tmp: Path, *, permissions: dict[str, str] | None = None,
            runs_on: Any = "ubuntu-24.04", visibility: str = "public",
            owner_type: str = "Organization", home: Path | None = None) -> dict[str, str]:
    """The environment a job's step sees on the runner (as the rehearsal makes it)."""
    tmp.mkdir(parents=True, exist_ok=True)
    wf = tmp / "release.yml"
    wf.write_text(yaml.safe_dump({"permissions": {}, "jobs": {"sign": {
        "runs-on": runs_on, "permissions": SIGNER_PERMISSIONS if permissions is None
        else permissions}}}))
    event = tmp / "event.json"
    event.write_text(json.dumps({"repository": {
        "full_name": REPOSITORY, "visibility": visibility, "private": visibility != "public",
        "owner": {"login": REPOSITORY.split("/")[0], "type": owner_type}}}))
    (tmp / "runner-temp").mkdir(exist_ok=True)
    home = home if home is not None else tmp / "home"
    home.mkdir(parents=True, exist_ok=True)
    return {"HOME": str(home), "RUNNER_TEMP": str(tmp / "runner-temp"),
            "GITHUB_OUTPUT": str(tmp / "output"), "GITHUB_WORKSPACE": str(tmp),
            "GITHUB_REPOSITORY": REPOSITORY, "GITHUB_SERVER_URL": "https://github.com",
            "GITHUB_REF": "refs/heads/main", "GITHUB_SHA": "c" * 40, "GITHUB_RUN_ID": "7",
            "GITHUB_JOB": "sign", "GITHUB_EVENT_PATH": str(event),
            "GITHUB_WORKFLOW_REF": WORKFLOW_REF, "IMAGEBUILD_REHEARSAL_WORKFLOW": str(wf),
            "IMAGEBUILD_REHEARSAL_GH": str(tmp / "gh")}


def inputs(name: str, digest: str, sbom: str = "", push: bool = True) -> dict[str, str]:
    """The INPUT_* variables the runner sets from release.yml's `with:` (and the
    action.yml defaults)."""
    return {"INPUT_SUBJECT-NAME": name, "INPUT_SUBJECT-DIGEST": digest,
            "INPUT_SBOM-PATH": sbom, "INPUT_PUSH-TO-REGISTRY": "true" if push else "false",
            "INPUT_CREATE-STORAGE-RECORD": "true", "INPUT_SHOW-SUMMARY": "true",
            "INPUT_GITHUB-TOKEN": "t"}


def attest(mods: dict[str, Any], monkeypatch: Any, env: dict[str, str], reg: Any,
           name: str, digest: str, sbom: str = "") -> dict[str, str]:
    """One attest step: its outputs (raises the stand-in's Failed as the action fails)."""
    full = {**env, **inputs(name, digest, sbom)}
    for k, v in full.items():
        monkeypatch.setenv(k, v)
    return dict(mods["attest"].run(full, session=reg))


def gh_verify(mods: dict[str, Any], monkeypatch: Any, env: dict[str, str], reg: Any,
              *argv: str) -> int:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return int(mods["gh_verify"].verify(list(argv), session=reg))
