"""A remote runner's memory of its runs: one JSON file per run id in a directory of the state dir.

The Actions and Modal runners keep there what they must find again after a restart (the workflow
run or the Modal call of each job, its attempts, its outcome). A file that is missing or cannot be
read is no record.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from runner import files


class RunRecords:
    def __init__(self, directory: Path) -> None:
        self.dir = directory

    def path(self, run_id: int) -> Path:
        return self.dir / f"{run_id}.json"

    def read(self, run_id: int) -> dict[str, Any] | None:
        try:
            data = json.loads(self.path(run_id).read_text())
        except (FileNotFoundError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def write(self, record: dict[str, Any]) -> None:
        """Atomically: a reader (or a restarted bot) sees the old record or the new one (two
        writers of one record never share a temporary file: runner.files)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        files.write_text(self.path(record["run_id"]), json.dumps(record))
