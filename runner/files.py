"""Atomic file writes: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path


def write_atomically(path: Path, write: Callable[[Path], object]) -> None:
    """Call `write(tmp)` to fill a temporary file beside `path`, then move it into place. The
    temporary file is this thread's own: two writers of one file (a bot and the one that replaced
    it) never write into each other's, and the last to finish wins whole."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_native_id()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_bytes(path: Path, data: bytes) -> None:
    write_atomically(path, lambda tmp: tmp.write_bytes(data))


def write_text(path: Path, text: str) -> None:
    write_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
