"""The service's own code path never imports the training stack: a server that sends its runs
elsewhere installs without torch (pyproject's `train` extra)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCK = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'tiktoken', 'rustbpe', 'pyarrow'):
            raise ImportError('the server must not import ' + name)
sys.meta_path.insert(0, Block())
import bot.cli, bot.serve, bot.web, bot.dashboard, bot.plot, bot.github.forge, bot.github.publisher, bot.github.handlers
import bot.github.client, bot.github.research_log, bot.agent.claude, bot.agent.choice
print('ok')
"""


def test_the_server_imports_without_the_training_stack() -> None:
    done = subprocess.run([sys.executable, "-c", BLOCK], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_torch_is_only_in_the_train_extra() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(dep.startswith("torch") for dep in project["dependencies"])
    assert any(dep.startswith("torch==") for dep in project["optional-dependencies"]["train"])
