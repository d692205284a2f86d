"""Files of a run: atomic writes (a reader sees the old file or the new one, never half of one), and
reads of what a sandboxed process left (`read_regular`: no link followed, no pipe or device read)."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

# The exported model (runner.handoff): written by the training process to its scratch directory,
# copied by the supervisor to the scorer's hand-over directory. A plain name here, so that the
# supervisor, which only moves the file, need not import torch.
MODEL_FILE = "model.pt2"


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


def read_regular(path: Path, limit: int, *, offset: int = 0, from_end: bool = False) -> bytes | None:
    """Up to `limit` bytes of a file a training process wrote (from `offset`, or its last `limit`
    bytes with `from_end`), or None unless it is a regular file; read whole from the start, it must
    also be within the limit. The process chose what lies at that path: a symbolic link to a secret
    outside its sandbox is not followed, and a pipe or device that would block is not read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or (offset == 0 and not from_end and info.st_size > limit):
            return None
        handle.seek(max(0, info.st_size - limit) if from_end else offset)
        return handle.read(limit)
