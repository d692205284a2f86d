"""The harness's clock: CPU profiles count the process's CPU time per allotted thread, so that a
busy machine slows a run down without shortening its training; GPU profiles count wall time. The
run's clock starts at the hand-over and counts everything (the supervisor's, read in the process):
training ends a step and the export margin before the cap."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest
import torch

from runner.harness import Session, ThreadsChanged
from runner.profiles import PROFILES, Profile, get_profile

SMOKE = get_profile("smoke")  # clock "cpu", 3 s budget, 1 warm-up step
# on 2 threads: a cap of 5 s, training ends by 4 s on the run's clock
TIGHT = replace(SMOKE, name="tight", time_budget_s=3.0, allowance_s=4.0, export_margin_s=2.0)


class HandClock:
    """A clock that moves only when the test says so."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def open_session(
    prepared, tmp_path, profile: Profile = TIGHT, threads: int = 2
) -> tuple[Session, HandClock, HandClock]:
    wall, cpu = HandClock(), HandClock(start=50.0)
    session = Session(
        profile,
        prepared.dataset,
        prepared.tokenizer,
        out_dir=tmp_path,
        device=torch.device("cpu"),
        threads=threads,
        wall_clock=wall,
        cpu_clock=cpu,
    )
    return session, wall, cpu


def step(session: Session, wall: HandClock, cpu: HandClock, wall_s: float, cpu_s: float) -> None:
    wall.advance(wall_s)
    cpu.advance(cpu_s)
    session.step_done(2.0)


def steps_until_time_up(session: Session, wall: HandClock, cpu: HandClock, wall_s: float, cpu_s: float) -> int:
    timed = 0
    while not session.time_up():
        step(session, wall, cpu, wall_s, cpu_s)
        timed += 1
    return timed


def test_half_the_cpu_counts_half_the_time(smoke_prepared, tmp_path):
    alone, wall, cpu = open_session(smoke_prepared, tmp_path / "alone")
    step(alone, wall, cpu, wall_s=0.5, cpu_s=1.0)  # the warm-up step: on the run's clock, not in training_seconds
    assert alone.elapsed() == pytest.approx(0.5)
    assert alone.training_seconds == alone.training_wall_seconds == alone.cpu_seconds == 0.0
    assert steps_until_time_up(alone, wall, cpu, wall_s=0.5, cpu_s=1.0) == 6  # 2 threads busy

    busy, wall, cpu = open_session(smoke_prepared, tmp_path / "busy")
    step(busy, wall, cpu, wall_s=1.0, cpu_s=1.0)
    for _ in range(6):  # the same steps, on a machine where neighbours take half of the cores
        step(busy, wall, cpu, wall_s=1.0, cpu_s=1.0)
    assert busy.training_seconds == pytest.approx(3.0) and busy.time_up()
    assert busy.training_wall_seconds == pytest.approx(6.0)
    assert busy.cpu_seconds == pytest.approx(6.0)
    assert busy.cpu_share() == pytest.approx(0.5)
    assert alone.cpu_share() == pytest.approx(1.0)
    assert alone.step == busy.step == 7, "the neighbours cost wall time, not training steps"


def test_everything_from_the_hand_over_counts_and_training_ends_before_the_cap(smoke_prepared, tmp_path):
    session, wall, cpu = open_session(smoke_prepared, tmp_path)
    cpu.advance(1.0)  # start-up: the session, the model's build (0.5 s on 2 threads)
    assert session.elapsed() == pytest.approx(0.5) and session.progress() == 0.0
    step(session, wall, cpu, wall_s=1.0, cpu_s=1.0)  # a warm-up step: counted, and progress starts after it
    assert session.elapsed() == pytest.approx(1.0) and session.progress() == 0.0
    timed = steps_until_time_up(session, wall, cpu, wall_s=0.3, cpu_s=0.6)
    # Steps of 0.3 s from 1.0: the tenth would end at 4.0, where training must have ended (the cap
    # less the export margin): nine, and the room for the export is left whole.
    assert timed == 9 and session.elapsed() == pytest.approx(3.7)
    assert session.elapsed() <= TIGHT.training_ends_s(2) == 4.0
    assert session.training_seconds == pytest.approx(2.7)
    assert session.progress() == 1.0  # 1 as training ends, so a schedule on it (the warmdown) runs to its end


def test_a_slow_step_ends_training_a_step_earlier(smoke_prepared, tmp_path):
    session, wall, cpu = open_session(smoke_prepared, tmp_path)
    step(session, wall, cpu, wall_s=0.5, cpu_s=1.0)
    step(session, wall, cpu, wall_s=0.5, cpu_s=1.0)
    step(session, wall, cpu, wall_s=1.5, cpu_s=3.0)  # a step of 1.5 s: at 2.5, the next would end at 4.0
    assert session.time_up()


def test_cpu_overheads_are_cpu_seconds_shared_by_the_threads():
    # start-up and export are mostly serial: a run with more threads gets no more CPU seconds of slack
    assert TIGHT.cap_s(1) == 7.0 and TIGHT.cap_s(2) == 5.0 and TIGHT.training_ends_s(4) == 3.5
    on_wall = replace(TIGHT, clock="wall")
    assert on_wall.cap_s(1) == on_wall.cap_s(8) == 7.0 and on_wall.training_ends_s(8) == 5.0
    with pytest.raises(ValueError, match="export margin"):
        replace(TIGHT, export_margin_s=5.0)


