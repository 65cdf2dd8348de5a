"""`gh attestation verify` (cli/cli v2.60.0 pkg/cmd/attestation/verify/{verify,options,
policy}.go), over the stand-in's unsigned bundles. What it keeps of gh's contract:

- flags: exactly one of --owner/--repo (MarkFlagsOneRequired, MutuallyExclusive); at most
  one of --cert-identity, --cert-identity-regex, --signer-repo, --signer-workflow;
  --repo must be OWNER/REPO; --bundle-from-oci only for oci:// (options.go AreFlagsValid);
- the digest of oci://NAME:TAG or NAME@DIGEST comes from the registry with
  go-containerregistry's DefaultKeychain: $DOCKER_CONFIG/config.json, else
  $HOME/.docker/config.json, the auths entry of exactly that host (artifact/oci/client.go);
- attestations come from GitHub's API for that digest (by repo, else by owner), or with
  --bundle-from-oci from the registry's referrers; none: "✗ No attestations found";
- --predicate-type filters them;
- the policy (policy.go): the statement's subject digest is the artifact's; the SAN
  matches `(?i)^https://github.com/<repo or owner>/` by default, or
  `^https://<host>/<signer-workflow>` with --signer-workflow (a regex prefix: the ref
  after `@` is not pinned), or the exact --cert-identity; --deny-self-hosted-runners
  needs runnerEnvironment github-hosted; then the source repository (owner) URI must be
  the --repo (--owner) one (verification/extensions.go VerifyCertExtensions).
Exit 1 with gh's "✗ ..." line when any of it fails. No signature is checked: there is
none (the bundle says so)."""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import github_api
import requests
from oci_attach import ALL_MANIFESTS, OCI_INDEX

BUNDLE_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
HOST_RE = r"^[a-zA-Z0-9-]+\.[a-zA-Z0-9-]+.*$"  # policy.go hostRegex


class VerifyError(Exception):
    pass


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gh attestation verify", exit_on_error=False)
    p.add_argument("artifact")
    p.add_argument("-o", "--owner", default="")
    p.add_argument("-R", "--repo", default="")
    p.add_argument("--predicate-type", default="")
    p.add_argument("--bundle-from-oci", action="store_true")
    p.add_argument("--deny-self-hosted-runners", action="store_true")
    p.add_argument("--cert-identity", default="")
    p.add_argument("-i", "--cert-identity-regex", default="")
    p.add_argument("--signer-repo", default="")
    p.add_argument("--signer-workflow", default="")
    p.add_argument("--cert-oidc-issuer", default="https://token.actions.githubusercontent.com")
    p.add_argument("--hostname", default="github.com")
    return p


def check_flags(a: argparse.Namespace) -> None:
    if bool(a.owner) == bool(a.repo):
        raise VerifyError("if any flags in the group [owner repo] are set none of the others "
                          "can be; [owner repo] were all set" if a.owner else
                          "at least one of the flags in the group [owner repo] is required")
    ids = [f for f in ("cert_identity", "cert_identity_regex", "signer_repo",
                       "signer_workflow") if getattr(a, f)]
    if len(ids) > 1:
        raise VerifyError("if any flags in the group [cert-identity cert-identity-regex "
                          "signer-repo signer-workflow] are set none of the others can be")
    if a.repo and len(a.repo.split("/")) != 2:
        raise VerifyError(f"invalid value provided for repo: {a.repo}")
    if a.bundle_from_oci and not a.artifact.startswith("oci://"):
        raise VerifyError("bundle-from-oci flag can only be used with OCI artifact paths")


def docker_auth(host: str) -> tuple[str, str] | None:
    """DefaultKeychain: DOCKER_CONFIG's config.json, else ~/.docker/config.json; the
    auths entry of exactly this host (with or without a scheme)."""
    folder = os.environ.get("DOCKER_CONFIG") or str(Path(os.environ.get("HOME", "")) / ".docker")
    try:
        auths = json.loads((Path(folder) / "config.json").read_text()).get("auths") or {}
    except (OSError, ValueError):
        return None
    for key in (host, f"https://{host}", f"http://{host}"):
        if key in auths and auths[key].get("auth"):
            user, _, pw = base64.b64decode(auths[key]["auth"]).decode().partition(":")
            return user, pw
    return None


class Registry:
    def __init__(self, host: str, repo: str, session: Any = None) -> None:
        loop = host.split(":")[0] in ("localhost", "127.0.0.1")
        self.base = f"{'http' if loop else 'https'}://{host}/v2/{repo}"
        self.host, self.session = host, session or requests.Session()
        self.auth: dict[str, str] = {}

    def get(self, path: str, accept: str = ALL_MANIFESTS) -> requests.Response:
        url = f"{self.base}/{path}"
        r = self.session.request("GET", url, headers={"Accept": accept, **self.auth},
                                 timeout=30)
        if r.status_code == 401 and not self.auth:
            creds = docker_auth(self.host)
            challenge = r.headers.get("WWW-Authenticate", "")
            if creds is None:
                raise VerifyError(f"GET {url}: UNAUTHORIZED: authentication required "
                                  f"(no login for {self.host} in the Docker config)")
            basic = base64.b64encode(":".join(creds).encode()).decode()
            if challenge.startswith("Bearer "):
                params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
                tok = self.session.request("GET", params["realm"] + "?" + urlencode(
                    {"service": params.get("service", ""), "scope": params.get("scope", "")}),
                    headers={"Authorization": f"Basic {basic}"}, timeout=30).json()
                token = tok.get("token") or tok.get("access_token")
                self.auth = {"Authorization": f"Bearer {token}"}
            else:
                self.auth = {"Authorization": f"Basic {basic}"}
            return self.get(path, accept)
        return r


