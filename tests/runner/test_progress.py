"""A run's latest progress line: the last whole one, and nothing a hostile train.py planted."""

from __future__ import annotations

import json
import os
from pathlib import Path

from runner.progress import PROGRESS_FILE, last_progress


def write(run_dir: Path, text: str) -> Path:
    path = run_dir / PROGRESS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_the_latest_whole_line_is_read(tmp_path: Path):
    write(tmp_path, json.dumps({"step": 1}) + "\n" + json.dumps({"step": 2, "loss": 3.5}) + "\n")
    assert last_progress(tmp_path) == {"step": 2, "loss": 3.5}
    assert last_progress(str(tmp_path)) == {"step": 2, "loss": 3.5}


def test_a_line_still_being_written_leaves_the_one_before(tmp_path: Path):
    write(tmp_path, json.dumps({"step": 1}) + "\n" + json.dumps({"step": 2}) + '\n{"step": 3')
    assert last_progress(tmp_path) == {"step": 2}


def test_no_file_or_no_object_is_no_progress(tmp_path: Path):
    assert last_progress(tmp_path) is None
    write(tmp_path, "[1, 2]\nnot json\n")
    assert last_progress(tmp_path) is None


def test_a_link_or_a_pipe_the_run_planted_is_not_read(tmp_path: Path):
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"token": "s3cret"}) + "\n")
    link_dir, fifo_dir = tmp_path / "link", tmp_path / "fifo"
    (link_dir / PROGRESS_FILE).parent.mkdir(parents=True)
    (link_dir / PROGRESS_FILE).symlink_to(secret)
    (fifo_dir / PROGRESS_FILE).parent.mkdir(parents=True)
    os.mkfifo(fifo_dir / PROGRESS_FILE)
    assert last_progress(link_dir) is None
    assert last_progress(fifo_dir) is None  # and it does not block
