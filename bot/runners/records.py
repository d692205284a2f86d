"""A remote runner's memory of its runs: one JSON file per run id in a directory of the state dir.

The Actions and Modal runners keep there what they must find again after a restart (the workflow
run or the Modal call of each job, its attempts, its outcome). A file that is missing or cannot be
read is no record.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


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
        """Atomically: a reader (or a restarted bot) sees the old record or the new one. Each write
        fills a temporary file of its own, so two writers of one record (a bot and the one that
        replaces it) cannot write into each other's temporary file: the last to finish wins whole."""
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.path(record["run_id"])
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(json.dumps(record))
            os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)
