"""A run's resources and its end, against hostile train.py files: memory, tasks and scratch past
their limits end the run as a crash that names the limit; a training process killed from outside
is `lost`, not a crash; a timeout leaves no process of the run behind, sandboxed or not. After
each, the same path serves the next job.

Limits are set small through the supervisor's environment (runner.limits); each run costs the
smoke profile's seconds with a tiny untrained model.

All of these are the slow tier: each is a run of its own, and what is under test is the real
supervisor ending it. `make test` checks the same limits on a tree of plain processes
(tests/runner/test_limits.py).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from hostile import escape, marked

from runner import limits, proctree, profiles, sandbox
from runner.isolated import Supervisor, run_job
from runner.protocol import JobSpec, ResultSpec

SANDBOX = pytest.param(
    None,
    id="sandboxed",
    marks=pytest.mark.skipif(not sandbox.available()[0], reason=f"no sandbox here: {sandbox.available()[1]}"),
)
BOTH = [SANDBOX, pytest.param(False, id="unsandboxed")]
HEADER = """
import os, sys, time
import torch
from runner import harness
h = harness.session()
model = torch.nn.Sequential(torch.nn.Embedding(h.vocab_size, 8), torch.nn.Linear(8, h.vocab_size))
"""
MARK = "autoresearch-limits-marker"
ESCAPE = escape(MARK)  # processes that leave the run's tree every way a train.py can


def job(body: str) -> JobSpec:
    return JobSpec(run_id=1, asset=HEADER + body, profile="smoke", seed=0)


def leftovers() -> list[int]:
    return marked(MARK)


def serves_next_job(tmp_path: Path, use_sandbox: bool | None) -> None:
    result = run_job(job("h.finish(model)\n"), tmp_path / "next", threads=1, use_sandbox=use_sandbox)
    assert result.status == "ok" and result.val_bpb is not None, result.error
    assert not leftovers()


@pytest.mark.slow
def test_a_run_past_its_memory_limit_crashes_saying_so(
    smoke_prepared, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slow tier: a run whose processes take 2.4 GB until the supervisor stops them, then the next job."""
    # Three processes of 800 MB each: none passes the per-process limit, the tree does.
    monkeypatch.setenv(limits.ENV["memory"], "1500M")
    body = """
import multiprocessing
def hold():
    block = bytearray(800 << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    time.sleep(120)
workers = [multiprocessing.get_context("fork").Process(target=hold) for _ in range(3)]
for w in workers:
    w.start()
time.sleep(120)
"""
    result = run_job(job(body), tmp_path / "run", threads=1)
    # a crash for the limit, not a timeout at the hard limit: stopped when it crossed it
    assert result.status == "crash" and "more than 1.5 GiB of memory (the limit per run)" in result.error, result.error
    monkeypatch.delenv(limits.ENV["memory"])
    serves_next_job(tmp_path, None)


