"""@sigstore/oci 0.7.2's attachArtifactToImage (packages/oci/src/image.ts addArtifact,
registry.ts RegistryClient), the push actions/attest v4.2.2 makes with push-to-registry
(src/attest.ts:45-65), over `requests` so a test can hand it an in-memory registry:

- http only for the hosts `localhost` and `127.0.0.1`, https otherwise (registry.ts:165-170);
- signIn (registry.ts:180-224): an unauthenticated POST .../blobs/uploads/; 200 is signed
  in, else the WWW-Authenticate challenge must be Basic (then basic auth) or Bearer (a
  token from its realm with the credentials): no challenge ("Invalid challenge: ") fails;
- the subject must exist: HEAD manifests/<digest> answers 200, its Content-Type,
  Docker-Content-Digest and Content-Length make the subject descriptor (registry.ts:285-304);
- the artifact and `{}` blobs (HEAD, else POST 202 + PUT ?digest= 201), then the manifest
  PUT by its digest (201; OCI-Subject read back) with artifactType, the empty config,
  one layer, the subject and the annotations plus org.opencontainers.image.created;
- unless the answer had OCI-Subject and GET referrers/<zero digest> answers 200, the
  referrers tag schema: `sha256-<hex>` index read (404: a new one; not an OCI index:
  an error), the descriptor appended when absent, PUT with If-Match of its ETag;
- any failure is OCIError "Error uploading artifact to container registry" with the
  HTTP error ("Error fetching URL - expected N, received M") as its cause."""

from __future__ import annotations

import hashlib
import json
import re
import time
from typing import Any
from urllib.parse import urlencode, urljoin, urlsplit

import requests
from oci_credentials import Credentials

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
EMPTY = "application/vnd.oci.empty.v1+json"
OCTET = "application/octet-stream"
ALL_MANIFESTS = ",".join([OCI_INDEX, OCI_MANIFEST,
                          "application/vnd.docker.distribution.manifest.v2+json",
                          "application/vnd.docker.distribution.manifest.list.v2+json"])
ZERO_DIGEST = "sha256:" + "0" * 64


class HTTPError(Exception):
    def __init__(self, url: str, expected: int, status: int) -> None:
        super().__init__(f"Error fetching {url} - expected {expected}, received {status}")
        self.status = status


class OCIError(Exception):
    def __init__(self, message: str, cause: BaseException) -> None:
        super().__init__(f"{message}: {cause}")
        self.cause = cause


