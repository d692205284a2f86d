"""The service's settings: how the bot signs in to GitHub, which repository it tends, where it keeps
its state and how it listens. Read from AUTORESEARCH_* environment variables and an optional .env
file (same names, one `NAME=value` a line):

    AUTORESEARCH_REPOSITORY=owner/name
    AUTORESEARCH_WEBHOOK_SECRET=...                 # not needed with AUTORESEARCH_POLL=true
    # as a GitHub App (check runs; the bot has its own name, "<app>[bot]"):
    AUTORESEARCH_GITHUB_APP_ID=123456
    AUTORESEARCH_GITHUB_PRIVATE_KEY_PATH=autoresearch.private-key.pem
    # ... or as the user of a personal access token (commit statuses instead of check runs):
    AUTORESEARCH_GITHUB_TOKEN=github_pat_...

Overrides given to `load_service_settings` (the command line's flags) win over environment
variables, which win over the .env file. Settings that do not validate raise ConfigError
(bot.core.errors), whose message names every setting to fix, one per line, by its environment
variable and says what to do. `github()` is what the GitHub client needs of them.
Secrets are SecretStr: their repr, the error messages and describe() never show them, and
redact() takes them out of any text the service shows (its health answer).

A runner that cannot run on this machine is a setting to fix too: the local runner trains here, so
it needs the training stack (the `train` extra: torch, ...), and the Modal runner needs the `modal`
package. Whether they are installed is asked of the import system without importing them, so a
server that sends its runs elsewhere (the slim container image) stops at start, naming the runner
to choose, instead of a conductor that dies at its first import of torch.

These settings say how the service runs; how the loop decides (noise, confirmations, pausing) is
program.md's front matter (bot/loop/program.py), read from main on every tick.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pydantic import Field, SecretStr, TypeAdapter, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError
from pydantic_settings import BaseSettings, SettingsConfigDict

from bot.core.errors import ConfigError
from bot.github.client import GitHubSettings
from runner.profiles import PROFILES

ENV_PREFIX = "AUTORESEARCH_"
DEFAULT_ENV_FILE = Path(".env")
RUNNERS = frozenset(
    {"local", "actions", "modal"}
)  # where runs execute: this machine, self-hosted Actions runners, Modal
AGENTS = frozenset({"explorer", "claude", "scripted"})  # who proposes experiments (bot.agent.choice)
SECRET_FIELDS = frozenset({"webhook_secret", "github_token", "github_private_key", "dashboard_token"})
# what each runner needs installed beside the bot (pyproject's extras), and how to install it
RUNNER_NEEDS: dict[str, tuple[tuple[str, ...], str]] = {
    "local": (
        ("torch", "tiktoken", "rustbpe", "pyarrow"),
        "pip install 'autoresearch-bot[train]' (the container image: docker build --build-arg EXTRAS=train)",
    ),
    "modal": (("modal",), "pip install 'autoresearch-bot[modal]' (the container image: --build-arg EXTRAS=modal)"),
    "actions": ((), ""),
}

_OWNER = r"[A-Za-z0-9](?:[A-Za-z0-9]|-(?=[A-Za-z0-9])){0,38}"  # GitHub logins: no leading, trailing or double '-'
_REPOSITORY = re.compile(rf"^{_OWNER}/[A-Za-z0-9._-]{{1,100}}$")
_BRANCH = re.compile(r"^(?!/|-|.*(?:\.\.|//|@\{|\.lock$|/$|\.$))[A-Za-z0-9._/-]+$")


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


class ServiceSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_file=DEFAULT_ENV_FILE, env_ignore_empty=True, extra="ignore"
    )

    webhook_secret: SecretStr | None = Field(
        None,
        description=(
            "the webhook secret set on the GitHub App (its settings page, Webhook), which proves a delivery came "
            "from GitHub; or set AUTORESEARCH_POLL=true to poll GitHub instead of receiving webhooks"
        ),
    )
    repository: str = Field(description='the repository the bot works on, as "owner/name" (e.g. karpathy/nanochat)')
    github_token: SecretStr | None = Field(
        None,
        description=(
            "a personal access token with contents, pull requests, issues and statuses write access to the "
            "repository; or, instead, a GitHub App (AUTORESEARCH_GITHUB_APP_ID with its private key)"
        ),
    )
    github_app_id: int | None = Field(None, gt=0, description="the GitHub App's id (a number on its settings page)")
    github_private_key: SecretStr | None = Field(
        None,
        description=(
            "the GitHub App's private key itself (PEM text; '\\n' escapes are accepted); or give its file in "
            "AUTORESEARCH_GITHUB_PRIVATE_KEY_PATH"
        ),
    )
    github_private_key_path: Path | None = Field(
        None,
        description=(
            "the file holding the GitHub App's private key (.pem, from the App's settings page: Private keys, "
            "Generate a private key)"
        ),
    )
    github_installation_id: int | None = Field(
        None, gt=0, description=("the App's installation on the repository; leave it out and the bot asks GitHub")
    )
    github_api_url: str = Field(
        "https://api.github.com",
        description=("GitHub's API: https://api.github.com, or https://HOST/api/v3 for GitHub Enterprise Server"),
    )
    main_branch: str = Field("main", description="the branch experiments start from and improvements land on")
    state_dir: Path = Field(Path("autoresearch-state"), description="where the bot keeps its store and work trees")
    profile: str = Field("cpu", description=f"the measurement profile: one of {', '.join(sorted(PROFILES))}")
    runner: str = Field("local", description=f"where runs execute: one of {', '.join(sorted(RUNNERS))}")
    slots: int = Field(
        1,
        ge=1,
        le=64,
        description=(
            "how many runs may execute at once on the local runner (1 to 64; Actions and Modal have their own)"
        ),
    )
    warm_workers: bool = Field(
        True,
        description=(
            "the local runner keeps a worker per slot ready for the slot's next run (torch imported, data "
            "loaded: seconds less start-up per run, about one run's memory per slot while it waits)"
        ),
    )
    data_fingerprint: str | None = Field(
        None,
        description=(
            "with the actions or modal runner: the fingerprint of the data the GPU runners measure on, which "
            "`autoresearch prepare --profile P` prints there; results on other data are refused"
        ),
    )
    agent: str = Field("explorer", description=f"who proposes experiments: one of {', '.join(sorted(AGENTS))}")
    max_open_questions: int | None = Field(
        None,
        ge=1,
        le=64,
        description=(
            "how many proposals the agent may work on at once (1 to 64; default one per runner slot); with "
            "claude each is a session of its own, paid as it runs"
        ),
    )
    host: str = Field("127.0.0.1", min_length=1, description="the address the webhook server listens on")
    port: int = Field(8080, ge=1, le=65535, description="the port the webhook server listens on (1 to 65535)")
    poll: bool = Field(False, description="true: ask GitHub for news every poll_interval_s instead of webhooks")
    poll_interval_s: float = Field(60.0, ge=10, description="seconds between two polls (at least 10)")
    request_timeout_s: float = Field(15.0, gt=0, le=300, description="seconds to wait for one GitHub answer")
    dashboard_token: SecretStr | None = Field(
        None,
        description=(
            "a token the dashboard at / asks for (?token=... or Authorization: Bearer); unset, it is open to "
            "whoever reaches the server"
        ),
    )
    agent_script: Path | None = Field(
        None,
        description=(
            'the proposals of the scripted agent: a JSON-lines file of {"title", "hypothesis", "asset"} '
            '(the full text of the task\'s asset; "train_py" is read too)'
        ),
    )

    # --- one field at a time ----------------------------------------------------------------------

    @field_validator("repository")
    @classmethod
    def _owner_slash_name(cls, value: str) -> str:
        value = value.strip().removesuffix(".git")
        if not _REPOSITORY.match(value) or value.split("/")[1] in (".", ".."):
            raise ValueError('expected "owner/name", e.g. karpathy/nanochat')
        return value

    @field_validator("github_api_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        url = urlparse(value)
        if url.scheme not in ("https", "http") or not url.hostname or url.query or url.fragment:
            raise ValueError(
                "expected an http(s) URL such as https://api.github.com, or https://HOST/api/v3 "
                "for GitHub Enterprise Server"
            )
        return value

    @field_validator("main_branch")
    @classmethod
    def _branch_name(cls, value: str) -> str:
        if not _BRANCH.match(value):
            raise ValueError("not a usable branch name (letters, digits, '.', '_', '-', '/')")
        return value

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, value: str) -> str:
        return _one_of(value, PROFILES)

    @field_validator("runner")
    @classmethod
    def _known_runner(cls, value: str) -> str:
        return _one_of(value, RUNNERS)

    @field_validator("agent")
    @classmethod
    def _known_agent(cls, value: str) -> str:
        return _one_of(value, AGENTS)

    @field_validator("github_private_key")
    @classmethod
    def _inline_key_is_pem(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        text = value.get_secret_value().strip()
        if "\n" not in text and "\\n" in text:  # a PEM squeezed onto one line of an env file
            text = text.replace("\\n", "\n")
        _check_pem(text.encode())
        return SecretStr(text + "\n")

    @field_validator("github_private_key_path")
    @classmethod
    def _key_file_is_pem(cls, value: Path | None) -> Path | None:
        if value is None:
            return None
        path = value.expanduser().absolute()
        if not path.is_file():
            raise ValueError(
                f"no file at {path}; download the App's private key (settings page: Private keys, "
                "Generate a private key) and point this setting at it"
            )
        try:
            data = path.read_bytes()
        except OSError as error:
            raise ValueError(f"cannot read {path}: {error.strerror}; make it readable by the bot's user") from None
        _check_pem(data, where=f"{path} ")
        return path

    # --- settings that only make sense together ---------------------------------------------------

    @model_validator(mode="wrap")
    @classmethod
    def _every_problem_at_once(cls, data: Any, handler: Any) -> ServiceSettings:
        """pydantic stops before cross-field rules when a field fails; here both are collected, so one
        ConfigError lists everything a person has to fix instead of one thing per attempt."""
        problems = _combination_problems(data) if isinstance(data, Mapping) else []
        try:
            settings = handler(data)
        except ValidationError as error:
            raise _validation_error(cls.__name__, error.errors(include_url=False), problems) from None
        if problems:
            raise _validation_error(cls.__name__, [], problems)
        return settings

    # --- use --------------------------------------------------------------------------------------

    @property
    def uses_app(self) -> bool:
        """True: the bot signs in as a GitHub App; False: as the user of a personal access token."""
        return self.github_app_id is not None

    def github(self) -> GitHubSettings:
        """What the GitHub client needs: the repository, the API, and how to sign in."""
        return GitHubSettings(
            repository=self.repository,
            api_url=self.github_api_url,
            request_timeout_s=self.request_timeout_s,
            token=self.github_token,
            app_id=self.github_app_id,
            installation_id=self.github_installation_id,
            private_key=self.private_key,
            ledger_path=self.state_dir / "state.db",
        )

    def private_key(self) -> str:
        """The GitHub App's private key (PEM text)."""
        if self.github_private_key is not None:
            return self.github_private_key.get_secret_value()
        if self.github_private_key_path is not None:
            try:
                return self.github_private_key_path.read_text()
            except OSError as error:
                raise ConfigError(
                    f"{env_name('github_private_key_path')}: cannot read {self.github_private_key_path}"
                    f": {error.strerror}; make the key file readable by the bot's user"
                ) from None
        raise ConfigError(
            "no GitHub App private key is set: this service signs in with AUTORESEARCH_GITHUB_TOKEN; "
            "set AUTORESEARCH_GITHUB_APP_ID and AUTORESEARCH_GITHUB_PRIVATE_KEY_PATH to act as an App"
        )

    def redact(self, text: str) -> str:
        """`text` with every secret of these settings (and each line of an inline private key)
        replaced by [secret]: for what the service shows to whoever asks."""
        secrets = set()
        for name in SECRET_FIELDS:
            value = getattr(self, name)
            if value is not None:
                secret = value.get_secret_value()
                secrets.add(secret.strip())
                secrets.update(line.strip() for line in secret.splitlines() if len(line.strip()) >= 16)
        for secret in sorted(secrets - {""}, key=len, reverse=True):  # a whole key before its lines
            text = text.replace(secret, "[secret]")
        return text

    def describe(self) -> dict[str, Any]:
        """Every setting, safe to log: secrets appear as "set" or "missing", never their value."""
        described: dict[str, Any] = {"auth": "github-app" if self.uses_app else "token"}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if name in SECRET_FIELDS:
                described[name] = "set" if value is not None else "missing"
            elif isinstance(value, Path):
                described[name] = str(value)
            else:
                described[name] = value
        return described


