"""Answering a registry's challenge: HTTP basic, or the bearer-token flow (a token fetched
from the realm per scope, cached until it expires, an identity token exchanged for one)."""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit

import requests

from imagebuild.errors import OperationFailed
from imagebuild.registry import documents
from imagebuild.registry.credentials import CRED_FIX, Credentials
from imagebuild.registry.errors import AuthError, RegistryFault
from imagebuild.safetext import safe

Transport = Callable[..., requests.Response]


@dataclass(frozen=True)
class Challenge:
    scheme: str  # lower-case: "basic" or "bearer"
    params: dict[str, str]


def parse_challenges(header: str) -> list[Challenge]:
    """Parse a WWW-Authenticate header (RFC 7235); quoted values may hold commas."""
    token = re.compile(
        r"\s*(?:(?P<scheme>[A-Za-z][\w.-]*)(?=\s+[\w-]+\s*=|\s*(?:,|$))"
        r'|(?P<key>[\w-]+)\s*=\s*(?P<val>"(?:[^"\\]|\\.)*"|[^,\s]*))\s*,?'
    )
    out: list[Challenge] = []
    pos = 0
    while pos < len(header):
        m = token.match(header, pos)
        if not m or m.end() == pos:
            break
        pos = m.end()
        if m.group("scheme"):
            out.append(Challenge(m.group("scheme").lower(), {}))
        elif out:
            val = m.group("val")
            if val.startswith('"'):
                val = re.sub(r"\\(.)", r"\1", val[1:-1])
            out[-1].params[m.group("key").lower()] = val
    return out


class Auth:
    """The auth state of one client: credentials, the scheme the registry asked for,
    tokens per scope. `transport(method, url, *, headers, data, kind, idempotent)` sends
    the token requests (the client's retrying transport)."""

    def __init__(self, host: str, creds: Credentials | None, token: str | None,
                 transport: Transport):
        self.host = host
        self.creds = creds
        self.static_token = token
        self.scheme: str | None = "bearer" if token else None  # learnt from challenges
        self.tokens: dict[str, tuple[str, float]] = {}  # scope -> (token, expiry)
        self.challenge: Challenge | None = None
        self.transport = transport


    def secrets(self) -> list[str]:
        vals = [self.static_token, *(t for t, _ in self.tokens.values())]
        if self.creds:
            vals += [self.creds.password, self.creds.identity_token]
        return [v for v in vals if v]

    def mask(self, text: str) -> str:
        for secret in self.secrets():
            text = text.replace(secret, "***")
        return text

    def who(self) -> str:
        if not self.creds or not (self.creds.password or self.creds.identity_token):
            return "without credentials"
        return f"as user {self.creds.username!r} (credentials from {self.creds.source})"

    def basic_header(self) -> str | None:
        if not self.creds or self.creds.password is None:
            return None
        raw = f"{self.creds.username or ''}:{self.creds.password}".encode()
        return "Basic " + base64.b64encode(raw).decode()

    def auth_header(self, scope: str | None) -> str | None:
        if self.scheme == "basic":
            return self.basic_header()
        if self.scheme == "bearer":
            key = scope or ""
            cached = self.tokens.get(key)
            if cached and cached[1] > time.monotonic():
                return f"Bearer {cached[0]}"
            if self.static_token:
                return f"Bearer {self.static_token}"
        return None

    def fetch_token(self, challenge: Challenge, scope: str | None) -> None:
        realm = challenge.params.get("realm")
        if not realm:
            raise OperationFailed(
                f"registry {self.host} sent a Bearer challenge without a realm",
                fix="the registry's token auth is misconfigured",
            )
        # the challenge's scope is what the server wants; ours covers calls made before one
        # (a scope of several, space-separated, goes as one `scope` parameter each)
        scopes = sorted({s for x in (challenge.params.get("scope"), scope) if x
                         for s in x.split()})
        query: list[tuple[str, str]] = []
        if challenge.params.get("service"):
            query.append(("service", challenge.params["service"]))
        query += [("scope", s) for s in scopes]
        creds = self.creds
        if creds and creds.identity_token:
            form = dict(query)
            form.update(
                grant_type="refresh_token",
                refresh_token=creds.identity_token,
                client_id="imagebuild",
            )
            resp = self.transport(
                "POST",
                realm,
                data=urlencode(form).encode(),
                headers={"Content-Type": "application/x-www-form-urlencoded"},
                kind="token",
                idempotent=True,
            )
        else:
            headers = {}
            basic = self.basic_header()
            if basic:
                headers["Authorization"] = basic
            url = realm + ("&" if "?" in realm else "?") + urlencode(query)
            resp = self.transport("GET", url, headers=headers, kind="token", idempotent=True)
        if resp.status_code in (401, 403):
            raise AuthError(
                f"token server {safe(urlsplit(realm).netloc, 100)} refused a token for "
                f"{' '.join(scopes) or 'the registry'} {self.who()} (HTTP {resp.status_code})",
                fix=CRED_FIX,
            )
        if resp.status_code != 200:
            raise OperationFailed(
                f"token server {safe(urlsplit(realm).netloc, 100)} answered HTTP "
                f"{resp.status_code}",
                fix="retry later; check the registry's status",
            )
        tok, ttl = documents.token(resp.content, urlsplit(realm).netloc,
                                   f"a token for {' '.join(scopes) or 'the registry'}")
        # renew a little early so a token never expires between check and use
        self.tokens[scope or ""] = (tok, time.monotonic() + max(1.0, ttl - 5))

    def answer_challenge(self, resp: requests.Response, scope: str | None) -> bool:
        """Prepare auth for a retry after a 401; False when retrying cannot help."""
        challenges = parse_challenges(resp.headers.get("WWW-Authenticate", ""))
        bearer = next((c for c in challenges if c.scheme == "bearer"), None)
        basic = next((c for c in challenges if c.scheme == "basic"), None)
        if bearer:
            first = self.challenge.params.get("realm") if self.challenge else None
            if first is not None and bearer.params.get("realm") != first:
                # credentials go to the realm the registry's first challenge named, only
                raise RegistryFault(
                    self.host, f"a challenge naming the token server "
                    f"{safe(bearer.params.get('realm'), 120)!r} after {safe(first, 120)!r}",
                    "authentication", fix="no credentials were sent to the new token "
                    "server; check the registry's auth configuration (or who answers for it)")
            self.scheme = "bearer"
            self.challenge = bearer
            self.tokens.pop(scope or "", None)
            self.fetch_token(bearer, scope)
            return True
        if basic and self.basic_header():
            already = self.scheme == "basic"
            self.scheme = "basic"
            return not already
        return False

    def header_for(self, scope: str | None) -> str | None:
        """The Authorization header for a request of `scope`, fetching a token for a new
        scope from the realm the registry named before (alone, not the old scope)."""
        auth = self.auth_header(scope)
        if self.scheme == "bearer" and not auth and self.challenge:
            params = {k: v for k, v in self.challenge.params.items() if k != "scope"}
            self.fetch_token(Challenge("bearer", params), scope)
            auth = self.auth_header(scope)
        return auth
