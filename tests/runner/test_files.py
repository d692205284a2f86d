"""Atomic writes (runner.files): a reader sees the old file or the new one, and two writers of one
file at once never mix their halves."""

from __future__ import annotations

import threading
from pathlib import Path

from runner import files


def test_two_writers_of_one_file_at_once_each_write_whole(tmp_path: Path) -> None:
    path = tmp_path / "record.json"
    half_written, other_done = threading.Event(), threading.Event()

    def slow(tmp: Path) -> None:  # writes half, waits for the other writer to finish, writes the rest
        with open(tmp, "w") as handle:
            handle.write("first-")
            handle.flush()
            half_written.set()
            assert other_done.wait(30)
            handle.write("whole")

    first = threading.Thread(target=files.write_atomically, args=(path, slow))
    first.start()
    assert half_written.wait(30)
    files.write_text(path, "second-whole")
    assert path.read_text() == "second-whole"
    other_done.set()
    first.join(30)
    assert path.read_text() == "first-whole"  # the last to finish wins, whole
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]
