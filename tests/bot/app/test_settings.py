"""The service's settings: where they come from (environment, .env file, overrides), every problem
named in one message by its environment variable, and secrets that never show."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from bot.app.settings import ConfigError, ServiceSettings, load_service_settings

TOKEN = "ghp_do_not_print_me"
SECRET = "webhook-secret-do-not-print"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No AUTORESEARCH_* variable and no .env file from the machine running the tests."""
    for name in list(os.environ):
        if name.startswith("AUTORESEARCH_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def pem() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    ).decode()


def problem_lines(error: ConfigError) -> list[str]:
    return [line.strip() for line in str(error).splitlines()[1:]]


def test_settings_come_from_autoresearch_environment_variables(monkeypatch):
    monkeypatch.setenv("AUTORESEARCH_REPOSITORY", "karpathy/nanochat")
    monkeypatch.setenv("AUTORESEARCH_GITHUB_TOKEN", TOKEN)
    monkeypatch.setenv("AUTORESEARCH_WEBHOOK_SECRET", SECRET)
    monkeypatch.setenv("AUTORESEARCH_PORT", "9000")
    monkeypatch.setenv("AUTORESEARCH_SLOTS", "2")
    monkeypatch.setenv("AUTORESEARCH_MAX_OPEN_QUESTIONS", "3")
    monkeypatch.setenv("AUTORESEARCH_GITHUB_API_URL", "https://github.example.com/api/v3/")

    settings = load_service_settings()
    assert settings.max_open_questions == 3

    assert settings.repository == "karpathy/nanochat" and settings.port == 9000 and settings.slots == 2
    assert settings.github_token.get_secret_value() == TOKEN and not settings.uses_app
    assert settings.github_api_url == "https://github.example.com/api/v3"  # trailing slash dropped
    assert (settings.main_branch, settings.profile, settings.runner, settings.agent) == (
        "main",
        "cpu",
        "local",
        "explorer",
    )
    assert settings.state_dir == Path("autoresearch-state") and settings.poll is False
    assert (settings.poll_interval_s, settings.request_timeout_s, settings.agent_script) == (60, 15, None)


def test_a_dotenv_file_is_read_and_the_environment_wins_over_it(monkeypatch, tmp_path):
    env_file = tmp_path / "service.env"
    env_file.write_text(
        f"AUTORESEARCH_REPOSITORY=o/r\nAUTORESEARCH_GITHUB_TOKEN={TOKEN}\n"
        "AUTORESEARCH_POLL=true\nAUTORESEARCH_PORT=9000\nUNRELATED=1\n"
    )
    monkeypatch.setenv("AUTORESEARCH_PORT", "9100")

    settings = load_service_settings(env_file)

    assert settings.repository == "o/r" and settings.poll and settings.port == 9100


def test_dotenv_in_the_working_directory_is_read_by_default(tmp_path):
    (tmp_path / ".env").write_text(
        f"AUTORESEARCH_REPOSITORY=o/r\nAUTORESEARCH_GITHUB_TOKEN={TOKEN}\nAUTORESEARCH_WEBHOOK_SECRET={SECRET}\n"
    )

    assert load_service_settings().repository == "o/r"


def test_an_env_file_that_does_not_exist_is_named(tmp_path):
    with pytest.raises(ConfigError, match="missing.env does not exist"):
        load_service_settings(tmp_path / "missing.env")


def test_overrides_win_and_none_means_not_given(monkeypatch):
    monkeypatch.setenv("AUTORESEARCH_REPOSITORY", "o/r")
    monkeypatch.setenv("AUTORESEARCH_GITHUB_TOKEN", TOKEN)
    monkeypatch.setenv("AUTORESEARCH_PORT", "9000")

    settings = load_service_settings(poll=True, port=None, host="0.0.0.0")

    assert settings.poll and settings.port == 9000 and settings.host == "0.0.0.0"
    with pytest.raises(TypeError, match="prot"):
        load_service_settings(prot=1)


def test_every_missing_setting_is_named_in_one_message():
    with pytest.raises(ConfigError) as raised:
        load_service_settings()

    lines = problem_lines(raised.value)
    assert [line.split(":")[0] for line in lines] == [
        "AUTORESEARCH_REPOSITORY",
        "AUTORESEARCH_GITHUB_TOKEN",
        "AUTORESEARCH_WEBHOOK_SECRET",
    ]
    assert all("missing" in line for line in lines)
    assert "AUTORESEARCH_GITHUB_APP_ID" in lines[1]  # the other way to sign in is offered
    assert "AUTORESEARCH_POLL=true" in lines[2]


def test_every_invalid_setting_is_named_with_what_was_given(monkeypatch):
    for name, value in dict(
        REPOSITORY="not a repository",
        PORT="eighty",
        SLOTS="0",
        MAX_OPEN_QUESTIONS="0",
        RUNNER="slurm",
        AGENT="gpt",
        PROFILE="tpu",
        POLL_INTERVAL_S="5",
        REQUEST_TIMEOUT_S="-1",
        GITHUB_API_URL="ftp://github.com",
        MAIN_BRANCH="-main",
        GITHUB_TOKEN=TOKEN,
        WEBHOOK_SECRET=SECRET,
    ).items():
        monkeypatch.setenv(f"AUTORESEARCH_{name}", value)

    with pytest.raises(ConfigError) as raised:
        load_service_settings()

    named = {line.split(":")[0]: line for line in problem_lines(raised.value)}
    assert set(named) == {
        f"AUTORESEARCH_{name}"
        for name in (
            "REPOSITORY",
            "PORT",
            "SLOTS",
            "MAX_OPEN_QUESTIONS",
            "RUNNER",
            "AGENT",
            "PROFILE",
            "POLL_INTERVAL_S",
            "REQUEST_TIMEOUT_S",
            "GITHUB_API_URL",
            "MAIN_BRANCH",
        )
    }
    assert "'not a repository'" in named["AUTORESEARCH_REPOSITORY"] and "owner/name" in named["AUTORESEARCH_REPOSITORY"]
    assert "'slurm'" in named["AUTORESEARCH_RUNNER"] and "actions, local, modal" in named["AUTORESEARCH_RUNNER"]
    assert "claude, explorer, scripted" in named["AUTORESEARCH_AGENT"]
    assert "cpu, h100, smoke" in named["AUTORESEARCH_PROFILE"]
    assert "10" in named["AUTORESEARCH_POLL_INTERVAL_S"]
    assert "api/v3" in named["AUTORESEARCH_GITHUB_API_URL"]


@pytest.mark.parametrize("runner", ["actions", "modal"])
def test_a_remote_runner_needs_the_data_fingerprint(monkeypatch, runner):
    for name, value in dict(REPOSITORY="owner/name", GITHUB_TOKEN=TOKEN, WEBHOOK_SECRET=SECRET, RUNNER=runner).items():
        monkeypatch.setenv(f"AUTORESEARCH_{name}", value)
    with pytest.raises(ConfigError) as raised:
        load_service_settings()
    named = {line.split(":")[0]: line for line in problem_lines(raised.value)}
    assert set(named) == {"AUTORESEARCH_DATA_FINGERPRINT"}
    assert "autoresearch prepare" in named["AUTORESEARCH_DATA_FINGERPRINT"]
    monkeypatch.setenv("AUTORESEARCH_DATA_FINGERPRINT", "645762e5f242651d")
    assert load_service_settings().data_fingerprint == "645762e5f242651d"


def test_field_errors_and_combination_errors_are_reported_together(monkeypatch):
    monkeypatch.setenv("AUTORESEARCH_PORT", "eighty")  # a field error stops pydantic's after-validators

    with pytest.raises(ConfigError) as raised:
        load_service_settings()

    named = [line.split(":")[0] for line in problem_lines(raised.value)]
    assert {"AUTORESEARCH_PORT", "AUTORESEARCH_GITHUB_TOKEN", "AUTORESEARCH_WEBHOOK_SECRET"} <= set(named)


def test_a_webhook_secret_is_not_needed_when_polling():
    settings = load_service_settings(repository="o/r", github_token=TOKEN, poll=True)
    assert settings.webhook_secret is None


# --- signing in: exactly one way ------------------------------------------------------------------


def test_a_token_and_an_app_together_are_refused(tmp_path, pem):
    key = tmp_path / "app.pem"
    key.write_text(pem)
    with pytest.raises(ConfigError, match="AUTORESEARCH_GITHUB_TOKEN: set together with a GitHub App"):
        load_service_settings(
            repository="o/r", poll=True, github_token=TOKEN, github_app_id=1, github_private_key_path=key
        )


def test_an_app_signs_in_with_its_id_and_key_file(tmp_path, pem):
    key = tmp_path / "app.pem"
    key.write_text(pem)

    settings = load_service_settings(repository="o/r", poll=True, github_app_id=123, github_private_key_path=key)

    assert settings.uses_app and settings.private_key() == pem
    assert settings.github_installation_id is None  # found from the repository


def test_an_inline_key_with_escaped_newlines_is_accepted(monkeypatch, pem):
    monkeypatch.setenv("AUTORESEARCH_GITHUB_PRIVATE_KEY", pem.strip().replace("\n", "\\n"))

    settings = load_service_settings(repository="o/r", poll=True, github_app_id=123)

    assert settings.private_key() == pem


def test_an_app_id_without_a_key_and_a_key_without_an_app_id_are_named(tmp_path, pem):
    with pytest.raises(ConfigError, match="AUTORESEARCH_GITHUB_PRIVATE_KEY_PATH: missing"):
        load_service_settings(repository="o/r", poll=True, github_app_id=123)
    key = tmp_path / "app.pem"
    key.write_text(pem)
    with pytest.raises(ConfigError, match="AUTORESEARCH_GITHUB_APP_ID: missing"):
        load_service_settings(repository="o/r", poll=True, github_private_key_path=key)


def test_a_key_path_that_does_not_exist_is_named_with_its_full_path(tmp_path):
    with pytest.raises(ConfigError) as raised:
        load_service_settings(repository="o/r", poll=True, github_app_id=123, github_private_key_path="gone.pem")

    lines = problem_lines(raised.value)
    assert len(lines) == 1 and lines[0].startswith("AUTORESEARCH_GITHUB_PRIVATE_KEY_PATH: no file at")
    assert str(tmp_path / "gone.pem") in lines[0]


def test_a_key_file_that_is_not_a_pem_private_key_is_named(tmp_path):
    key = tmp_path / "app.pem"
    key.write_text("ssh-rsa AAAA... not a PEM\n")
    with pytest.raises(ConfigError, match="AUTORESEARCH_GITHUB_PRIVATE_KEY_PATH: .* does not hold a PEM"):
        load_service_settings(repository="o/r", poll=True, github_app_id=123, github_private_key_path=key)
    key.write_text("-----BEGIN RSA PRIVATE KEY-----\nbm90IGEga2V5\n-----END RSA PRIVATE KEY-----\n")
    with pytest.raises(ConfigError, match="not a usable private key"):
        load_service_settings(repository="o/r", poll=True, github_app_id=123, github_private_key_path=key)


def test_private_key_with_a_token_says_how_to_become_an_app():
    settings = load_service_settings(repository="o/r", poll=True, github_token=TOKEN)
    with pytest.raises(ConfigError, match="AUTORESEARCH_GITHUB_APP_ID"):
        settings.private_key()


# --- secrets --------------------------------------------------------------------------------------


def test_secrets_never_show_in_repr_describe_or_errors(monkeypatch, pem):
    monkeypatch.setenv("AUTORESEARCH_GITHUB_TOKEN", TOKEN)
    monkeypatch.setenv("AUTORESEARCH_WEBHOOK_SECRET", SECRET)
    settings = load_service_settings(repository="o/r")

    described = settings.describe()
    assert described["github_token"] == "set" and described["webhook_secret"] == "set"
    assert described["github_private_key"] == "missing" and described["auth"] == "token"
    assert described["repository"] == "o/r" and described["state_dir"] == "autoresearch-state"
    for shown in (repr(settings), str(settings), str(described)):
        assert TOKEN not in shown and SECRET not in shown

    monkeypatch.setenv("AUTORESEARCH_GITHUB_PRIVATE_KEY", pem)
    monkeypatch.setenv("AUTORESEARCH_PORT", "eighty")
    with pytest.raises(ConfigError) as raised:
        load_service_settings()  # no repository, a token and an App key, a bad port
    message = str(raised.value)
    assert TOKEN not in message and SECRET not in message and "PRIVATE KEY-----" not in message
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


def test_settings_built_directly_validate_the_same_way():
    with pytest.raises(ValueError):
        ServiceSettings(_env_file=None, repository="o/r", github_token=TOKEN)  # no webhook secret, no poll


def test_the_scripted_agent_needs_its_file(monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    for name in [n for n in os.environ if n.startswith("AUTORESEARCH_")]:
        monkeypatch.delenv(name)
    with pytest.raises(ConfigError, match="AUTORESEARCH_AGENT_SCRIPT: missing"):
        load_service_settings(repository="o/r", github_token="t", poll=True, agent="scripted")


# --- a runner that can run here -------------------------------------------------------------------


def without(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """This Python as if `modules` were not installed (as in the slim container image)."""
    import importlib.util

    import bot.app.settings

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        bot.app.settings.importlib.util, "find_spec", lambda name, *a: None if name in modules else find_spec(name, *a)
    )


def test_the_local_runner_without_the_training_stack_stops_at_start_naming_the_runners_to_choose(monkeypatch):
    without(monkeypatch, "torch")
    with pytest.raises(ConfigError) as raised:
        load_service_settings(repository="o/r", github_token=TOKEN, poll=True)  # the default runner: local
    [line] = problem_lines(raised.value)
    assert line.startswith(
        "AUTORESEARCH_RUNNER: local (the default) trains on this machine, but the training "
        "stack is not installed here (no torch)"
    )
    assert "AUTORESEARCH_RUNNER=actions" in line and "AUTORESEARCH_RUNNER=modal" in line
    assert "--build-arg EXTRAS=train" in line and "autoresearch-bot[train]" in line
    with pytest.raises(ConfigError, match=r"AUTORESEARCH_RUNNER: local trains on this machine"):
        load_service_settings(repository="o/r", github_token=TOKEN, poll=True, runner="local")  # chosen, not default
    settings = load_service_settings(
        repository="o/r", github_token=TOKEN, poll=True, runner="actions", data_fingerprint="645762e5f242651d"
    )
    assert settings.runner == "actions"  # a server that sends its runs elsewhere needs no torch


def test_the_modal_runner_without_its_client_stops_at_start(monkeypatch):
    without(monkeypatch, "modal")
    monkeypatch.setenv("AUTORESEARCH_RUNNER", "modal")
    with pytest.raises(ConfigError) as raised:
        load_service_settings(repository="o/r", github_token=TOKEN, poll=True, data_fingerprint="645762e5f242651d")
    [line] = problem_lines(raised.value)
    assert "modal starts runs on Modal from this machine, but the modal package is not installed" in line
    assert "autoresearch-bot[modal]" in line and "AUTORESEARCH_RUNNER=actions or local" in line


def test_a_runner_problem_is_named_with_the_other_problems(monkeypatch):
    without(monkeypatch, "torch", "pyarrow")
    with pytest.raises(ConfigError) as raised:
        load_service_settings(repository="o/r")  # no way to sign in, no webhook secret either
    named = {line.split(":")[0]: line for line in problem_lines(raised.value)}
    assert set(named) == {"AUTORESEARCH_RUNNER", "AUTORESEARCH_GITHUB_TOKEN", "AUTORESEARCH_WEBHOOK_SECRET"}
    assert "(no torch, pyarrow)" in named["AUTORESEARCH_RUNNER"]


def test_redact_takes_every_secret_out_of_a_text(pem):
    settings = load_service_settings(
        repository="o/r",
        github_app_id=1,
        github_private_key=pem,
        webhook_secret=SECRET,
        dashboard_token="dashboard-token-1234",
    )
    key_line = pem.splitlines()[5]
    text = f"failed: {SECRET} and dashboard-token-1234 and {key_line} and {pem}"
    redacted = settings.redact(text)
    assert SECRET not in redacted and "dashboard-token-1234" not in redacted and key_line not in redacted
    assert "PRIVATE KEY" not in redacted and redacted.startswith("failed: [secret] and [secret] and [secret]")
    assert settings.redact("nothing secret here") == "nothing secret here"
