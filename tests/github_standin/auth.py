"""Who is calling, and how many calls they have left: tokens (personal and App installation), App
JWTs (RS256, checked against the public key the test hands over), installation tokens that
expire, and GitHub's per-identity hourly rate-limit windows.

Identity kinds follow GitHub: a login ending in `[bot]` is an App installation (it may create
check runs, it may not call GET /user); any other login is a person with a personal token.
"""

from __future__ import annotations

import base64
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jwt

from .errors import ApiError

JWT_MAX_LIFETIME = 600  # GitHub refuses an App JWT whose exp is more than 10 minutes after iat
HOUR = 3600


@dataclass(frozen=True)
class Identity:
    login: str
    kind: str  # "user" | "installation" | "app" | "anonymous"
    bucket: str  # the rate-limit window this caller spends from


@dataclass
class Window:
    limit: int
    used: int
    reset: float

    @property
    def remaining(self) -> int:
        return max(self.limit - self.used, 0)


@dataclass
class _Token:
    login: str
    kind: str
    expires_at: float | None


class Auth:
    def __init__(
        self,
        clock: Callable[[], float],
        token_users: dict[str, str],
        app: dict[str, Any] | None,
        token_lifetime: float,
        rate_limit: int,
    ):
        self.clock, self.app, self.token_lifetime, self.rate_limit = clock, app, token_lifetime, rate_limit
        self._lock = threading.Lock()
        self._tokens = {t: self._kind_of(login) for t, login in token_users.items()}
        self._windows: dict[str, Window] = {}

    def _kind_of(self, login: str, expires_at: float | None = None) -> _Token:
        return _Token(login, "installation" if login.endswith("[bot]") else "user", expires_at)

    # who is calling -------------------------------------------------------------------------

    def identify(self, authorization: str | None, want_jwt: bool = False) -> Identity:
        scheme, _, credential = (authorization or "").partition(" ")
        if not credential or scheme.lower() not in ("token", "bearer"):
            raise ApiError(401, "Requires authentication")
        if want_jwt:
            return self._app_identity(credential)
        with self._lock:
            token = self._tokens.get(credential)
        if token is None or (token.expires_at is not None and token.expires_at <= self.clock()):
            raise ApiError(401, "Bad credentials")
        if token.kind == "installation":
            iid = self.app["installation_id"] if self.app else 0
            return Identity(token.login, "installation", f"installation:{iid}")
        return Identity(token.login, "user", f"user:{token.login}")

    def from_basic(self, authorization: str | None) -> Identity | None:
        """git over HTTP: Basic auth with the token as password (or as user name), as on GitHub."""
        scheme, _, encoded = (authorization or "").partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            name, _, password = base64.b64decode(encoded).decode().partition(":")
        except ValueError:
            return None
        for credential in (password, name):
            try:
                return self.identify(f"token {credential}")
            except ApiError:
                continue
        return None

    def _app_identity(self, credential: str) -> Identity:
        if not self.app or not self.app.get("public_key"):
            raise ApiError(401, "A JSON web token could not be decoded")
        try:
            claims = jwt.decode(
                credential,
                self.app["public_key"],
                algorithms=["RS256"],
                options={"verify_exp": False, "verify_iat": False, "require": ["exp", "iat", "iss"]},
            )
        except jwt.PyJWTError:
            raise ApiError(401, "A JSON web token could not be decoded") from None
        if str(claims["iss"]) not in (str(self.app["id"]), self.app.get("client_id")):
            raise ApiError(401, "A JSON web token could not be decoded")
        if claims["exp"] <= self.clock():
            raise ApiError(
                401,
                "'Expiration time' claim ('exp') must be a numeric value representing the future "
                "time at which the assertion expires",
            )
        if claims["exp"] - claims["iat"] > JWT_MAX_LIFETIME:
            raise ApiError(401, "'Expiration time' claim ('exp') is too far in the future")
        return Identity(f"{self.app['slug']}[bot]", "app", f"app:{self.app['id']}")

    # tokens ---------------------------------------------------------------------------------

    def issue_installation_token(self) -> tuple[str, float]:
        assert self.app is not None
        token, expires_at = "ghs_" + secrets.token_hex(18), self.clock() + self.token_lifetime
        with self._lock:
            self._tokens[token] = _Token(f"{self.app['slug']}[bot]", "installation", expires_at)
        return token, expires_at

    def token_for(self, login: str) -> str:
        """A personal token of `login` (for the stand-in's human actions), made on first use."""
        with self._lock:
            for token, held in self._tokens.items():
                if held.login == login and held.expires_at is None:
                    return token
            token = "ghp_" + secrets.token_hex(18)
            self._tokens[token] = self._kind_of(login)
            return token

    # rate limits ----------------------------------------------------------------------------

    def window(self, identity: Identity | None) -> Window:
        bucket = identity.bucket if identity else "anonymous"
        with self._lock:
            window = self._windows.get(bucket)
            if window is None or window.reset <= self.clock():
                limit = self.rate_limit if identity else 60
                window = self._windows[bucket] = Window(limit, 0, self.clock() + HOUR)
            return window

    def spend(self, identity: Identity | None) -> None:
        window = self.window(identity)
        with self._lock:
            window.used += 1
