"""DIR/log.txt, a run's log: the training process's output and the supervisor's own lines, capped,
and closed with the reference's summary block (`grep "^val_bpb:" log.txt`).

What train.py prints is untrusted: the log keeps its first LOG_LIMIT_BYTES (a run printing more
loses the rest, not the disk), and a line of its own that looks like the score is marked as its
claim (runner.isolated), so that only the supervisor's summary says val_bpb.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import BinaryIO

LOG_LIMIT_BYTES = 4 << 20
LOG_TAIL_LINES = 60


class RunLog:
    """The log file of one run, once `open`ed; `say` also tells the supervisor's stderr."""

    def __init__(self) -> None:
        self._file: BinaryIO | None = None
        self._bytes = 0

    def open(self, path: Path) -> None:
        self._file = open(path, "wb")
        self._bytes = 0

    @property
    def is_open(self) -> bool:
        return self._file is not None

    def write(self, data: bytes) -> None:
        if self._file is None:
            return
        room = LOG_LIMIT_BYTES - self._bytes
        if room >= 0 and data:  # room 0: the log ended exactly at the cap, and this write is the first past it
            self._file.write(data[:room])
            if len(data) > room:
                self._file.write(
                    f"\n[log cut at {LOG_LIMIT_BYTES} bytes: the rest of the output was dropped]\n".encode()
                )
            self._file.flush()
        self._bytes += len(data)

    def say(self, line: str) -> None:
        """A line of the supervisor's own, in the log and on stderr."""
        self.write((line + "\n").encode())
        print(line, file=sys.stderr, flush=True)

    def close(self, summary: str | None = None) -> None:
        """Close the log, after `summary` (written whatever the cap: it is the supervisor's)."""
        if self._file is None:
            return
        if summary is not None:
            self._file.write(("\n" + summary + "\n").encode())
        self._file.close()
        self._file = None


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of the log at `path` ("" if there is none)."""
    try:
        text = path.read_bytes()[-65536:].decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
