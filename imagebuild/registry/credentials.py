"""Registry credentials: arguments, then IMAGEBUILD_REGISTRY_USER/PASSWORD, then the Docker
config (auths, credHelpers, credsStore). They never appear in messages, logs or repr."""

from __future__ import annotations

import base64
import json
import logging
import os
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from imagebuild.errors import UserError

log = logging.getLogger(__name__)

USER_ENV = "IMAGEBUILD_REGISTRY_USER"
PASSWORD_ENV = "IMAGEBUILD_REGISTRY_PASSWORD"
CRED_FIX = (
    f"set {USER_ENV} and {PASSWORD_ENV} (or run `docker login <registry>`) "
    "to credentials this registry accepts"
)


@dataclass(frozen=True)
class Credentials:
    """Registry credentials. repr/str never show the secret."""

    username: str | None = None
    password: str | None = field(default=None, repr=False)
    identity_token: str | None = field(default=None, repr=False)  # OAuth refresh token
    source: str = "arguments"

    def __repr__(self) -> str:
        secret = "***" if (self.password or self.identity_token) else None
        return f"Credentials(username={self.username!r}, secret={secret}, source={self.source!r})"

    __str__ = __repr__


def _host_key(server: str) -> str:
    """'https://127.0.0.1:5000/v2/' and '127.0.0.1:5000' both -> '127.0.0.1:5000'."""
    server = server.strip()
    if "://" not in server:
        server = "//" + server
    return urlsplit(server).netloc.lower()


def docker_config_path(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    base = env.get("DOCKER_CONFIG") or str(Path.home() / ".docker")
    return Path(base) / "config.json"


def _run_helper(helper: str, server: str) -> dict[str, Any] | None:
    try:
        proc = subprocess.run(
            [f"docker-credential-{helper}", "get"],
            input=server,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        log.debug("credential helper docker-credential-%s unavailable", helper)
        return None
    if proc.returncode != 0:  # "credentials not found": not an error for us
        return None
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def docker_config_credentials(
    host: str,
    config_path: Path | None = None,
    run_helper: Callable[[str, str], dict[str, Any] | None] = _run_helper,
) -> Credentials | None:
    """Credentials for `host` from a Docker config.json: credHelpers, auths, credsStore."""
    path = config_path or docker_config_path()
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise UserError(
            f"cannot read Docker config {path}: {type(exc).__name__}",
            fix="repair the JSON or point DOCKER_CONFIG at another directory",
        ) from None
    want = _host_key(host)
    auths = {_host_key(k): (k, v) for k, v in (config.get("auths") or {}).items()}
    helpers = {_host_key(k): v for k, v in (config.get("credHelpers") or {}).items()}
    source = f"docker config {path}"

    def from_helper(helper: str) -> Credentials | None:
        server = auths.get(want, (want, None))[0]
        data = run_helper(helper, server)
        if not data or not data.get("Secret"):
            return None
        user = data.get("Username")
        if user == "<token>":  # helpers hand identity tokens back under this name
            return Credentials(None, None, data["Secret"], f"docker-credential-{helper}")
        return Credentials(user, data["Secret"], None, f"docker-credential-{helper}")

    if want in helpers:
        return from_helper(helpers[want])
    entry = auths.get(want, (None, None))[1]
    if isinstance(entry, dict):
        if entry.get("identitytoken"):
            return Credentials(entry.get("username"), None, entry["identitytoken"], source)
        if entry.get("auth"):
            try:
                user, colon, pw = base64.b64decode(entry["auth"]).decode().partition(":")
                if not colon:
                    raise ValueError("no colon")
            except (ValueError, UnicodeDecodeError):
                raise UserError(
                    f"{source}: the 'auth' entry for {want} is not base64 'user:password'",
                    fix=f"run `docker login {want}` again",
                ) from None
            return Credentials(user, pw, None, source)
        if entry.get("username") and entry.get("password"):
            return Credentials(entry["username"], entry["password"], None, source)
    if config.get("credsStore"):
        return from_helper(config["credsStore"])
    return None


def resolve_credentials(
    host: str,
    username: str | None = None,
    password: str | None = None,
    env: Mapping[str, str] | None = None,
    config_path: Path | None = None,
) -> Credentials | None:
    """Arguments first, then the env vars, then the Docker config; None if nothing."""
    env = os.environ if env is None else env
    if username is not None or password is not None:
        return Credentials(username, password, None, "arguments")
    if env.get(USER_ENV) or env.get(PASSWORD_ENV):
        return Credentials(env.get(USER_ENV), env.get(PASSWORD_ENV), None, "environment")
    return docker_config_credentials(host, config_path or docker_config_path(env))


def docker_auth_config(creds: Credentials | None, host: str) -> dict[str, str] | None:
    """The auth_config the Docker engine takes with a push or pull of `host`'s images."""
    if creds is None:
        return None  # dockerd gets nothing; docker-py falls back to the Docker config
    if creds.identity_token:
        return {"identitytoken": creds.identity_token, "serveraddress": host}
    return {"username": creds.username or "", "password": creds.password or "",
            "serveraddress": host}
