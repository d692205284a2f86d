"""runner.sandbox's `hide`: a directory that a mount shows (the runner package's vendored sample)
is seen inside as an empty, read-only directory."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from runner import sandbox

SANDBOX, WHY_NOT = sandbox.available()


def test_hidden_directories_lie_over_every_mount_that_shows_them(tmp_path: Path) -> None:
    secret = tmp_path / "shown" / "secret"
    secret.mkdir(parents=True)
    argv = sandbox.wrap(["/bin/true"], sandbox.Sandbox(read=[tmp_path / "shown"], hide=[secret]))
    hidden = argv.index("--tmpfs", argv.index("/tmp") + 1)
    assert argv[hidden + 1 : hidden + 4] == [str(secret), "--remount-ro", str(secret)]
    assert hidden > max(i for i, arg in enumerate(argv) if arg == "--ro-bind")
    assert hidden < argv.index("--")


@pytest.mark.skipif(not SANDBOX, reason=f"no sandbox here: {WHY_NOT}")
def test_a_hidden_directory_is_empty_and_read_only_inside(tmp_path: Path) -> None:
    shown = tmp_path / "shown"
    (shown / "secret").mkdir(parents=True)
    (shown / "secret" / "labels.csv").write_text("text,queue\n")
    (shown / "open.txt").write_text("visible\n")
    tmp_path.chmod(0o755)
    shown.chmod(0o755)
    script = f"ls -A {shown / 'secret'}; cat {shown / 'open.txt'}; touch {shown / 'secret' / 'x'} 2>/dev/null || echo refused"
    argv = sandbox.wrap(["/bin/sh", "-c", script], sandbox.Sandbox(read=[shown], hide=[shown / "secret"]))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["visible", "refused"]