def load_service_settings(env_file: Path | None = None, **overrides: Any) -> ServiceSettings:
    """The service's settings from `overrides` (by field name; None means "not given"), the environment
    and `env_file` (default: .env in the working directory, when there is one)."""
    unknown = sorted(set(overrides) - set(ServiceSettings.model_fields))
    if unknown:
        raise TypeError(f"load_service_settings() got unknown settings {unknown}")
    if env_file is not None and not Path(env_file).is_file():
        raise ConfigError(
            f"the settings file {env_file} does not exist: create it (one AUTORESEARCH_NAME=value "
            "a line) or leave it out to use environment variables only"
        )
    source = Path(env_file) if env_file is not None else DEFAULT_ENV_FILE
    given = {name: value for name, value in overrides.items() if value is not None}
    try:
        return ServiceSettings(_env_file=source, **given)
    except ValidationError as error:
        raise ConfigError(_explain(error, source)) from None


# --- helpers ------------------------------------------------------------------------------------------


def missing_modules(runner: str) -> list[str]:
    """The packages `runner` needs that this Python cannot find (none are imported to tell)."""
    missing = []
    for name in RUNNER_NEEDS.get(runner, ((), ""))[0]:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a broken install: as good as missing
            found = False
        if not found:
            missing.append(name)
    return missing