@pytest.mark.slow
def test_one_allocation_past_the_memory_limit_fails_inside_train_py(
    smoke_prepared, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slow tier: the kernel's limit must fail an allocation inside a real run."""
    monkeypatch.setenv(limits.ENV["memory"], "2G")
    result = run_job(job("block = bytearray(3 << 30)\n"), tmp_path / "run", threads=1)
    assert result.status == "crash" and "ran out of memory: a run may hold 2 GiB" in result.error, result.error
    assert "MemoryError" in result.error


@pytest.mark.slow
def test_a_bounded_fork_bomb_is_stopped(smoke_prepared, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slow tier: a run that forks until the limit stops it, then the next job."""
    monkeypatch.setenv(limits.ENV["tasks"], "64")
    body = f"""
for _ in range(200):
    if os.fork() == 0:
        os.execvp("sh", ["sh", "-c", "sleep 600; :", "{MARK}"])
time.sleep(120)
"""
    result = run_job(job(body), tmp_path / "run", threads=1)
    # The kernel refuses the 65th task where the sandbox's uid is not root outside; as root (this
    # test's CI container) the supervisor's count stops the run.
    assert result.status == "crash" and (
        "more than 64 processes and threads" in result.error
        or "could not start another process or thread" in result.error
    ), result.error
    assert not leftovers()
    monkeypatch.delenv(limits.ENV["tasks"])
    serves_next_job(tmp_path, None)


@pytest.mark.slow
def test_filling_scratch_past_its_limit_is_stopped(
    smoke_prepared, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slow tier: a run that writes until the supervisor stops it, then the next job."""
    monkeypatch.setenv(limits.ENV["scratch"], "50M")
    body = """
with open("filler", "wb") as out:
    for _ in range(20):
        out.write(os.urandom(10 << 20))
        out.flush()
time.sleep(120)
"""
    result = run_job(job(body), tmp_path / "run", threads=1)
    assert result.status == "crash" and "more than 50 MiB to its scratch directory" in result.error, result.error
    monkeypatch.delenv(limits.ENV["scratch"])
    serves_next_job(tmp_path, None)


@pytest.mark.slow
@pytest.mark.parametrize("use_sandbox", BOTH)
def test_a_training_process_killed_from_outside_is_lost_not_a_crash(
    smoke_prepared, tmp_path: Path, use_sandbox: bool | None
) -> None:
    """Slow tier: a real training process must be running to be killed, then the next job."""
    supervisor = Supervisor(tmp_path / "run", "smoke", threads=1, use_sandbox=use_sandbox)
    supervisor.prepare()
    results: list[ResultSpec] = []
    runner = threading.Thread(
        target=lambda: results.append(supervisor.run(job("print('training', flush=True)\ntime.sleep(300)\n")))
    )
    runner.start()
    log = tmp_path / "run" / "log.txt"
    deadline = time.time() + 120
    while b"training" not in log.read_bytes():
        assert time.time() < deadline, "train.py never started"
        time.sleep(0.1)
    assert supervisor.trainer is not None
    # As the OOM killer would: the process running train.py, inside the sandbox or not.
    tree = proctree.descendants([supervisor.trainer.pid], proctree.snapshot()) | {supervisor.trainer.pid}
    training = max(pid for pid in tree if b"runner.execute" in Path(f"/proc/{pid}/cmdline").read_bytes())
    os.kill(training, signal.SIGKILL)
    runner.join(timeout=60)
    assert results and results[0].status == "lost", results
    assert "killed by SIGKILL" in results[0].error and "runs again" in results[0].error
    serves_next_job(tmp_path, use_sandbox)


class MovableClock:
    """runner.isolated's `time` module, whose wall clock the test moves forward: the supervisor's
    hard limit passes when the test says so, however long the run took to get there."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def time(self) -> float:
        return time.time() + self.ahead

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


@pytest.mark.slow
@pytest.mark.parametrize("use_sandbox", BOTH)
def test_a_timeout_ends_every_process_of_the_run(
    smoke_prepared, tmp_path: Path, use_sandbox: bool | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slow tier: a real run must be running, its escaped processes with it, when its hard limit
    passes, then the next job. The limit passes once they all run (the supervisor's clock moved
    past it), not at a time fixed in advance: on a busy machine the escape took longer than 8 s."""
    clock = MovableClock()
    monkeypatch.setattr("runner.isolated.time", clock)
    results: list[ResultSpec] = []
    # a loop that sleeps: a busy one would meet its CPU cap first (rejected), not the hard limit
    body = ESCAPE + "import time\nwhile True:\n    time.sleep(0.1)\n"
    runner = threading.Thread(
        target=lambda: results.append(run_job(job(body), tmp_path / "run", threads=1, use_sandbox=use_sandbox))
    )
    runner.start()
    log = tmp_path / "run" / "log.txt"
    deadline = time.time() + 300
    while not (log.exists() and b"escaped" in log.read_bytes()):
        assert runner.is_alive() and time.time() < deadline, f"train.py never escaped: {results}"
        time.sleep(0.1)
    assert len(leftovers()) == 3
    clock.ahead = profiles.get_profile("smoke").max_total_s  # the hard limit is behind us now
    runner.join(timeout=120)
    assert results and results[0].status == "timeout" and "hard limit" in results[0].error, results
    assert not leftovers()
    monkeypatch.undo()
    serves_next_job(tmp_path, use_sandbox)
