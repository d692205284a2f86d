"""`autoresearch serve` in a child process for the kill tests: the real Service and web server,
with a runner that keeps its jobs in files (so they outlive the process) and a scripted agent.

    python serve_child.py CONFIG.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[0] = str(ROOT)  # not tests/bot: its github/ and the project's bot/ must not shadow the real packages
sys.path.append(str(ROOT / "tests"))  # for fakes

from fakes import IDENTITY, FileRunner  # noqa: E402

from bot.agent.scripted import ScriptedAgent  # noqa: E402
from bot.app.serve import Parts, serve  # noqa: E402
from bot.app.settings import load_service_settings  # noqa: E402
from bot.core.records import Proposal  # noqa: E402


def main() -> None:
    config = json.loads(Path(sys.argv[1]).read_text())
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
    proposals = [Proposal(p["title"], p["hypothesis"], p["train_py"]) for p in config["proposals"]]
    runner = FileRunner(Path(config["runs_dir"]), seconds=config["run_seconds"])
    serve(settings, make_parts=lambda s, c: Parts(runner, ScriptedAgent(proposals), dict(IDENTITY)), timer_s=0.3)


if __name__ == "__main__":
    main()