def test_hand_over_readings_are_the_clocks_zero(smoke_prepared, tmp_path):
    wall, cpu = HandClock(), HandClock(start=50.0)
    session = Session(
        TIGHT,
        smoke_prepared.dataset,
        smoke_prepared.tokenizer,
        out_dir=tmp_path,
        device=torch.device("cpu"),
        threads=2,
        wall_clock=wall,
        cpu_clock=cpu,
        handed_over=(wall.now - 10.0, cpu.now - 3.0),
    )  # data and tokenizer took 3 CPU s
    assert session.elapsed() == pytest.approx(1.5)
    wall_profile = replace(TIGHT, clock="wall")
    on_wall = Session(
        wall_profile,
        smoke_prepared.dataset,
        smoke_prepared.tokenizer,
        out_dir=tmp_path / "w",
        device=torch.device("cpu"),
        threads=2,
        wall_clock=wall,
        cpu_clock=cpu,
        handed_over=(wall.now - 10.0, cpu.now - 3.0),
    )
    assert on_wall.elapsed() == pytest.approx(10.0) and on_wall.time_up()


def test_threads_beyond_the_allotment_spend_the_budget_faster(smoke_prepared, tmp_path):
    session, wall, cpu = open_session(smoke_prepared, tmp_path, threads=2)
    step(session, wall, cpu, 1.0, 2.0)
    step(session, wall, cpu, wall_s=1.0, cpu_s=4.0)  # four threads busy for a second
    assert session.training_seconds == pytest.approx(2.0)
    assert session.cpu_share() == pytest.approx(2.0)


@pytest.mark.parametrize("change", [-1, +1])
def test_changing_torchs_threads_after_open_ends_the_run(smoke_prepared, tmp_path, change):
    session, wall, cpu = open_session(smoke_prepared, tmp_path, threads=2)
    step(session, wall, cpu, 1.0, 2.0)
    torch_threads = torch.get_num_threads()
    try:
        torch.set_num_threads(max(1, torch_threads + change))
        if torch.get_num_threads() == torch_threads:
            pytest.skip("one thread only: it cannot be lowered")
        with pytest.raises(ThreadsChanged, match="Remove the torch.set_num_threads call"):
            step(session, wall, cpu, 1.0, 2.0)
    finally:
        torch.set_num_threads(torch_threads)
    assert session.step == 1


def test_allotted_threads_default_to_torchs_at_open(smoke_prepared, tmp_path):
    session, _, _ = open_session(smoke_prepared, tmp_path, threads=0)
    assert session.threads == torch.get_num_threads()


def test_wall_clock_profile_counts_wall_time(smoke_prepared, tmp_path):
    assert PROFILES["h100"].clock == "wall"
    gpu_like = replace(SMOKE, name="wall-smoke", clock="wall")
    session, wall, cpu = open_session(smoke_prepared, tmp_path, profile=gpu_like)
    step(session, wall, cpu, 5.0, 5.0)
    step(session, wall, cpu, wall_s=2.0, cpu_s=0.1)  # a GPU step: the CPU mostly waits
    assert session.training_seconds == pytest.approx(2.0)
    assert session.cpu_seconds == pytest.approx(0.1)


def test_cpu_profiles_count_cpu_time():
    assert {name: p.clock for name, p in PROFILES.items()} == {"h100": "wall", "cpu": "cpu", "smoke": "cpu"}
    with pytest.raises(ValueError, match="clock must be one of"):
        replace(SMOKE, clock="gpu")


def test_progress_lines_record_both_clocks(smoke_prepared, tmp_path):
    session, wall, cpu = open_session(smoke_prepared, tmp_path)
    step(session, wall, cpu, 1.0, 2.0)
    step(session, wall, cpu, wall_s=2.0, cpu_s=1.0)
    line = json.loads((tmp_path / "progress.jsonl").read_text().splitlines()[-1])
    # the warm-up step ended at 1.0 s on the run's clock, training ends by 4.0 less one step of 0.5 s
    # (the guard time_up keeps): 0.5 s of the 2.5 s window
    assert line["training_seconds"] == 0.5 and line["progress"] == pytest.approx(0.5 / 2.5, abs=1e-4)
    assert (line["elapsed_seconds"], line["remaining_seconds"], line["time_up"]) == (1.5, 2.5, False)
    assert (line["clock"], line["training_wall_seconds"], line["cpu_seconds"], line["threads"], line["cpu_share"]) == (
        "cpu",
        2.0,
        1.0,
        2,
        0.25,
    )


def test_a_process_that_does_not_run_spends_no_budget(smoke_prepared, tmp_path, monkeypatch):
    """With the real clocks: sleeping (as a process waiting for the cores would) costs wall time
    only. Replacing time.process_time after the session opened changes nothing."""
    session = Session(
        SMOKE, smoke_prepared.dataset, smoke_prepared.tokenizer, out_dir=tmp_path, device=torch.device("cpu"), threads=1
    )
    session.step_done(2.0)
    monkeypatch.setattr(time, "process_time", lambda: 0.0)
    time.sleep(0.3)
    session.step_done(2.0)
    assert session.training_wall_seconds >= 0.3
    assert session.training_seconds < 0.1
    busy_until = time.thread_time() + 0.3  # 0.3 s of this thread's CPU time, however busy the machine
    while time.thread_time() < busy_until:
        pass
    session.step_done(2.0)
    assert session.training_seconds >= 0.3, "the real CPU clock is still the one counting"
