"""The GitHub connection against a real HTTP server on 127.0.0.1 answering as GitHub does: which
failures are retried (a POST only when GitHub proves it did not act), how long rate limits are
waited out (sleep injected: nothing here really waits for them), write pacing on an injected clock,
App sign-in with a JWT and early token renewal, the bot's login, and health."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
import pytest
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from github import GithubException
from github.GithubException import RateLimitExceededExceedsMaxWait
from pydantic import SecretStr

from bot.core.errors import ConfigError
from bot.github.client import GitHubClient, GitHubSettings, retry_policy

REPO_JSON = {
    "id": 1,
    "name": "r",
    "full_name": "o/r",
    "owner": {"login": "o", "type": "User"},
    "default_branch": "main",
    "url": "http://placeholder/repos/o/r",
}
ISSUE_JSON = {"id": 10, "number": 1, "title": "hello", "state": "open"}
SECONDARY = {
    "message": "You have exceeded a secondary rate limit. Please wait a few minutes before you try again.",
    "documentation_url": "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api",
}
PRIMARY = {
    "message": "API rate limit exceeded for installation ID 7.",
    "documentation_url": "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api",
}


# --- a stand-in for GitHub ------------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    body: object = None
    headers: dict = field(default_factory=dict)
    delay_s: float = 0.0  # answer late (for timeouts)


@dataclass
class Seen:
    method: str
    path: str
    headers: dict
    body: bytes


class StandIn:
    """Scripted answers per "METHOD /path": each request takes the next one, the last one repeats."""

    def __init__(self) -> None:
        self.script: dict[str, list[Answer]] = {}
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        self.url = ""

    def on(self, route: str, *answers: Answer) -> None:
        self.script[route] = list(answers)

    def requests(self, route: str) -> list[Seen]:
        method, path = route.split(" ", 1)
        return [s for s in self.seen if s.method == method and s.path == path]

    def answer(self, method: str, path: str, headers: dict, body: bytes) -> Answer:
        with self.lock:
            self.seen.append(Seen(method, path, headers, body))
            answers = self.script.get(f"{method} {path}")
            if not answers:
                return Answer(404, {"message": "Not Found"})
            return answers.pop(0) if len(answers) > 1 else answers[0]


def _handler(stand_in: StandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            answer = stand_in.answer(self.command, self.path.split("?")[0], dict(self.headers), body)
            if answer.delay_s:
                time.sleep(answer.delay_s)
            payload = json.dumps(answer.body).encode() if answer.body is not None else b""
            self.send_response(answer.status)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(payload)))
            for name, value in answer.headers.items():
                self.send_header(name, str(value))
            self.end_headers()
            try:
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up waiting (timeout tests)
                pass

        do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _serve

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@pytest.fixture
def github_standin() -> Iterator[StandIn]:
    stand_in = StandIn()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(stand_in))
    server.daemon_threads = True
    stand_in.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield stand_in
    server.shutdown()
    server.server_close()


class Sleeps:
    """An injected sleep: records what was asked and returns at once."""

    def __init__(self) -> None:
        self.asked: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.asked.append(seconds)


def token_settings(url: str, **extra: Any) -> GitHubSettings:
    values: dict[str, Any] = dict(repository="o/r", token=SecretStr("ghp_secret_token_value"), api_url=url)
    return GitHubSettings(**{**values, **extra})


def token_client(stand_in: StandIn, **extra: Any) -> tuple[GitHubClient, Sleeps]:
    sleeps = Sleeps()
    return GitHubClient(token_settings(stand_in.url, **extra), sleep=sleeps), sleeps


def lazy_repo(client: GitHubClient):
    """The repository without fetching it: the test's POST is the first request."""
    return client.gh.withLazy(True).get_repo("o/r")


# --- what is retried --------------------------------------------------------------------------------


def test_a_get_answered_502_twice_then_200_succeeds_on_the_third_request(github_standin):
    github_standin.on(
        "GET /repos/o/r", Answer(502, {"message": "Bad Gateway"}), Answer(502, {"message": "x"}), Answer(200, REPO_JSON)
    )
    client, sleeps = token_client(github_standin)

    assert client.repo().full_name == "o/r"
    assert len(github_standin.requests("GET /repos/o/r")) == 3
    assert sleeps.asked == [2.0]  # urllib3's backoff: the first retry at once, then 2 s, 4 s, ...
    assert "502" in client.last_error


def test_a_post_answered_502_is_not_sent_again(github_standin):
    github_standin.on("POST /repos/o/r/issues", Answer(502, {"message": "Bad Gateway"}))
    client, sleeps = token_client(github_standin)
    repo = lazy_repo(client)

    with pytest.raises(GithubException) as raised:
        repo.create_issue("hello")
    assert raised.value.status == 502
    assert len(github_standin.requests("POST /repos/o/r/issues")) == 1  # it may exist: the caller looks first
    assert sleeps.asked == []