def _digest(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


def _ensure(r: requests.Response, url: str, expected: int) -> requests.Response:
    if r.status_code != expected:
        raise HTTPError(url, expected, r.status_code)
    return r


def _challenge(header: str) -> dict[str, str]:
    scheme, _, params = header.partition(" ")
    if scheme not in ("Basic", "Bearer"):
        raise ValueError(f"Invalid challenge: {header}")
    def get(key: str) -> str:
        m = re.search(rf'{key}="(.+?)"', params)
        return m.group(1) if m else ""

    return {"scheme": scheme.lower(), "realm": get("realm"), "service": get("service"),
            "scope": get("scope")}


class RegistryClient:
    def __init__(self, registry: str, repository: str,
                 session: requests.Session | None = None) -> None:
        host = urlsplit(f"http://{registry}").hostname
        scheme = "http" if host in ("localhost", "127.0.0.1") else "https"
        self.base = f"{scheme}://{registry}"
        self.origin = self.base
        self.repo = repository
        self.session = session or requests.Session()
        self.headers: dict[str, str] = {}
        self.sent_auth: list[str] = []  # what Authorization went out (tests read it)

    def fetch(self, url: str, method: str = "GET", headers: dict[str, str] | None = None,
              body: bytes | None = None) -> requests.Response:
        """registry.ts #securedFetch: registry headers only to this origin."""
        same = url.startswith(self.origin + "/")
        h = {**(self.headers if same else {}), **(headers or {})}
        if "Authorization" in h:
            self.sent_auth.append(h["Authorization"])
        return self.session.request(method, url, headers=h, data=body, timeout=30,
                                    allow_redirects=False)

    def sign_in(self, creds: Credentials) -> None:
        self.headers.update(creds.headers)
        url = f"{self.base}/v2/{self.repo}/blobs/uploads/"
        probe = self.fetch(url, "POST")
        if probe.status_code == 200:
            return
        ch = _challenge(probe.headers.get("WWW-Authenticate", ""))
        import base64

        basic = base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode()
        if ch["scheme"] == "basic":
            self.headers["Authorization"] = f"Basic {basic}"
            return
        q = urlencode({"service": ch["service"], "scope": ch["scope"]})
        token_url = f"{ch['realm']}?{q}"
        r = _ensure(self.session.request("GET", token_url, timeout=30,
                                         headers={"Authorization": f"Basic {basic}"}),
                    token_url, 200)
        doc = r.json()
        self.headers["Authorization"] = f"Bearer {doc.get('access_token') or doc.get('token')}"

    def check_manifest(self, ref: str) -> dict[str, Any]:
        url = f"{self.base}/v2/{self.repo}/manifests/{ref}"
        r = _ensure(self.fetch(url, "HEAD", {"Accept": ALL_MANIFESTS}), url, 200)
        return {"mediaType": r.headers.get("Content-Type", ""),
                "digest": r.headers.get("Docker-Content-Digest", ""),
                "size": int(r.headers.get("Content-Length") or 0)}

    def get_manifest(self, ref: str) -> tuple[dict[str, Any], str, str | None]:
        url = f"{self.base}/v2/{self.repo}/manifests/{ref}"
        r = _ensure(self.fetch(url, headers={"Accept": ALL_MANIFESTS}), url, 200)
        return r.json(), r.headers.get("Content-Type", ""), r.headers.get("ETag")

    def upload_blob(self, blob: bytes) -> dict[str, Any]:
        digest = _digest(blob)
        url = f"{self.base}/v2/{self.repo}/blobs/{digest}"
        if self.fetch(url, "HEAD").status_code == 200:
            return {"mediaType": OCTET, "digest": digest, "size": len(blob)}
        post = f"{self.base}/v2/{self.repo}/blobs/uploads/"
        r = _ensure(self.fetch(post, "POST"), post, 202)
        location = r.headers.get("Location")
        if not location:
            raise ValueError("Missing location for blob upload")
        put = urljoin(post, location)
        put += ("&" if "?" in put else "?") + urlencode({"digest": digest})
        _ensure(self.fetch(put, "PUT", {"Content-Type": OCTET}, blob), put, 201)
        return {"mediaType": OCTET, "digest": digest, "size": len(blob)}

    def upload_manifest(self, manifest: str, media: str = OCI_MANIFEST,
                        reference: str | None = None, etag: str | None = None
                        ) -> dict[str, Any]:
        raw = manifest.encode()
        digest = _digest(raw)
        url = f"{self.base}/v2/{self.repo}/manifests/{reference or digest}"
        headers = {"Content-Type": media, **({"If-Match": etag} if etag else {})}
        r = _ensure(self.fetch(url, "PUT", headers, raw), url, 201)
        return {"mediaType": media, "digest": digest, "size": len(raw),
                "subjectDigest": r.headers.get("OCI-Subject")}

    def ping_referrers(self) -> bool:
        return self.fetch(f"{self.base}/v2/{self.repo}/referrers/{ZERO_DIGEST}"
                          ).status_code == 200


def attach_artifact_to_image(client: RegistryClient, creds: Credentials, image_digest: str,
                             artifact: bytes, media_type: str,
                             annotations: dict[str, str]) -> dict[str, Any]:
    """image.ts addArtifact: the pushed artifact manifest's descriptor."""
    ann = {"org.opencontainers.image.created":
           time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime()), **annotations}
    try:
        client.sign_in(creds)
        subject = client.check_manifest(image_digest)
        layer = client.upload_blob(artifact)
        config = client.upload_blob(b"{}")
        manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": media_type,
                    "config": {**config, "mediaType": EMPTY},
                    "layers": [{**layer, "mediaType": media_type}], "subject": subject,
                    "annotations": ann}
        desc = client.upload_manifest(json.dumps(manifest, separators=(",", ":")))
        if not desc["subjectDigest"] or not client.ping_referrers():
            entry = {k: v for k, v in desc.items() if k != "subjectDigest"}
            _referrers_index_by_tag(client, {**entry, "artifactType": media_type,
                                             "annotations": ann}, image_digest)
    except Exception as exc:  # noqa: BLE001 - wrapped as image.ts:119-124 does
        raise OCIError("Error uploading artifact to container registry", exc) from exc
    return desc


def _referrers_index_by_tag(client: RegistryClient, artifact: dict[str, Any],
                            image_digest: str) -> None:
    tag = image_digest.replace(":", "-")
    etag = None
    try:
        index, media, etag = client.get_manifest(tag)
        if media.split(";")[0] != OCI_INDEX:
            raise ValueError(f"Expected referrer manifest type {OCI_INDEX}, got {media}")
    except HTTPError as exc:
        if exc.status != 404:
            raise
        index = {"mediaType": OCI_INDEX, "schemaVersion": 2, "manifests": []}
    if not any(m.get("digest") == artifact["digest"] for m in index["manifests"]):
        index["manifests"].append(artifact)
        client.upload_manifest(json.dumps(index, separators=(",", ":")), OCI_INDEX, tag, etag)
