"""The local runner: real child processes under the harness, slots, cancel, and reattach."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bot.records import Job
from bot.runners.local import LocalRunner, last_progress

ROOT = Path(__file__).resolve().parents[2]
TRAIN_PY = (ROOT / "train.py").read_text()


def wait_for(runner: LocalRunner, timeout: float = 120.0) -> list:
    deadline = time.time() + timeout
    while time.time() < deadline:
        done = runner.poll()
        if done:
            return done
        time.sleep(0.1)
    raise AssertionError("no result in time")


def test_slots_share_the_cores(tmp_path: Path) -> None:
    assert LocalRunner(tmp_path, slots=1).free_slots() == 1
    runner = LocalRunner(tmp_path, slots=2)
    assert runner.free_slots() == 2 and runner.threads >= 1
    with pytest.raises(ValueError):
        LocalRunner(tmp_path, slots=0)


@pytest.mark.slow
def test_a_run_reports_its_measurement_and_progress(tmp_path: Path, smoke_prepared) -> None:
    runner = LocalRunner(tmp_path, slots=1)
    handle = runner.start(Job(run_id=7, asset=TRAIN_PY, profile="smoke", seed=7))
    assert handle == runner.handle(7) and runner.free_slots() == 0
    [result] = wait_for(runner)
    assert result.run_id == 7 and result.status == "ok" and result.val_bpb > 0
    assert result.metrics["seed"] == 7 and result.metrics["profile"] == "smoke"
    assert "val_bpb:" in result.log_tail
    assert last_progress(Path(handle))["progress"] == 1.0
    assert runner.free_slots() == 1


def test_a_crash_is_a_result_with_the_error(tmp_path: Path, smoke_prepared) -> None:
    runner = LocalRunner(tmp_path, slots=1)
    runner.start(Job(run_id=1, asset="raise KeyError('no such knob')\n", profile="smoke", seed=1))
    [result] = wait_for(runner)
    assert result.status == "crash" and result.val_bpb is None
    assert "KeyError" in result.error and "no such knob" in result.error


def test_cancel_stops_the_job_and_reports_nothing(tmp_path: Path, smoke_prepared) -> None:
    runner = LocalRunner(tmp_path, slots=1)
    runner.start(Job(run_id=2, asset="import time\ntime.sleep(60)\n", profile="smoke", seed=2))
    time.sleep(1.0)
    runner.cancel(2)
    assert runner.free_slots() == 1
    time.sleep(0.5)
    assert runner.poll() == []
    assert not (tmp_path / "2" / "result.json").exists()


def test_reattach_after_a_restart(tmp_path: Path, smoke_prepared) -> None:
    first = LocalRunner(tmp_path, slots=1)
    first.start(Job(run_id=3, asset="import time\ntime.sleep(3)\nraise SystemExit(3)\n", profile="smoke", seed=3))
    time.sleep(0.5)
    # a new runner (the conductor restarted) adopts the job that is still running, by its handle
    second = LocalRunner(tmp_path, slots=1)
    assert second.reattach(3, second.handle(3)) is True
    assert second.free_slots() == 0
    [result] = wait_for(second)
    assert result.run_id == 3 and result.status == "crash"
    first.poll()  # reap our own child

    # a handle whose process is gone and that left no result cannot be adopted
    (tmp_path / "9").mkdir()
    assert LocalRunner(tmp_path).reattach(9, str(tmp_path / "9")) is False
