"""The local runner: real child processes under the harness, one run per id, lookup from the run
directory alone (so a restarted conductor finds its jobs), cancel, and a GPU per slot."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from hostile import escape
from hostile import marked as hostile_marked

from bot.core.records import Job, RunStatus
from bot.runners import local
from bot.runners.local import LocalRunner, last_progress
from runner import proctree

ROOT = Path(__file__).resolve().parents[3]
TRAIN_PY = (ROOT / "train.py").read_text()
# hands over an untrained model at once: a run costs its imports, export and scoring, no training
UNTRAINED = (
    "import torch\nfrom runner import harness\nh = harness.session()\n"
    "model = torch.nn.Sequential(torch.nn.Embedding(h.vocab_size, 8), torch.nn.Linear(8, h.vocab_size))\n"
    "h.finish(model)\n"
)


def wait_for(runner: LocalRunner, run_id: int, timeout: float = 120.0) -> RunStatus:
    deadline = time.time() + timeout
    while time.time() < deadline:
        status = runner.lookup(run_id)
        if status.state not in ("queued", "running"):
            return status
        time.sleep(0.1)
    raise AssertionError("no result in time")


def wait_for_processes_of(pid: int, timeout: float = 120.0) -> dict[int, int]:
    """The processes below `pid` once there are some (a supervisor has started its run), each pid
    with its start time: with the pid, that names a process (pids are reused, soon on a busy machine)."""
    deadline = time.time() + timeout
    while not (found := proctree.descendants([pid], procs := proctree.snapshot())):
        assert time.time() < deadline, f"process {pid} never started a process"
        time.sleep(0.05)
    return {child: procs[child].start for child in found}


def still_running(started: dict[int, int]) -> list[int]:
    """Which of the processes `started` (pid -> start time) are alive, not zombies, and the same
    processes: a pid reused by another process since does not count."""
    procs = proctree.snapshot()
    return [
        pid for pid, start in started.items() if pid in procs and procs[pid].start == start and not procs[pid].zombie
    ]


def describe(pids: list[int]) -> str:
    """Each process as /proc shows it now (its state, parent and command line), to say why it lives."""
    said = []
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
            said.append(f"{pid} state {stat[0]} parent {stat[1]}: {cmd}")
        except OSError:
            said.append(f"{pid} gone")
    return "; ".join(said)


def running(pid: int) -> bool:
    """Whether `pid` is alive and not a zombie."""
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def wait_until_stopped(pid: int, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        assert time.time() < deadline, f"process {pid} never stopped itself"
        time.sleep(0.01)


def test_slots_share_the_cores(tmp_path: Path) -> None:
    runner = LocalRunner(tmp_path, slots=2)
    assert runner.slots == 2 and runner.threads == max(1, (os.cpu_count() or 1) // 2)
    with pytest.raises(ValueError):
        LocalRunner(tmp_path, slots=0)


def test_an_unknown_run_is_unknown(tmp_path: Path) -> None:
    assert LocalRunner(tmp_path).lookup(5).state == "unknown"


@pytest.mark.slow
def test_a_run_reports_its_measurement_and_progress(tmp_path: Path, smoke_prepared) -> None:
    """Slow tier: the real train.py trains its whole budget through the runner."""
    runner = LocalRunner(tmp_path, slots=1)
    job = Job(run_id=7, asset=TRAIN_PY, profile="smoke", seed=7)
    handle = runner.submit(job)
    status = wait_for(runner, 7)
    result = status.result
    assert status.state == "finished" and result.run_id == 7 and result.status == "ok" and result.val_bpb > 0
    assert result.metrics["seed"] == 7 and result.metrics["profile"] == "smoke"
    assert result.metrics["asset_sha256"] == job.asset_sha256  # what the conductor checks
    assert "val_bpb:" in result.log_tail
    assert last_progress(Path(handle))["progress"] == 1.0
    assert runner.lookup(7).result == result  # asked again: the same answer, from outcome.json


def test_a_crash_is_a_result_with_the_error(tmp_path: Path, smoke_prepared) -> None:
    """A real isolated run (its training and scoring processes import torch): `make test`'s one crash
    of a train.py through the whole path, from the supervisor's process to the runner's result. The
    Actions and Modal runners' crash handling is tested on cheaper runs (tests/bot/runners/test_actions.py,
    tests/runner/test_modal_app.py)."""
    runner = LocalRunner(tmp_path, slots=1)
    runner.submit(Job(run_id=1, asset="raise KeyError('no such knob')\n", profile="smoke", seed=1))
    result = wait_for(runner, 1).result
    assert result.status == "crash" and result.val_bpb is None
    assert "KeyError" in result.error and "no such knob" in result.error


def test_submitting_the_same_run_id_twice_starts_one_process(tmp_path: Path, smoke_prepared) -> None:
    runner = LocalRunner(tmp_path, slots=1)
    job = Job(run_id=4, asset="import time\ntime.sleep(30)\n", profile="smoke", seed=4)
    runner.submit(job)
    pid = (tmp_path / "4" / "pid").read_text()
    LocalRunner(tmp_path, slots=1).submit(job)  # even from a restarted conductor
    assert (tmp_path / "4" / "pid").read_text() == pid
    runner.cancel(4)


def test_cancel_stops_the_job(tmp_path: Path, smoke_prepared) -> None:
    runner = LocalRunner(tmp_path, slots=1)
    runner.submit(Job(run_id=2, asset="import time\ntime.sleep(60)\n", profile="smoke", seed=2))
    pid = int((tmp_path / "2" / "pid").read_text())
    started = wait_for_processes_of(pid)  # the run's training and scoring processes
    runner.cancel(2)  # returns once the supervisor has ended its run and been reaped
    assert not running(pid)
    alive = still_running(started)
    assert not alive, f"still running after cancel: {describe(alive)} (of {describe(list(started))})"
    assert not (tmp_path / "2" / "result.json").exists()
    # a cancelled (or Ctrl-C'd) run is lost to whoever asks later, never train.py's crash
    assert LocalRunner(tmp_path).lookup(2).state == "lost"


@pytest.mark.slow
def test_a_restarted_runner_finds_its_jobs_from_the_files(tmp_path: Path, smoke_prepared) -> None:
    """Slow tier: a real run (three processes that import torch) must still run when the runner restarts."""
    first = LocalRunner(tmp_path, slots=1)
    first.submit(Job(run_id=3, asset="import time\ntime.sleep(3)\nraise SystemExit(3)\n", profile="smoke", seed=3))
    second = LocalRunner(tmp_path, slots=1)  # the conductor restarted: nothing in memory
    assert second.lookup(3).state == "running"
    status = wait_for(second, 3)
    assert status.state == "finished" and status.result.status == "crash"
    first.lookup(3)  # reap our own child

    # a job whose process is gone and that left no result is lost
    (tmp_path / "9").mkdir()
    (tmp_path / "9" / "job.json").write_text('{"run_id": 9, "pid": 999999999}')
    assert LocalRunner(tmp_path).lookup(9).state == "lost"


def _fake_proc(root: Path, pid: int, cmdline: bytes, state: str = "S (sleeping)") -> None:
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    (root / str(pid) / "cmdline").write_bytes(cmdline)
    (root / str(pid) / "status").write_text(f"Name:\tpython\nState:\t{state}\n")


def test_a_run_still_in_its_exec_is_found_once_its_command_line_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between exec's point of no return (Popen has returned) and its new arguments, a process's
    command line reads empty: a restarted runner that looks then must wait for it, not call the run
    lost (seen once in the slow tier on a loaded machine)."""
    _fake_proc(tmp_path, 41, b"")
    waits: list[float] = []

    def exec_finishes(seconds: float) -> None:  # the kernel sets up the new arguments while we wait
        waits.append(seconds)
        (tmp_path / "41" / "cmdline").write_bytes(b"python\0-m\0runner.isolated\0--job\0j\0")

    monkeypatch.setattr(local.time, "sleep", exec_finishes)
    assert local._is_our_child(41, tmp_path) and len(waits) == 1


