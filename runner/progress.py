"""A run's progress lines, for display: the harness appends one JSON object a line to
DIR/scratch/progress.jsonl inside the sandbox (runner.harness); whoever shows how far a run got
(the local runner's lookup, `autoresearch status`, the dashboard) reads its latest whole line here.

The file is the sandbox's, so it is read as a hostile process may have left it: a link it planted
there is not followed, a pipe or device is not read, and only the end of the file is looked at.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

PROGRESS_FILE = Path("scratch") / "progress.jsonl"
TAIL_BYTES = 4096  # the end of the file read: a progress line is far shorter


def last_progress(run_dir: Path | str) -> dict[str, Any] | None:
    """The latest whole progress line of the run in `run_dir` (the one before it while the last is
    still being written), or None: no file yet, not a regular file, no line that is a JSON object."""
    try:
        fd = os.open(Path(run_dir) / PROGRESS_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        handle.seek(max(0, info.st_size - TAIL_BYTES))
        lines = handle.read(TAIL_BYTES).decode(errors="replace").splitlines()
    for line in reversed(lines[-2:]):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict):
            return data
    return None