def test_a_post_refused_by_the_secondary_limit_waits_retry_after_and_is_sent_again(github_standin):
    github_standin.on("POST /repos/o/r/issues", Answer(403, SECONDARY, {"Retry-After": "1"}), Answer(201, ISSUE_JSON))
    client, sleeps = token_client(github_standin)

    issue = lazy_repo(client).create_issue("hello")

    assert issue.number == 1
    assert len(github_standin.requests("POST /repos/o/r/issues")) == 2
    assert sleeps.asked == [1.0]


def test_a_secondary_limit_message_without_retry_after_waits_a_minute(github_standin):
    github_standin.on("POST /repos/o/r/issues", Answer(403, SECONDARY), Answer(201, ISSUE_JSON))
    client, sleeps = token_client(github_standin)

    lazy_repo(client).create_issue("hello")

    assert sleeps.asked == [60.0]


@pytest.mark.parametrize("status", [403, 429])
def test_an_exhausted_primary_limit_waits_until_x_ratelimit_reset(github_standin, status):
    reset = int(time.time()) + 30
    github_standin.on(
        "POST /repos/o/r/issues",
        Answer(status, PRIMARY, {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(reset)}),
        Answer(201, ISSUE_JSON),
    )
    client, sleeps = token_client(github_standin)

    lazy_repo(client).create_issue("hello")

    assert len(sleeps.asked) == 1 and 28 <= sleeps.asked[0] <= 32  # reset - now, plus 1 s
    assert len(github_standin.requests("POST /repos/o/r/issues")) == 2


def test_a_rate_limit_longer_than_fifteen_minutes_raises_at_once(github_standin):
    reset = int(time.time()) + 3600
    github_standin.on(
        "GET /repos/o/r", Answer(403, PRIMARY, {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(reset)})
    )
    client, sleeps = token_client(github_standin)

    with pytest.raises(RateLimitExceededExceedsMaxWait) as raised:
        client.repo()
    assert raised.value.wait > 3500
    assert sleeps.asked == [] and len(github_standin.requests("GET /repos/o/r")) == 1


def test_a_403_that_is_not_a_rate_limit_is_not_retried(github_standin):
    github_standin.on("POST /repos/o/r/issues", Answer(403, {"message": "Resource not accessible by integration"}))
    client, sleeps = token_client(github_standin)

    with pytest.raises(GithubException) as raised:
        lazy_repo(client).create_issue("hello")
    assert raised.value.status == 403
    assert len(github_standin.requests("POST /repos/o/r/issues")) == 1 and sleeps.asked == []


def test_a_get_that_times_out_is_retried_and_a_post_is_not(github_standin):
    github_standin.on("GET /repos/o/r", Answer(200, REPO_JSON, delay_s=1.6), Answer(200, REPO_JSON))
    github_standin.on("POST /repos/o/r/issues", Answer(201, ISSUE_JSON, delay_s=1.6))
    client, _ = token_client(github_standin, request_timeout_s=1)

    assert client.repo().full_name == "o/r"
    assert len(github_standin.requests("GET /repos/o/r")) == 2
    with pytest.raises(requests.exceptions.ReadTimeout):
        lazy_repo(client).create_issue("hello")
    assert len(github_standin.requests("POST /repos/o/r/issues")) == 1
    assert "Timeout" in client.last_error


def test_a_connection_that_never_opens_is_retried_even_for_a_post(github_standin):
    sleeps = Sleeps()
    client = GitHubClient(token_settings("http://127.0.0.1:9"), sleep=sleeps)  # the discard port: refused

    with pytest.raises(requests.exceptions.ConnectionError):
        lazy_repo(client).create_issue("hello")
    assert sleeps.asked == [2.0, 4.0, 8.0, 16.0]  # five retries: nothing was ever sent
    assert "NewConnectionError" in client.last_error and client.last_contact is None


def test_the_retry_policy_repeats_only_idempotent_methods_on_5xx():
    policy = retry_policy()
    for method in ("GET", "HEAD", "PUT", "PATCH", "DELETE"):
        assert policy.is_retry(method, 502)
    assert not policy.is_retry("POST", 502)
    assert policy.is_retry("POST", 429) and policy.is_retry("POST", 403)  # then only a proven rate limit


# --- pacing ---------------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_pace_write_counts_a_research_write_and_never_waits():
    clock = FakeClock()
    client = GitHubClient(token_settings("http://127.0.0.1:9"), clock=clock, sleep=clock.sleep)
    for _ in range(600):  # past both of GitHub's limits: the budget says so, the conductor never sleeps
        client.pace_write("branch")
    assert clock.slept == []
    assert client.budget.room() == 0


