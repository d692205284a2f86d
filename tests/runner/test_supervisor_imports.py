"""The supervisor (runner.isolated) imports no torch: it only starts, measures and ends the run's
processes and moves the exported model's file, and every run pays for its imports (about 2.6 CPU
seconds and 250 MB for torch alone, per run and per warm worker). Its two sandboxed processes
import torch; it does not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

IMPORTS = """
import sys
import runner.isolated
print(sorted(name for name in sys.modules if name == "torch" or name.startswith("torch.")))
"""


def test_the_supervisor_imports_no_torch() -> None:
    # A fresh Python: in this one torch is long imported, and under pytest `runner` is tests/runner/.
    done = subprocess.run(
        [sys.executable, "-c", IMPORTS],
        check=False,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
