"""`autoresearch serve` in child processes for the kill tests, started cheaply: one interpreter
imports the service once, then forks a fresh service process for each request, so that a test can
SIGKILL one anywhere and start another on the same state without paying for an interpreter and its
imports each time. Each child runs the real Service and web server (bot.app.serve.serve) with a
runner that keeps its jobs in files (so they outlive the process) and a scripted agent.

Run as `python serve_child.py TESTS_DIR` from the project's root. Each line on stdin is a JSON
request {"config": path, "log": path, "failpoint": name or null, "hold": text or null}: the child
reads the service's settings, its runner's and its agent's from `config` (test_serve.child_config
writes it), runs in the config's directory, appends its stdout and stderr to `log`, and dies at
`failpoint` (bot.store.failpoint). While `hold` is given, a job whose train.py contains it keeps
running in this child's life. Two JSON lines answer each request on stdout: {"pid": n} once the
child is forked, then {"returncode": rc} when it has ended, as subprocess gives it (-9 when
killed with SIGKILL).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))  # the project first (cwd): tests/bot/... must not shadow bot/...
sys.path.append(sys.argv[1])  # tests/, for fakes

import scipy.special  # noqa: E402, F401  the judge imports it on first use: once here, not in every child
import uvicorn  # noqa: E402, F401  serve() imports it
from fakes import IDENTITY, FileRunner  # noqa: E402

import bot.app.web  # noqa: E402, F401  Service.app() imports these: once here too
import bot.views.dashboard  # noqa: E402, F401
from bot.agent.scripted import ScriptedAgent  # noqa: E402
from bot.app.serve import Parts, serve  # noqa: E402
from bot.app.settings import load_service_settings  # noqa: E402
from bot.core.records import Proposal, RunStatus  # noqa: E402

TIMER_S = 0.1  # the driver's timer: the FileRunner never announces a finished job


class HoldingRunner(FileRunner):
    """The FileRunner, except that a job whose train.py contains `hold` keeps running."""

    def __init__(self, root: Path, seconds: float, hold: str | None, *, slots: int = 1) -> None:
        super().__init__(root, slots=slots, seconds=seconds)
        self.hold = hold

    def lookup(self, run_id: int) -> RunStatus:
        path = self.root / f"{run_id}.json"
        if self.hold and path.exists() and self.hold in json.loads(path.read_text())["asset"]:
            return RunStatus("running", progress={"step": 1})
        return super().lookup(run_id)


def run_service(config: dict, hold: str | None) -> None:
    settings = load_service_settings(
        repository="octo-org/research",
        github_app_id=1,
        github_private_key=config["pem"],
        github_api_url=config["api_url"],
        webhook_secret=config["secret"],
        state_dir=Path(config["state_dir"]),
        profile="smoke",
        port=config["port"],
    )
    proposals = [Proposal(p["title"], p["hypothesis"], p["asset"]) for p in config["proposals"]]
    runner = HoldingRunner(Path(config["runs_dir"]), config["run_seconds"], hold, slots=config.get("slots", 1))
    serve(settings, make_parts=lambda s, c, t: Parts(runner, ScriptedAgent(proposals), dict(IDENTITY)), timer_s=TIMER_S)


def child(request: dict) -> None:
    """The forked service process: never returns."""
    code = 1
    try:
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.dup2(log, 1)  # and off the answers' pipe
        os.dup2(log, 2)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        config_path = Path(request["config"])
        os.chdir(config_path.parent)
        for name in [n for n in os.environ if n.startswith("AUTORESEARCH_")]:
            del os.environ[name]
        if request["failpoint"]:
            os.environ["AUTORESEARCH_FAILPOINT"] = request["failpoint"]
        run_service(json.loads(config_path.read_text()), request["hold"])
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve_requests() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            child(request)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    serve_requests()