# --- signing in as a GitHub App -------------------------------------------------------------------


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def app_settings(url: str, key: rsa.RSAPrivateKey, **extra: Any) -> GitHubSettings:
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    ).decode()
    return GitHubSettings(**{**dict(repository="o/r", app_id=42, private_key=lambda: pem, api_url=url), **extra})


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_an_app_signs_a_jwt_finds_its_installation_and_renews_its_token_before_expiry(github_standin, rsa_key, caplog):
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="github")  # PyGithub's own DEBUG log shows response bodies
    now = datetime.now(UTC)
    github_standin.on("GET /repos/o/r/installation", Answer(200, {"id": 7, "app_id": 42}))
    github_standin.on(
        "POST /app/installations/7/access_tokens",
        Answer(201, {"token": "ghs_first_token", "expires_at": iso(now + timedelta(minutes=4))}),
        Answer(201, {"token": "ghs_second_token", "expires_at": iso(now + timedelta(hours=1))}),
    )
    github_standin.on("GET /repos/o/r", Answer(200, REPO_JSON))
    client = GitHubClient(app_settings(github_standin.url, rsa_key))
    assert client.uses_app

    client.repo()
    client.gh.get_repo("o/r")  # 4 minutes left: renewed now, long before it expires
    client.gh.get_repo("o/r")  # an hour left: kept

    tokens = [s.headers["Authorization"] for s in github_standin.requests("GET /repos/o/r")]
    assert tokens == ["token ghs_first_token", "token ghs_second_token", "token ghs_second_token"]
    assert len(github_standin.requests("POST /app/installations/7/access_tokens")) == 2

    for seen in github_standin.requests("GET /repos/o/r/installation") + github_standin.requests(
        "POST /app/installations/7/access_tokens"
    ):
        kind, signed = seen.headers["Authorization"].split(" ")
        assert kind == "Bearer"
        assert jwt.get_unverified_header(signed)["alg"] == "RS256"
        claims = jwt.decode(signed, rsa_key.public_key(), algorithms=["RS256"])
        assert claims["iss"] == "42" and claims["exp"] - claims["iat"] <= 600

    assert "ghs_first_token" not in caplog.text and "ghs_second_token" not in caplog.text
    assert "PRIVATE KEY" not in caplog.text


def test_a_configured_installation_id_is_used_without_asking(github_standin, rsa_key):
    an_hour = iso(datetime.now(UTC) + timedelta(hours=1))
    github_standin.on(
        "POST /app/installations/99/access_tokens", Answer(201, {"token": "ghs_t", "expires_at": an_hour})
    )
    github_standin.on("GET /repos/o/r", Answer(200, REPO_JSON))
    client = GitHubClient(app_settings(github_standin.url, rsa_key, installation_id=99))

    client.repo()
    assert github_standin.requests("GET /repos/o/r/installation") == []


def test_an_app_not_installed_on_the_repository_says_so(github_standin, rsa_key):
    github_standin.on("GET /repos/o/r/installation", Answer(404, {"message": "Not Found"}))
    client = GitHubClient(app_settings(github_standin.url, rsa_key))

    with pytest.raises(ConfigError, match="not installed on o/r"):
        client.repo()


def test_bot_login_is_the_apps_slug_with_bot_for_an_app(github_standin, rsa_key):
    github_standin.on("GET /app", Answer(200, {"id": 42, "slug": "autoresearch", "name": "autoresearch"}))
    client = GitHubClient(app_settings(github_standin.url, rsa_key))

    assert client.bot_login == "autoresearch[bot]"
    assert client.bot_login == "autoresearch[bot]"
    assert len(github_standin.requests("GET /app")) == 1
    assert github_standin.requests("GET /app")[0].headers["Authorization"].startswith("Bearer ")


def test_bot_login_is_the_tokens_user_for_a_token(github_standin):
    github_standin.on("GET /user", Answer(200, {"login": "someone", "id": 5, "type": "User"}))
    client, _ = token_client(github_standin)

    assert client.bot_login == "someone" and not client.uses_app
    assert github_standin.requests("GET /user")[0].headers["Authorization"] == "token ghp_secret_token_value"


# --- health ---------------------------------------------------------------------------------------


def test_last_contact_follows_githubs_answers(github_standin):
    github_standin.on(
        "GET /repos/o/r", Answer(200, REPO_JSON, {"x-ratelimit-remaining": "4321", "x-ratelimit-limit": "5000"})
    )
    client, _ = token_client(github_standin)
    assert client.health() == {
        "github_last_contact": None,
        "github_last_error": None,
        "github_last_error_at": None,
        "rate_limit_remaining": None,
    }

    before = time.time()
    client.repo()

    health = client.health()
    assert before <= health["github_last_contact"] <= time.time()
    assert client.last_contact == health["github_last_contact"]
    assert health["rate_limit_remaining"] == 4321 and health["github_last_error"] is None


def test_a_token_never_shows_in_errors_or_logs(github_standin, caplog):
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="github")  # PyGithub's own DEBUG log shows response bodies
    github_standin.on("GET /repos/o/r", Answer(401, {"message": "Bad credentials"}))
    client, _ = token_client(github_standin)

    with pytest.raises(GithubException) as raised:
        client.repo()
    assert raised.value.status == 401
    assert "ghp_secret_token_value" not in str(raised.value) + caplog.text + str(client.health())
    assert "ghp_secret_token_value" not in repr(client.settings)