def _runner_problem(data: Mapping[str, Any]) -> str | None:
    """Why the chosen runner (local unless set) cannot run on this machine, and what to choose instead."""
    runner = data.get("runner") or "local"
    if not isinstance(runner, str) or runner not in RUNNERS:
        return None  # the field's own check names it
    missing = missing_modules(runner)
    if not missing:
        return None
    chosen = f"{runner} (the default)" if not data.get("runner") else runner
    if runner == "local":
        return (
            f"{chosen} trains on this machine, but the training stack is not installed here (no "
            f"{', '.join(missing)}): choose where runs happen instead, AUTORESEARCH_RUNNER=actions (self-hosted "
            "GitHub Actions runners) or AUTORESEARCH_RUNNER=modal, each with AUTORESEARCH_DATA_FINGERPRINT "
            f"(README: GPUs); or install it here: {RUNNER_NEEDS[runner][1]}"
        )
    return (
        f"{chosen} starts runs on Modal from this machine, but the {', '.join(missing)} package is not installed "
        f"here: install it ({RUNNER_NEEDS[runner][1]}), or choose AUTORESEARCH_RUNNER=actions or local"
    )


def _one_of(value: str, allowed: Any) -> str:
    if value not in allowed:
        raise ValueError(f"unknown value {value!r}; choose one of {', '.join(sorted(allowed))}")
    return value


