"""One connection to GitHub for the whole service: how the bot signs in, what it does when GitHub or
the network fails, how fast it writes, and when GitHub last answered. What it needs to know
(GitHubSettings: the repository, the API, how to sign in) the app gives it, built from the
service's settings (bot.app.settings).

Signing in. With AUTORESEARCH_GITHUB_TOKEN the bot is the token's user (github.Auth.Token); it has
no check runs then, and reports with commit statuses instead (`uses_app` is False). As a GitHub App
it signs a JWT with the App's key (github.Auth.AppAuth: RS256, iss = the app id, 5 minutes), finds
the App's installation on the repository unless AUTORESEARCH_GITHUB_INSTALLATION_ID names it, and
acts as that installation with an hour-long token that PyGithub fetches and renews
(github.Auth.AppInstallationAuth). PyGithub renews it only 20 s before it expires (github/Auth.py,
ACCESS_TOKEN_REFRESH_THRESHOLD_SECONDS and AppInstallationAuth._is_expired). A request keeps the
Authorization header it started with through all of its retries, and a retry may wait out a rate
limit for up to MAX_RATE_LIMIT_WAIT_S, so RenewingInstallationAuth renews RENEW_BEFORE ahead (that
longest wait plus 5 minutes) instead: no request starts with a token that could expire under it.

Retrying (GitHubRetry, a github.GithubRetry). Whether a failed request may be sent again depends on
whether GitHub may already have acted on it:
- The connection never opened: nothing was sent, so any method is retried (urllib3's connect errors).
- A 5xx answer, a timeout or a dropped connection after the request went out: GitHub may have done
  the work and failed only to say so. GET, HEAD, PUT, PATCH and DELETE leave the same state however
  often they are applied, so they are retried with exponential backoff (the one PUT the bot sends,
  a file's contents with the blob sha it replaces, cannot apply twice: GitHub answers a repeat 409,
  which bot.github.forge resolves by reading the branch). A POST creates something
  each time it is applied: a 502 from "create a check run" or "create a comment" can come after the
  check run or the comment exists, and sending it again would create a second one. So a POST is not
  retried on these; the GithubException reaches the caller, which looks for its content by marker or
  external_id before creating it again (each writer names the key it relies on).
- 403 or 429 that say "rate limit" (a Retry-After header, x-ratelimit-remaining: 0 with
  x-ratelimit-reset, or the secondary-limit message in the body): GitHub refused the request without
  acting on it, so every method, POST included, waits as long as GitHub asks and tries again. A
  wait longer than MAX_RATE_LIMIT_WAIT_S raises RateLimitExceededExceedsMaxWait at once instead,
  so the caller can come back later rather than hold a thread for an hour. Every wait is logged.
GithubRetry already reads the body of a 403 for the rate-limit messages and waits for
x-ratelimit-reset or 60 s (github/GithubRetry.py, increment). But by default it also retries POST
on every 5xx (allowed_methods gets POST added), retries a 429 only when it carries Retry-After,
turns retries that run out into requests' RetryError instead of GitHub's answer, and sleeps with
urllib3's time.sleep, which no test can move. GitHubRetry keeps the body check and changes the rest.

Pacing. GitHub's secondary limits allow about 80 content-creating requests a minute and 500 an hour.
The client's write budget (bot.github.budget, `budget`) counts them in the store's ledger (the
settings' `ledger_path`): pace_write(what), called before each write the research needs (the
forge's branches and merges, the Actions runner's dispatches), records it and never waits; the
publisher waits for room in the budget itself, on its own thread. The service's other clients (the
poller's, the publishing worker's: each needs a connection of its own) share the first one's
budget (`budget=`), so every write is counted in one budget. PyGithub's fixed gaps
(seconds_between_requests/writes) are turned off: the windows are what GitHub counts, and the gaps
would sleep on a clock no test can move.

Health. urllib3 shows the Retry object every answer (Retry.is_retry, called on each response) and
every transport error (Retry.increment), for every connection PyGithub opens with this client's
retry policy, the App's token requests included. GitHubRetry notes them in a Contact, which is how
`last_contact` and `last_error` stay current without patching anything inside PyGithub.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import github
from github import Auth, GithubException, GithubIntegration, GithubRetry
from github.Auth import AppInstallationAuth
from github.GithubException import RateLimitExceededExceedsMaxWait
from github.InstallationAuthorization import InstallationAuthorization
from github.Repository import Repository
from pydantic import SecretStr
from urllib3.exceptions import InvalidHeader
from urllib3.util import Retry

from bot.core.errors import ConfigError
from bot.github.budget import WriteBudget, open_ledger

log = logging.getLogger(__name__)

SAFE_TO_REPEAT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "PATCH", "DELETE"})  # idempotent methods
RATE_LIMITED = frozenset({403, 429})
RETRIES = 5  # attempts after the first; backoff 0, 2, 4, 8, 16 s (1 s factor, 30 s cap)
BACKOFF_FACTOR_S = 1.0
BACKOFF_MAX_S = 30.0
MAX_RATE_LIMIT_WAIT_S = 15 * 60  # a longer wait raises RateLimitExceededExceedsMaxWait
SECONDARY_RATE_WAIT_S = 60.0  # GitHub: without Retry-After, wait at least a minute
RENEW_BEFORE = timedelta(seconds=MAX_RATE_LIMIT_WAIT_S + 5 * 60)
USER_AGENT = "autoresearch-bot"


@dataclass(frozen=True)
class GitHubSettings:
    """Where GitHub is, which repository, and how to sign in: with `token`, or as the App `app_id`
    whose PEM key `private_key()` reads when it is first needed (ConfigError when it cannot)."""

    repository: str  # owner/name
    api_url: str = "https://api.github.com"
    request_timeout_s: float = 15.0
    token: SecretStr | None = None
    app_id: int | None = None
    installation_id: int | None = None  # None: asked of GitHub
    private_key: Callable[[], str] | None = field(default=None, repr=False)
    ledger_path: Path | None = None  # the store whose ledger counts the writes (None: counted in memory only)

    @property
    def uses_app(self) -> bool:
        """True: the bot signs in as a GitHub App; False: as the user of a personal access token."""
        return self.app_id is not None


class Contact:
    """When GitHub last answered and what last went wrong; shared by every retry object of one client."""

    def __init__(self, wall: Callable[[], float] = time.time) -> None:
        self._wall = wall
        self.last_contact: float | None = None
        self.last_error: str | None = None
        self.last_error_at: float | None = None

    def answered(self, method: str, status: int) -> None:
        # a 404 or 422 is GitHub answering a question; 401/403/429 and 5xx mean the bot is not being served
        if status < 500 and status not in (401, 403, 429):
            self.last_contact = self._wall()
        else:
            self.failed(f"{method} answered HTTP {status}")

    def failed(self, what: str) -> None:
        self.last_error = what
        self.last_error_at = self._wall()


class GitHubRetry(GithubRetry):
    """GithubRetry with the rules in the module docstring: idempotent methods only on 5xx and lost
    answers, every method on a proven rate limit (429 too), waits through an injectable sleep."""

    def __init__(
        self, *, contact: Contact | None = None, sleep: Callable[[float], None] = time.sleep, **kwargs: Any
    ) -> None:
        kwargs.setdefault("allowed_methods", SAFE_TO_REPEAT)
        # GithubRetry appends 403 itself, on every copy: keep the list from growing with each retry
        kwargs["status_forcelist"] = [s for s in kwargs.get("status_forcelist", [429, *range(500, 600)]) if s != 403]
        kwargs.setdefault("secondary_rate_wait", SECONDARY_RATE_WAIT_S)
        kwargs.setdefault("max_rate_limit_wait", MAX_RATE_LIMIT_WAIT_S)
        kwargs.setdefault("raise_on_status", False)  # out of retries: PyGithub raises its GithubException
        super().__init__(**kwargs)
        self.contact = contact if contact is not None else Contact()
        self._sleep = sleep
        self.wait_s: float | None = None  # how long GitHub asked to wait before this attempt, when it said

    def new(self, **kw: Any) -> GitHubRetry:
        kw.setdefault("contact", self.contact)
        kw.setdefault("sleep", self._sleep)
        return super().new(**kw)

    def is_retry(self, method: str, status_code: int, has_retry_after: bool = False) -> bool:
        self.contact.answered(method, status_code)  # urllib3 calls this on every response
        if status_code in RATE_LIMITED:
            return True  # any method: increment() retries only a proven rate limit and raises otherwise
        return super().is_retry(method, status_code, has_retry_after)

    def increment(
        self,
        method: str | None = None,
        url: str | None = None,
        response: Any = None,
        error: Exception | None = None,
        _pool: Any = None,
        _stacktrace: Any = None,
    ) -> Retry:
        where = f"{method} {_path(url)}"
        if response is None:
            self.contact.failed(f"{where}: {type(error).__name__ if error else 'no answer'}")
            return super().increment(method, url, response, error, _pool, _stacktrace)
        self.contact.failed(f"{where}: HTTP {response.status}")
        asked = self._asked_wait(response)
        if asked is not None and asked > self.max_rate_limit_wait and response.status not in RATE_LIMITED:
            asked = self.max_rate_limit_wait  # a 503's Retry-After: wait the most, then the request may fail
        if asked is not None and asked > self.max_rate_limit_wait:
            log.warning(
                "GitHub asks to wait %.0f s before %s again, more than the %.0f s this bot waits "
                "inside one request: giving up on it for now",
                asked,
                where,
                self.max_rate_limit_wait,
            )
            raise RateLimitExceededExceedsMaxWait(
                response.status, _json_body(response, url), dict(response.headers), wait=asked
            )
        if asked is not None and response.status in RATE_LIMITED:
            # the headers prove the refusal; GithubRetry would look in the body (and not at all for a 429)
            retry = Retry.increment(self, method, url, response, error, _pool, _stacktrace)
        else:
            # 5xx: counted; 403 without such headers: GithubRetry reads the body for a rate-limit
            # message (then sets its wait) and raises the GithubException for any other 403
            retry = super().increment(method, url, response, error, _pool, _stacktrace)
        if asked is not None:
            retry.wait_s = max(asked, retry.get_backoff_time())
        return retry

    def _asked_wait(self, response: Any) -> float | None:
        """Seconds GitHub's headers ask for (Retry-After, or the primary limit's reset), or None; a 429
        that names no time gets SECONDARY_RATE_WAIT_S, as GitHub's documentation asks."""
        headers = response.headers
        if headers.get("Retry-After"):
            try:
                return float(self.parse_retry_after(headers["Retry-After"]))
            except InvalidHeader:
                log.info("GitHub sent an unreadable Retry-After header: %r", headers["Retry-After"])
        reset = headers.get("x-ratelimit-reset", "")
        if response.status in RATE_LIMITED and headers.get("x-ratelimit-remaining") == "0" and reset.isdigit():
            return max(0.0, int(reset) - time.time()) + 1.0  # +1: the reset happens somewhere in that second
        if response.status == 429:
            return self.secondary_rate_wait
        return None

    def sleep(self, response: Any = None) -> None:
        wait = self.wait_s if self.wait_s is not None else self.get_backoff_time()
        if wait <= 0:
            return
        last = self.history[-1] if self.history else None
        if last is not None:
            why = f"HTTP {last.status}" if last.status else type(last.error).__name__
            log.warning("GitHub: %s on %s %s; trying again in %.1f s", why, last.method, _path(last.url), wait)
        self._sleep(wait)


