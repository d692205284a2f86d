"""A run's log (runner.run_log): what train.py prints is kept up to the cap and then dropped, with a
line that says so; the supervisor's summary is written after it whatever the cap."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner import run_log


def test_output_past_the_cap_is_dropped_with_a_line_that_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_log, "LOG_LIMIT_BYTES", 1050)
    log = run_log.RunLog()
    log.open(tmp_path / "log.txt")
    for _ in range(50):
        log.write(b"x" * 99 + b"\n")
    log.close(summary="---\nval_bpb:          1.000000")
    text = (tmp_path / "log.txt").read_text()
    kept, rest = text.split("\n[log cut at 1050 bytes: the rest of the output was dropped]\n")
    assert kept == ("x" * 99 + "\n") * 10 + "x" * 50
    assert rest == "\n---\nval_bpb:          1.000000\n"


def test_the_tail_is_the_last_lines_of_the_log(tmp_path: Path) -> None:
    (tmp_path / "log.txt").write_text("".join(f"line {i}\n" for i in range(100)))
    assert run_log.tail(tmp_path / "log.txt", lines=2) == "line 98\nline 99"
    assert run_log.tail(tmp_path / "missing.txt") == ""


def test_output_that_ends_exactly_at_the_cap_still_gets_the_line_once_more_comes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_log, "LOG_LIMIT_BYTES", 1000)
    log = run_log.RunLog()
    log.open(tmp_path / "log.txt")
    for _ in range(10):
        log.write(b"x" * 99 + b"\n")  # exactly 1000 bytes: nothing cut yet
    for _ in range(3):
        log.write(b"dropped\n")
    log.close()
    text = (tmp_path / "log.txt").read_text()
    assert text == ("x" * 99 + "\n") * 10 + "\n[log cut at 1000 bytes: the rest of the output was dropped]\n"