def test_a_process_that_is_not_a_harness_run_is_not_ours(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_proc(tmp_path, 42, b"bash\0")  # a recycled pid
    _fake_proc(tmp_path, 43, b"python\0-m\0runner.isolated\0", state="Z (zombie)")  # ended, not reaped
    _fake_proc(tmp_path, 44, b"")  # a kernel thread: its command line stays empty
    monkeypatch.setattr(local, "EXEC_WAIT_S", 0.05)
    assert not local._is_our_child(42, tmp_path)
    assert not local._is_our_child(43, tmp_path)
    assert not local._is_our_child(44, tmp_path)
    assert not local._is_our_child(45, tmp_path)  # gone
    assert not local._is_our_child(None, tmp_path)


def test_each_slot_of_a_cuda_profile_gets_its_own_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every child stops itself at interpreter start-up (a sitecustomize on its PYTHONPATH, which the
    # scrubbed environment lets through), so it is alive when its command line is read and its slot
    # stays taken however slow this machine is: a child that failed fast (no GPU here) would
    # otherwise be a zombie, whose /proc cmdline reads empty, or would free its slot too soon.
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")])))
    runner = LocalRunner(tmp_path / "runs", slots=2, gpus=["3", "5"], warm=False)
    seen, pids = [], []
    try:
        for run_id, profile in ((1, "h100"), (2, "h100"), (3, "smoke")):
            runner.submit(Job(run_id=run_id, asset="pass\n", profile=profile, seed=run_id))
            pid = int((tmp_path / "runs" / str(run_id) / "pid").read_text())
            pids.append(pid)
            wait_until_stopped(pid)
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")  # the supervisor's real command
            seen.append(argv[argv.index("--gpu") + 1] if "--gpu" in argv else None)
    finally:  # never leave a stopped child behind, whatever failed above
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
        for run_id in (1, 2, 3):
            runner.cancel(run_id)
    assert seen == ["3", "5", None]  # the supervisor shows the sandbox that device only (tests/runner/test_isolated.py)


def wait_for_path(path: Path, *, exists: bool, timeout: float = 300.0) -> None:
    deadline = time.time() + timeout
    while path.exists() != exists:
        assert time.time() < deadline, f"{path} {'never appeared' if exists else 'was never removed'}"
        time.sleep(0.05)


@pytest.mark.slow
def test_the_next_run_of_a_slot_starts_in_its_warm_worker(tmp_path: Path, smoke_prepared) -> None:
    """Slow tier: two runs, the second in the warm worker the first one's submit started."""
    runner = LocalRunner(tmp_path, slots=1, warm=True)
    try:
        runner.submit(Job(run_id=1, asset=UNTRAINED, profile="smoke", seed=1))
        first = wait_for(runner, 1).result
        assert first.status == "ok" and first.metrics["warm"] is False, first.error
        [worker] = tmp_path.glob(".standby-*")  # started with run 1, for the slot's next run
        wait_for_path(worker / "ready", exists=True)
        runner.submit(Job(run_id=2, asset=UNTRAINED, profile="smoke", seed=2))
        assert not worker.exists() and json.loads((tmp_path / "2" / "job.json").read_text())["warm"] is True
        second = wait_for(runner, 2).result
        assert second.status == "ok" and second.metrics["warm"] is True and second.run_id == 2, second.error
        assert second.val_bpb == pytest.approx(first.val_bpb, rel=0.1)  # the same untrained model, scored alike
    finally:
        runner.close()
    assert not list(tmp_path.glob(".standby-*")), "close leaves no worker behind"


@pytest.mark.slow
def test_a_worker_not_ready_yet_is_sent_away_and_the_run_starts_cold(tmp_path: Path, smoke_prepared) -> None:
    """Slow tier: two runs and a warm worker that must get ready (torch imported) to go away."""
    runner = LocalRunner(tmp_path, slots=1, warm=True)
    sleeper = "import time\ntime.sleep(60)\n"
    try:
        runner.submit(Job(run_id=1, asset=sleeper, profile="smoke", seed=1))
        [worker] = tmp_path.glob(".standby-*")
        runner.submit(Job(run_id=2, asset=sleeper, profile="smoke", seed=2))  # milliseconds later: not ready
        assert json.loads((tmp_path / "2" / "job.json").read_text())["warm"] is False
        wait_for_path(worker, exists=False)  # once ready, it reads the end of its input and removes itself
    finally:
        runner.close()
    assert not list(tmp_path.glob(".standby-*"))


def test_the_directories_of_dead_workers_are_swept(tmp_path: Path) -> None:
    stale = tmp_path / ".standby-0-1-0"
    stale.mkdir()
    (stale / "pid").write_text("999999999")
    LocalRunner(tmp_path)
    assert not stale.exists()


# --- a cancelled run stops: every process of it, however detached ---------------------------------
MARK = "autoresearch-cancel-marker"
ESCAPING = escape(MARK) + "time.sleep(600)\n"


def marked() -> list[int]:
    return hostile_marked(MARK)


def wait_for_log(path: Path, text: str, timeout: float = 120.0) -> None:
    """Wait until the run's log says `text`; fail at once, with the log, if the run ends first."""
    deadline = time.time() + timeout
    while not (path.exists() and text in path.read_text(errors="replace")):
        said = path.read_text(errors="replace")[-3000:] if path.exists() else ""
        assert not (path.parent / "result.json").exists(), f"the run ended before saying {text!r}:\n{said}"
        assert time.time() < deadline, f"{text!r} never appeared in {path}:\n{said}"
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["cancel", "close"])
@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandboxed", "unsandboxed"])
def test_stopping_a_run_ends_every_process_it_started(
    tmp_path: Path, smoke_prepared, monkeypatch: pytest.MonkeyPatch, how: str, sandboxed: bool
) -> None:
    """Slow tier: a real run must be running, its escaped processes with it, to be stopped."""
    from runner import sandbox

    if sandboxed and not sandbox.available()[0]:
        pytest.skip(f"no sandbox here: {sandbox.available()[1]}")
    if not sandboxed:
        monkeypatch.setenv("AUTORESEARCH_SANDBOX", "off")
    runner = LocalRunner(tmp_path, slots=1)
    runner.submit(Job(run_id=3, asset=ESCAPING, profile="smoke", seed=3))
    wait_for_log(tmp_path / "3" / "log.txt", "escaped")
    supervisor = int((tmp_path / "3" / "pid").read_text())
    assert len(marked()) == 3
    runner.cancel(3) if how == "cancel" else runner.close()  # a stop that hangs meets pytest's timeout
    assert not marked() and not Path(f"/proc/{supervisor}").exists(), "a process of the run outlived its cancel"
    assert runner.lookup(3).state == "lost"  # never a crash of its train.py


def test_a_run_whose_supervisor_was_killed_from_outside_is_lost_not_a_crash(tmp_path: Path) -> None:
    # The OOM killer (or an operator) killed the run's supervisor, the worker the slot handed the job
    # to: no result was written, and it is no fault of the train.py. Lost, carrying the crash the
    # conductor charges only if the same run is killed again.
    runner = LocalRunner(tmp_path, slots=1)
    out = tmp_path / "7"
    out.mkdir()
    worker = subprocess.Popen(["sleep", "60"])
    (out / "job.json").write_text(json.dumps({"run_id": 7, "slot": 0, "pid": worker.pid}))
    runner._procs[7], runner._slot_of[7] = worker, 0
    assert runner.lookup(7).state == "running"
    worker.kill()
    worker.wait()
    status = runner.lookup(7)
    assert status.state == "lost" and "killed by SIGKILL from outside" in status.detail
    assert status.result is not None and status.result.status == "crash" and status.result.metrics["outcome"] == "lost"
    assert runner._free_slot() == 0 and LocalRunner(tmp_path).lookup(7).state == "lost"  # a restart reads it so
