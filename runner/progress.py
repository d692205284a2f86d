"""A run's progress lines, for display: the harness appends one JSON object a line to
DIR/scratch/progress.jsonl inside the sandbox (runner.harness); whoever shows how far a run got
(the local runner's lookup, `autoresearch status`, the dashboard) reads its latest whole line here.

The file is the sandbox's, so it is read as a hostile process may have left it: a link it planted
there is not followed, a pipe or device is not read, and only the end of the file is looked at.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from runner import files

PROGRESS_FILE = Path("scratch") / "progress.jsonl"
TAIL_BYTES = 4096  # the end of the file read: a progress line is far shorter


def last_progress(run_dir: Path | str) -> dict[str, Any] | None:
    """The latest whole progress line of the run in `run_dir` (the one before it while the last is
    still being written), or None: no file yet, not a regular file, no line that is a JSON object."""
    tail = files.read_regular(Path(run_dir) / PROGRESS_FILE, TAIL_BYTES, from_end=True)
    if tail is None:
        return None
    lines = tail.decode(errors="replace").splitlines()
    for line in reversed(lines[-2:]):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict):
            return data
    return None
