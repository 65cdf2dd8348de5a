"""@sigstore/oci's getRegistryCredentials (packages/oci/src/credentials.ts), as the
attest stand-in and its tests run it. What it reads is the contract the release workflow
must meet: `$HOME/.docker/config.json` and nothing else (no DOCKER_CONFIG, no credsStore
or credHelpers), one `auths` entry chosen by the registry of the image name.

`version` picks the matching rule: "0.6.0" (credentials.ts:47-50, bundled by
actions/attest v4.1.0 and so by attest-build-provenance/attest-sbom v4.1.0) takes the
first key that *contains* the registry, so `mirror-ghcr.io.example.net` serves `ghcr.io`;
"0.7.1"/"0.7.2" (credentials.ts:70-78, actions/attest v4.1.1+, v4.2.2 bundles 0.7.2)
takes only a key that canonicalizes to exactly the registry (scheme and path stripped,
Docker Hub's aliases made one)."""

from __future__ import annotations

import base64
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

# name.ts:28-63: DOMAIN "/" NAME, anchored (lower-case path components)
_ALNUM = "[a-z0-9]+"
_SEP = r"(?:\.|_|__|-+)"
_COMPONENT = f"{_ALNUM}(?:(?:{_SEP}{_ALNUM})+)?"
_NAME = f"{_COMPONENT}(?:(?:/{_COMPONENT})?)+"
_DOMAIN_COMPONENT = "(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"{_DOMAIN_COMPONENT}(?:(?:\.{_DOMAIN_COMPONENT})+)?(?::[0-9]+)?"
IMAGE_NAME = re.compile(rf"^({_DOMAIN})/({_NAME})$")
DOCKER_HUB_ALIASES = {"docker.io", "index.docker.io", "registry-1.docker.io"}
VERSIONS = ("0.6.0", "0.7.1", "0.7.2")


class CredentialsError(Exception):
    """What getRegistryCredentials / parseImageName throw, in their words."""


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str
    headers: dict[str, str] = field(default_factory=dict)


def parse_image_name(image: str) -> tuple[str, str]:
    """(registry, path) of REGISTRY/PATH (name.ts:66-76)."""
    m = IMAGE_NAME.match(image)
    if not m:
        raise CredentialsError(f"Invalid image name: {image}")
    return m.group(1), m.group(2)


def canonicalize(value: str) -> str:
    """credentials.ts:44-51 (0.7.x): host[:port] of a registry or an auths key."""
    host = re.sub(r"^https?://", "", value).split("/")[0]
    return "docker.io" if host in DOCKER_HUB_ALIASES else host


def from_basic_auth(auth: str) -> tuple[str, str]:
    """credentials.ts fromBasicAuth: a ':' may be in the password. An entry without
    `auth` is Buffer.from(undefined): a TypeError in Node, refused here too."""
    if not isinstance(auth, str):
        raise CredentialsError('The first argument must be of type string ... Received '
                               'undefined (an auths entry without "auth")')
    username, _, password = base64.b64decode(auth).decode().partition(":")
    return username, password


def config_file(home: str | None = None) -> Path:
    """path.join(os.homedir(), '.docker', 'config.json'): Node's homedir() is $HOME."""
    return Path(home if home is not None else os.environ.get("HOME", "")) / ".docker" / \
        "config.json"


def get_registry_credentials(image_name: str, *, version: str = "0.7.2",
                             home: str | None = None) -> Credentials:
    if version not in VERSIONS:
        raise ValueError(f"no @sigstore/oci {version} here (one of {VERSIONS})")
    registry, _path = parse_image_name(image_name)
    path = config_file(home)
    try:
        content = path.read_text()
    except OSError:
        raise CredentialsError(f"No credential file found at {path}") from None
    config = json.loads(content)
    auths = config.get("auths") or {}
    if version == "0.6.0":
        key = next((k for k in auths if registry in k), registry)
        creds = auths.get(key)
    else:
        target = canonicalize(registry)
        key = next((k for k in auths if canonicalize(k) == target), None)
        creds = auths.get(key) if key is not None else None
    if not creds:
        raise CredentialsError(f"No credentials found for registry {registry}")
    username, password = from_basic_auth(creds.get("auth"))
    return Credentials(username, creds.get("identitytoken") or password,
                       dict(config.get("HttpHeaders") or {}))