def resolve(ref: str, session: Any = None) -> tuple[Registry, str]:
    image = ref.removeprefix("oci://")
    name, sep, wanted = image.partition("@")
    if not sep:
        head, colon, tag = image.rpartition(":")
        name, wanted = (head, tag) if colon and "/" not in tag else (image, "latest")
    host, _, repo = name.partition("/")
    reg = Registry(host, repo, session)
    r = reg.get(f"manifests/{wanted}")
    if r.status_code != 200:
        raise VerifyError(f"{image}: MANIFEST_UNKNOWN (HTTP {r.status_code})")
    digest = "sha256:" + hashlib.sha256(r.content).hexdigest()
    if sep and digest != wanted:
        raise VerifyError(f"{image}: the registry answered another manifest ({digest})")
    return reg, digest


def from_registry(reg: Registry, digest: str) -> list[dict[str, Any]]:
    r = reg.get(f"referrers/{digest}", OCI_INDEX)
    if r.status_code == 200 and r.headers.get("Content-Type", "").startswith(OCI_INDEX):
        found = r.json().get("manifests") or []
    else:
        t = reg.get(f"manifests/{digest.replace(':', '-')}")
        found = (t.json().get("manifests") or []) if t.status_code == 200 else []
    out = []
    for d in found:
        if d.get("artifactType") != BUNDLE_TYPE:
            continue
        layer = reg.get(f"manifests/{d['digest']}").json()["layers"][0]["digest"]
        out.append(reg.get(f"blobs/{layer}", "*/*").json())
    return out


def statement_of(bundle: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"])))


def san_pattern(a: argparse.Namespace) -> tuple[str, str]:
    """(exact SAN, SAN regex) as policy.go buildSANMatcher and options.go SetPolicyFlags."""
    host = a.hostname
    if a.signer_repo:
        return "", f"(?i)^https://{host}/{a.signer_repo}/"
    if a.signer_workflow:
        wf = a.signer_workflow if re.match(HOST_RE, a.signer_workflow) else \
            f"{host}/{a.signer_workflow}"
        return "", f"^https://{wf}"
    if a.cert_identity or a.cert_identity_regex:
        return a.cert_identity, a.cert_identity_regex
    return "", f"(?i)^https://{host}/{a.repo or a.owner}/"


def why_not(bundle: dict[str, Any], digest: str, a: argparse.Namespace) -> str | None:
    stmt = statement_of(bundle)
    subjects = [f"sha256:{s.get('digest', {}).get('sha256')}" for s in stmt.get("subject", [])]
    if digest not in subjects:
        return f"the statement's subjects {subjects} do not include {digest}"
    cert = (bundle.get("verificationMaterial") or {}).get("standInCertificate") or {}
    exact, regex = san_pattern(a)
    san = cert.get("subjectAlternativeName", "")
    if (exact and san != exact) or (regex and not re.search(regex, san)):
        return f"certificate SAN {san!r} does not match {exact or regex!r}"
    if cert.get("issuer") != a.cert_oidc_issuer:
        return f"issuer {cert.get('issuer')!r} is not {a.cert_oidc_issuer}"
    if a.deny_self_hosted_runners and cert.get("runnerEnvironment") != "github-hosted":
        return f"signed on a {cert.get('runnerEnvironment')!r} runner, not github-hosted"
    owner = (a.repo.split("/")[0] if a.repo else a.owner).lower()
    if cert.get("sourceRepositoryOwnerURI", "").lower() != f"https://{a.hostname}/{owner}":
        return (f"expected SourceRepositoryOwnerURI to be https://{a.hostname}/{owner}, got "
                f"{cert.get('sourceRepositoryOwnerURI')}")
    if a.repo and cert.get("sourceRepositoryURI", "").lower() != \
            f"https://{a.hostname}/{a.repo}".lower():
        return (f"expected SourceRepositoryURI to be https://{a.hostname}/{a.repo}, got "
                f"{cert.get('sourceRepositoryURI')}")
    return None


def verify(argv: list[str], session: Any = None) -> int:
    try:
        a = parser().parse_args(argv)
        check_flags(a)
        reg, digest = resolve(a.artifact, session) if a.artifact.startswith("oci://") else \
            (None, "sha256:" + hashlib.sha256(Path(a.artifact).read_bytes()).hexdigest())
    except (VerifyError, argparse.ArgumentError, OSError) as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    print(f"Loaded digest {digest} for {a.artifact}")
    if a.bundle_from_oci:
        bundles = from_registry(reg, digest)  # type: ignore[arg-type]
    else:
        bundles = github_api.attestations(digest, repo=a.repo, owner=a.owner)
    if not bundles:
        print(f"✗ No attestations found for subject {digest}", file=sys.stderr)
        return 1
    if a.predicate_type:
        bundles = [b for b in bundles if statement_of(b).get("predicateType") == a.predicate_type]
        if not bundles:
            print(f"✗ No attestations found with predicate type: {a.predicate_type}",
                  file=sys.stderr)
            return 1
    reasons = [why_not(b, digest, a) for b in bundles]
    if all(reasons):
        print("✗ Verification failed: " + "; ".join(r for r in reasons if r), file=sys.stderr)
        return 1
    print(f"✓ Verification succeeded! (stand-in: the statement and identity agree, no "
          f"signature checked) {a.artifact} {a.predicate_type or 'any predicate'} "
          f"for {a.repo or a.owner}")
    return 0