def _check_pem(data: bytes, where: str = "") -> None:
    """A key GitHub can verify: an unencrypted PEM private key (GitHub issues RSA keys)."""
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    if b"-----BEGIN" not in data or b"PRIVATE KEY-----" not in data:
        raise ValueError(
            f"{where}does not hold a PEM private key (-----BEGIN RSA PRIVATE KEY-----); use the .pem "
            "file GitHub gave when the App's private key was generated"
        )
    try:
        load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as error:  # never the key itself in the message
        reason = "it is encrypted" if isinstance(error, TypeError) else "it does not parse"
        raise ValueError(
            f"{where}holds a PEM block that is not a usable private key ({reason}); generate a new "
            "private key on the App's settings page"
        ) from None


def _given(data: Mapping[str, Any], name: str) -> bool:
    value = data.get(name)
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    return value is not None and str(value).strip() != ""


def _combination_problems(data: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, what to do) for the rules between settings, read from the raw values so that they are
    reported even when a field itself fails to validate."""
    token, app_id = _given(data, "github_token"), _given(data, "github_app_id")
    key, key_path = _given(data, "github_private_key"), _given(data, "github_private_key_path")
    problems: list[tuple[str, str]] = []
    if token and (app_id or key or key_path):
        problems.append(
            (
                "github_token",
                "set together with a GitHub App (AUTORESEARCH_GITHUB_APP_ID or its key): "
                "sign in one way only; unset the token to act as the App, or the App settings to act as "
                "the token's user",
            )
        )
    elif not token and not (app_id or key or key_path):
        problems.append(
            (
                "github_token",
                "missing: set AUTORESEARCH_GITHUB_TOKEN to a personal access token, or "
                "AUTORESEARCH_GITHUB_APP_ID with AUTORESEARCH_GITHUB_PRIVATE_KEY_PATH to act as a "
                "GitHub App",
            )
        )
    elif not token:
        if not app_id:
            problems.append(
                (
                    "github_app_id",
                    "missing: a private key is set, so the App's id is needed too "
                    "(a number on the App's settings page)",
                )
            )
        if not (key or key_path):
            problems.append(
                (
                    "github_private_key_path",
                    "missing: a GitHub App needs its private key; point this "
                    "at the .pem file from the App's settings page",
                )
            )
        elif key and key_path:
            problems.append(
                ("github_private_key", "set together with AUTORESEARCH_GITHUB_PRIVATE_KEY_PATH: keep one of the two")
            )
    try:
        poll = TypeAdapter(bool).validate_python(data.get("poll", False))
    except ValidationError:
        poll = True  # AUTORESEARCH_POLL itself is reported; do not guess what it meant
    if data.get("agent") == "scripted" and not _given(data, "agent_script"):
        problems.append(("agent_script", "missing: the scripted agent replays the proposals in this JSON-lines file"))
    runner_problem = _runner_problem(data)
    if runner_problem:
        problems.append(("runner", runner_problem))
    if data.get("runner") in ("actions", "modal") and not _given(data, "data_fingerprint"):
        problems.append(
            (
                "data_fingerprint",
                "missing: the bot does not hold the GPU runners' data, so it must be "
                "told which data their numbers come from: run `autoresearch prepare --profile P` on a "
                "runner and copy the fingerprint it prints",
            )
        )
    if not poll and not _given(data, "webhook_secret"):
        problems.append(("webhook_secret", "missing: " + ServiceSettings.model_fields["webhook_secret"].description))
    return problems


def _validation_error(title: str, errors: list[Any], problems: list[tuple[str, str]]) -> ValidationError:
    """One ValidationError holding pydantic's field errors and the combination problems, with the inputs
    of secret fields dropped so that no message can show them."""
    lines = []
    for error in errors:
        field = str(error["loc"][0]) if error["loc"] else ""
        shown = None if field in SECRET_FIELDS or error["type"] == "missing" else error.get("input")
        lines.append(
            InitErrorDetails(
                type=PydanticCustomError(error["type"], "{problem}", {"problem": error["msg"]}),
                loc=tuple(error["loc"]),
                input=shown,
            )
        )
    for field, message in problems:
        lines.append(
            InitErrorDetails(
                type=PydanticCustomError("combination", "{problem}", {"problem": message}), loc=(field,), input=None
            )
        )
    return ValidationError.from_exception_data(title, lines)


def _explain(error: ValidationError, source: Path) -> str:
    """ConfigError's message: one line per setting, by environment variable, with what to do."""
    lines, seen = [], set()
    for detail in error.errors(include_url=False):
        field = str(detail["loc"][0]) if detail["loc"] else "?"
        info = ServiceSettings.model_fields.get(field)
        message = detail["msg"].removeprefix("Value error, ")
        if detail["type"] == "missing":
            message = f"missing: {info.description}" if info else "missing"
        elif detail["type"] != "combination":
            given = detail.get("input")
            if field not in SECRET_FIELDS and isinstance(given, (str, int, float)) and str(given) not in message:
                message += f" (got {given!r})"
            if info is not None and detail["type"] not in ("value_error", "assertion_error"):
                message += f"; {info.description}"
        line = f"  {env_name(field)}: {message}"
        if line not in seen:
            seen.add(line)
            lines.append(line)
    where = f"read from the environment and {source}" if source.is_file() else "read from the environment; no .env file"
    return f"the service's settings need fixing ({where}):\n" + "\n".join(lines)
