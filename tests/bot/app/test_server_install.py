"""The service's own code path never imports the training stack: a server that sends its runs
elsewhere installs without torch (pyproject's `train` extra). Such a server, left on the local
runner, stops at start naming the runner to choose; and the container's health check trusts
/healthz's status."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
NO_TRAINING_STACK = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'tiktoken', 'rustbpe', 'pyarrow'):
            raise ImportError('the server must not import ' + name)
sys.meta_path.insert(0, Block())
"""
# One interpreter with the training stack blocked checks the three ways a server meets it, in turn:
# importing the server's modules; settings that send the runs elsewhere; `autoresearch serve` on the
# local runner (the default), which must stop at start. It prints what it saw as one JSON object.
SERVER = (
    NO_TRAINING_STACK
    + """
import contextlib, io, json, os
seen = {}
import bot.app.cli, bot.app.serve, bot.app.web, bot.views.dashboard, bot.views.plot, bot.github.forge, bot.github.publisher, bot.github.handlers
import bot.github.client, bot.github.research_log, bot.agent.claude, bot.agent.choice
seen['imported'] = True

import bot.runners.actions, bot.runners.modal
from runner.profiles import harness_hash
from bot.app.settings import load_service_settings
settings = load_service_settings(repository='o/r', github_token='t', poll=True, runner='actions',
                                 data_fingerprint='645762e5f242651d')
seen['elsewhere'] = [settings.runner, len(harness_hash())]

os.environ.update(json.loads(os.environ.pop('SERVE_ENVIRONMENT')))
os.chdir(os.environ.pop('SERVE_DIRECTORY'))
said = io.StringIO()
with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
    try:
        bot.app.cli.app(['serve'], prog_name='autoresearch')
    except SystemExit as end:
        seen['serve_exit'] = end.code
seen['serve_said'] = said.getvalue()
print(json.dumps(seen))
"""
)


@pytest.fixture(scope="module")
def without_the_training_stack(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """What SERVER saw, run once for the tests below."""
    serve = {
        "AUTORESEARCH_REPOSITORY": "o/r",
        "AUTORESEARCH_GITHUB_TOKEN": "t",
        "AUTORESEARCH_POLL": "true",
    }
    env = {
        **_without_service_settings(),
        "COLUMNS": "1000",
        "PYTHONPATH": str(ROOT),  # `serve` runs in a directory of its own
        "SERVE_ENVIRONMENT": json.dumps(serve),
        "SERVE_DIRECTORY": str(tmp_path_factory.mktemp("serve")),
    }
    done = subprocess.run(
        [sys.executable, "-c", SERVER], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_server_imports_without_the_training_stack(without_the_training_stack: dict) -> None:
    assert without_the_training_stack["imported"] is True


def test_a_server_without_the_training_stack_sends_its_runs_elsewhere_without_importing_it(
    without_the_training_stack: dict,
) -> None:
    runner, harness_hash_length = without_the_training_stack["elsewhere"]
    assert runner == "actions" and harness_hash_length > 0


def test_serve_without_the_training_stack_on_the_default_runner_stops_at_start_naming_the_runners(
    without_the_training_stack: dict,
) -> None:
    """The slim container image: `autoresearch serve` on the local runner (the default) exits at once,
    before any thread or port, with the runners to choose instead."""
    said = without_the_training_stack["serve_said"]
    assert without_the_training_stack["serve_exit"] == 2, said
    assert (
        "AUTORESEARCH_RUNNER: local (the default) trains on this machine, but the training stack is not "
        "installed here" in said
    )
    assert "AUTORESEARCH_RUNNER=actions" in said and "AUTORESEARCH_RUNNER=modal" in said
    assert "Traceback" not in said


def _without_service_settings() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("AUTORESEARCH_")}


@pytest.mark.parametrize(("status", "healthy"), [(200, True), (503, False)])
def test_the_images_health_check_fails_when_healthz_answers_503(status: int, healthy: bool) -> None:
    """The Dockerfile's HEALTHCHECK command, run against a server answering /healthz with `status` on
    the port AUTORESEARCH_PORT names."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    [command] = re.findall(r"^HEALTHCHECK .*? CMD (.*)$", dockerfile, flags=re.MULTILINE)

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status if self.path == "/healthz" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {**os.environ, "AUTORESEARCH_PORT": str(server.server_address[1])}
        command = command.replace("python -c", f"{sys.executable} -c", 1)
        done = subprocess.run(["sh", "-c", command], env=env, capture_output=True, text=True, timeout=60)
    finally:
        server.shutdown()
    assert (done.returncode == 0) is healthy, done.stderr


def test_torch_is_only_in_the_train_extra() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(dep.startswith("torch") for dep in project["dependencies"])
    assert any(dep.startswith("torch==") for dep in project["optional-dependencies"]["train"])
