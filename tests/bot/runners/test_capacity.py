"""The slot count an operator changes while the bot runs (bot.runners.capacity): read again when
the file changes, the configured number without it, capped where a runner must cap it, and a file
that makes no sense said in the log while the last good number holds. Then each runner's slots."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest

from bot.runners.actions import ActionsRunner, ActionsSettings
from bot.runners.capacity import Slots, slots_file
from bot.runners.local import LocalRunner, Standby
from bot.runners.modal import ModalRunner


def write(path: Path, text: str) -> None:
    """Write the file and move its modification time on, as a later edit would (a test is faster
    than the file system's clock)."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text)
    os.utime(path, ns=(before + 10**9, before + 10**9))


def test_without_the_file_the_configured_number_counts(tmp_path: Path) -> None:
    assert Slots(slots_file(tmp_path), 3)() == 3
    assert Slots(None, 2)() == 2
    with pytest.raises(ValueError):
        Slots(None, 0)


def test_a_number_written_to_the_file_counts_from_the_next_read(tmp_path: Path) -> None:
    path = slots_file(tmp_path)
    slots = Slots(path, 4)
    write(path, "16\n")
    assert slots() == 16
    write(path, "2")
    assert slots() == 2
    path.unlink()
    assert slots() == 4


def test_a_runner_that_must_cap_the_number_caps_it(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = slots_file(tmp_path)
    slots = Slots(path, 4, cap=4)
    write(path, "8")
    with caplog.at_level(logging.WARNING):
        assert slots() == 4
    assert "at most 4" in caplog.text


@pytest.mark.parametrize("text", ["twelve", "0", "-3", ""])
def test_a_file_that_makes_no_sense_keeps_the_last_good_number(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, text: str
) -> None:
    path = slots_file(tmp_path)
    slots = Slots(path, 4)
    write(path, "6")
    assert slots() == 6
    write(path, text)
    with caplog.at_level(logging.WARNING):
        assert slots() == 6
        assert slots() == 6
    assert caplog.text.count("keeping 6 slot(s)") == 1  # said once, not at every tick


def test_modal_slots_follow_the_file(tmp_path: Path) -> None:
    runner = ModalRunner(tmp_path, calls=None, slots=2, slots_file=slots_file(tmp_path))  # type: ignore[arg-type]
    assert runner.slots == 2
    write(slots_file(tmp_path), "12")
    assert runner.slots == 12


def test_actions_slots_are_the_runners_in_the_file_each_with_its_queue_ahead(tmp_path: Path) -> None:
    settings = ActionsSettings(runners=2, queue_ahead=1)
    runner = ActionsRunner(lambda: None, tmp_path, settings, slots_file=slots_file(tmp_path))  # type: ignore[arg-type,return-value]
    assert runner.slots == 4
    write(slots_file(tmp_path), "5")
    assert runner.slots == 10


class WaitingWorker:
    """A warm worker's process as Standby sees it: its pipe, closed when it is sent away."""

    class Pipe:
        closed = False

        def close(self) -> None:
            self.closed = True

    def __init__(self) -> None:
        self.stdin = self.Pipe()


def test_a_local_slot_taken_away_sends_its_warm_worker_away_and_takes_no_run(tmp_path: Path) -> None:
    runner = LocalRunner(tmp_path / "runs", slots=4, slots_file=slots_file(tmp_path))
    workers: dict[int, Any] = {slot: WaitingWorker() for slot in range(4)}
    runner._standby = {slot: Standby(w, tmp_path / f"w{slot}", "smoke", None) for slot, w in workers.items()}  # type: ignore[arg-type]
    runner._slot_of = {11: 0, 12: 3}  # runs on slots 0 and 3
    write(slots_file(tmp_path), "2")
    assert runner.slots == 2
    assert [workers[s].stdin.closed for s in range(4)] == [False, False, True, True]
    assert runner._free_slot() == 1  # slot 3's run goes on; a new run goes to a slot still there
    write(slots_file(tmp_path), "6")
    assert runner.slots == 4  # never more than it started with: each slot's threads and memory are fixed