def retry_policy(*, contact: Contact | None = None, sleep: Callable[[float], None] = time.sleep) -> Retry:
    """The retry rules for every request to GitHub (see the module docstring)."""
    return GitHubRetry(
        total=RETRIES, backoff_factor=BACKOFF_FACTOR_S, backoff_max=BACKOFF_MAX_S, contact=contact, sleep=sleep
    )


class RenewingInstallationAuth(AppInstallationAuth):
    """AppInstallationAuth that renews the installation token `renew_before` ahead of its expiry
    instead of PyGithub's 20 s; one renewal at a time."""

    def __init__(
        self,
        app_auth: Auth.AppAuth,
        installation_id: int,
        *,
        renew_before: timedelta = RENEW_BEFORE,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        super().__init__(app_auth, installation_id)
        self._renew_before = renew_before
        self._now = now
        self._authorization: InstallationAuthorization | None = None
        self._renewal = threading.Lock()

    @property
    def token(self) -> str:
        with self._renewal:
            current = self._authorization
            if current is None or current.expires_at - self._renew_before <= self._now():
                current = self._authorization = self._get_installation_authorization()
                log.info(
                    "GitHub: new token for installation %s, valid until %s",
                    self.installation_id,
                    current.expires_at.isoformat(),
                )
            return current.token


class GitHubClient:
    """The service's connection to GitHub: `gh` for API calls on the repository, `repo()`, who the bot
    is (`bot_login`), the write budget, and health. Nothing is asked of GitHub until first needed."""

    def __init__(
        self,
        settings: GitHubSettings,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        budget: WriteBudget | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        """`budget`: another client's write budget, to share (none is opened then); otherwise one on
        the settings' ledger, whose waits end when `stop` is set (see bot.github.budget)."""
        self.settings = settings
        self.uses_app: bool = settings.uses_app  # check runs need an App; with a token: commit statuses
        self._contact = Contact()
        self._retry = retry_policy(contact=self._contact, sleep=sleep)
        if budget is None:
            ledger = open_ledger(settings.ledger_path) if settings.ledger_path is not None else None
            budget = WriteBudget(ledger, clock=clock, sleep=sleep, stop=stop)
        self.budget = budget
        self._lock = threading.RLock()
        self._gh: github.Github | None = None
        self._integration: GithubIntegration | None = None
        self._app_credentials: Auth.AppAuth | None = None
        self._repo: Repository | None = None
        self._bot_login: str | None = None
        _redact_tokens_in_pygithub_logs()

    # --- the connection ---------------------------------------------------------------------------

    @property
    def gh(self) -> github.Github:
        with self._lock:
            if self._gh is None:
                self._gh = github.Github(auth=self._auth(), **self._connection())
            return self._gh

    def repo(self) -> Repository:
        """The repository, fetched once."""
        with self._lock:
            if self._repo is None:
                self._repo = self.gh.get_repo(self.settings.repository)
            return self._repo

    @property
    def bot_login(self) -> str:
        """The login the bot's own comments, commits and check runs carry: "<app slug>[bot]" for an
        App (GET /app), the token's user otherwise (GET /user)."""
        with self._lock:
            if self._bot_login is None:
                if self.uses_app:
                    self._bot_login = f"{self._app().get_app().slug}[bot]"
                else:
                    self._bot_login = self.gh.get_user().login
            return self._bot_login

    def pace_write(self, what: str = "write") -> None:
        """Call before each content-creating request the research needs (POST, PATCH, PUT, DELETE):
        it is counted in the write budget, never waited for (see bot.github.budget)."""
        self.budget.charge(what)

    def close(self) -> None:
        with self._lock:
            for connection in (self._gh, self._integration):
                if connection is not None:
                    connection.close()
            self._gh = self._integration = self._repo = None

    # --- health -----------------------------------------------------------------------------------

    @property
    def last_contact(self) -> float | None:
        """Wall time of GitHub's last answer (not a 5xx, 401, 403 or 429), or None."""
        return self._contact.last_contact

    @property
    def last_error(self) -> str | None:
        return self._contact.last_error

    def health(self) -> dict[str, Any]:
        remaining = None
        if self._gh is not None:  # never a request just to fill this in
            known = self._gh.requester.rate_limiting[0]
            remaining = known if known >= 0 else None
        return {
            "github_last_contact": self.last_contact,
            "github_last_error": self.last_error,
            "github_last_error_at": self._contact.last_error_at,
            "rate_limit_remaining": remaining,
        }

    # --- signing in -------------------------------------------------------------------------------

    def _connection(self) -> dict[str, Any]:
        return dict(
            base_url=self.settings.api_url.rstrip("/"),
            timeout=max(1, round(self.settings.request_timeout_s)),  # PyGithub asserts an int
            user_agent=USER_AGENT,
            retry=self._retry,
            seconds_between_requests=None,
            seconds_between_writes=None,
        )

    def _auth(self) -> Auth.Auth:
        if not self.uses_app:
            assert self.settings.token is not None  # the service's settings require one way to sign in
            return Auth.Token(self.settings.token.get_secret_value())
        installation_id = self.settings.installation_id or self._find_installation()
        return RenewingInstallationAuth(self._app_auth(), installation_id)

    def _app_auth(self) -> Auth.AppAuth:
        """The App's own credentials (it signs a fresh JWT for each request), read from the key once."""
        with self._lock:
            if self._app_credentials is None:
                assert self.settings.app_id is not None and self.settings.private_key is not None
                self._app_credentials = Auth.AppAuth(self.settings.app_id, self.settings.private_key())
            return self._app_credentials

    def _app(self) -> GithubIntegration:
        """GitHub as the App itself (JWT): its installations and its own description."""
        with self._lock:
            if self._integration is None:
                self._integration = GithubIntegration(auth=self._app_auth(), **self._connection())
            return self._integration

    def _find_installation(self) -> int:
        owner, name = self.settings.repository.split("/")
        try:
            return self._app().get_repo_installation(owner, name).id
        except GithubException as error:
            if error.status == 404:
                raise ConfigError(
                    f"the GitHub App {self.settings.app_id} is not installed on "
                    f"{self.settings.repository}: install it (the App's page, Install App) with access "
                    "to that repository, or check AUTORESEARCH_REPOSITORY"
                ) from None
            if error.status == 401:
                raise ConfigError(
                    "GitHub refused the App's signature (HTTP 401): check AUTORESEARCH_GITHUB_APP_ID "
                    "and that the private key is the App's current one"
                ) from None
            raise


def _path(url: str | None) -> str:
    """The path of a request URL for messages: no host, no query string."""
    return urlparse(url or "").path or "?"


def _json_body(response: Any, url: str | None) -> Any:
    try:
        return json.loads(GithubRetry.get_content(response, url or ""))
    except (ValueError, OSError):  # not JSON, or the body could not be read: the status still says it
        return None


_TOKEN_IN_BODY = re.compile(r'("token"\s*:\s*")[^"]+(")')


class _RedactTokens(logging.Filter):
    """PyGithub's DEBUG log shows response bodies, and the body of POST .../access_tokens is the
    installation token; this filter masks it (the Authorization header PyGithub masks itself)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if '"token"' in message:
            record.msg, record.args = _TOKEN_IN_BODY.sub(r"\1(removed)\2", message), None
        return True


def _redact_tokens_in_pygithub_logs() -> None:
    requester_log = logging.getLogger("github.Requester")
    if not any(isinstance(f, _RedactTokens) for f in requester_log.filters):
        requester_log.addFilter(_RedactTokens())
