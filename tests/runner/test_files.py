"""Files of a run (runner.files): atomic writes, where a reader sees the old file or the new one and two
writers of one file at once never mix their halves; and the reader of what a sandboxed process wrote,
which follows no link and reads no pipe."""

from __future__ import annotations

import os
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


def test_what_a_training_process_wrote_is_read_only_from_a_regular_file(tmp_path: Path) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text('{"error": "SECRET-VALUE"}')
    os.symlink(secret, tmp_path / "claims.json")  # planted in scratch, pointing outside the sandbox
    os.mkfifo(tmp_path / "progress.jsonl")  # a pipe that would block a reader for ever
    assert files.read_regular(tmp_path / "claims.json", 1 << 20) is None
    assert files.read_regular(tmp_path / "progress.jsonl", 1 << 20) is None
    assert files.read_regular(tmp_path / "missing", 1 << 20) is None
    assert files.read_regular(secret, 1 << 20) == b'{"error": "SECRET-VALUE"}'


def test_a_file_read_whole_must_be_within_the_limit_and_a_tail_is_its_end(tmp_path: Path) -> None:
    log = tmp_path / "log.txt"
    log.write_bytes(b"0123456789")
    assert files.read_regular(log, 4) is None
    assert files.read_regular(log, 4, from_end=True) == b"6789"
    assert files.read_regular(log, 4, offset=2) == b"2345"
