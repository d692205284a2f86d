"""A process waiting in a directory that is renamed before its job comes moves what its environment
says about that directory to the new name, torch's caches included (runner.workdir)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from runner import workdir


def test_follow_moves_every_environment_path_under_the_old_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = tmp_path / ".standby-0-1-0" / "scratch"
    before.mkdir(parents=True)
    monkeypatch.chdir(before)
    # as a warm worker's environment reads once torch's inductor has asked for its cache directory
    monkeypatch.setenv("HOME", str(before))
    monkeypatch.setenv("TMPDIR", str(before))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(before / "torchinductor_root"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(before / "triton"))
    monkeypatch.setenv("AUTORESEARCH_CACHE", "/elsewhere")
    monkeypatch.setattr(tempfile, "tempdir", str(before))
    os.rename(tmp_path / ".standby-0-1-0", tmp_path / "7")

    here = workdir.follow(str(before))

    after = tmp_path / "7" / "scratch"
    assert here == str(after)
    assert os.environ["HOME"] == os.environ["TMPDIR"] == str(after)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(after / "torchinductor_root")
    assert os.environ["TRITON_CACHE_DIR"] == str(after / "triton")
    assert os.environ["AUTORESEARCH_CACHE"] == "/elsewhere"  # not under it: left alone
    assert tempfile.gettempdir() == str(after)


def test_follow_changes_nothing_when_the_directory_kept_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert workdir.follow(str(tmp_path)) == str(tmp_path)
    assert os.environ["TMPDIR"] == str(tmp_path)
