"""Warm workers: a supervisor prepared before its job (runner.isolated's `prepare` then `run`, and
`--standby` on the command line). Its processes get ready before the job comes, the job then runs
exactly as a cold one, and a worker that is not needed, or breaks while it waits, leaves nothing.

Jobs hand over an untrained model at once (the Tiny model of test_isolated), so a run costs the
imports, the export and the scoring: seconds, and no verdict depends on training noise.

`make test` runs a worker's job in its renamed directory unsandboxed, the way whose processes see
the rename (sandboxed, the same run is tests/runner/test_isolated.py's honest run after the
attacks); the rest is the slow tier, each test a worker of its own (two processes that import
torch) for one more way a worker is used.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner import sandbox
from runner.isolated import Supervisor
from runner.protocol import JobSpec, ResultSpec
from tests.runner.test_isolated import HEADER, HONEST_FLOOR

ROOT = Path(__file__).resolve().parents[2]
READY_S = 300.0  # a generous bound for importing torch on a busy machine; never reached when all is well


@pytest.fixture(params=[pytest.param("sandboxed", marks=pytest.mark.slow), "unsandboxed"], autouse=True)
def sandboxing(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Every test runs both ways: in bubblewrap (skipped where there is none) and without it
    (AUTORESEARCH_SANDBOX=off, which the workers started on the command line inherit). Without a
    sandbox the processes see their directory's rename: the path that broke before. Sandboxed is
    the slow tier: a run of its own, where `make test` has the same path in test_isolated.py's
    honest run (a warm worker renamed to its run's directory, in bubblewrap)."""
    if request.param == "sandboxed":
        usable, why = sandbox.available()
        if not usable:
            pytest.skip(f"no sandbox here: {why}")
        return True
    monkeypatch.setenv(sandbox.OFF_SWITCH, "off")
    return False


def job(body: str = "h.finish(model)\n", *, run_id: int = 1, profile: str = "smoke") -> JobSpec:
    return JobSpec(run_id=run_id, asset=HEADER + body, profile=profile, seed=3)


def prepared(tmp_path: Path, name: str = "worker") -> Supervisor:
    worker = Supervisor(tmp_path / name, "smoke", threads=1)
    worker.prepare()
    assert worker.wait_ready(READY_S), "the worker's processes never said they were ready"
    return worker


def alive(pid: int) -> bool:
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def wait_for_file(path: Path, proc: subprocess.Popen, timeout: float = READY_S) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        assert proc.poll() is None, f"the worker ended first: {proc.returncode}"
        assert time.time() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_a_worker_prepared_before_its_job_runs_it_in_its_renamed_directory(
    smoke_prepared, tmp_path: Path, sandboxing: bool
) -> None:
    worker = prepared(tmp_path)
    pids = [worker.trainer.pid, worker.scorer.proc.pid]
    run_dir = tmp_path / "runs-7"
    os.rename(tmp_path / "worker", run_dir)  # what the local runner does when the job comes
    result = worker.run(job(), out=run_dir)
    assert result.status == "ok" and result.sandboxed is sandboxing and result.val_bpb > HONEST_FLOOR, result.error
    assert result.runner.sandbox.startswith("bubblewrap") if sandboxing else result.runner.sandbox == "none"
    warned = "WARNING: running train.py WITHOUT a sandbox" in (run_dir / "log.txt").read_text()
    assert warned is not sandboxing  # unsandboxed: marked, and said loudly
    assert result.metrics["warm"] is True
    assert result.metrics["ready_cpu_seconds"] > 0  # importing torch took CPU time, and it is not the run's
    assert result.seed == 3 and result.hashes.data == smoke_prepared.dataset.fingerprint
    assert ResultSpec.model_validate_json((run_dir / "result.json").read_text()) == result
    assert "[harness] ready" not in (run_dir / "log.txt").read_text()  # the supervisor's signal, not train.py's output
    assert (run_dir / "asset" / "train.py").read_text() == job().asset
    assert not list(run_dir.rglob("model.pt2"))
    assert not any(alive(pid) for pid in pids)


@pytest.mark.slow
def test_a_cold_run_is_not_warm(smoke_prepared, tmp_path: Path) -> None:
    """Slow tier: a cold run of its own, both ways, to read one flag of it."""
    from runner.isolated import run_job

    result = run_job(job(), tmp_path / "cold", threads=1)
    assert result.status == "ok", result.error
    assert result.metrics["warm"] is False  # its training process had not imported torch when the job came


@pytest.mark.slow
def test_each_job_gets_a_fresh_process_so_nothing_carries_over(smoke_prepared, tmp_path: Path) -> None:
    """Slow tier: two workers, each with a run, both ways."""
    # The first job changes torch in its process and leaves a file in its temporary directory (the
    # sandbox's /tmp; unsandboxed, its run directory's); the next job, in the next worker, finds neither.
    first = prepared(tmp_path, "a").run(
        job(
            "import os, tempfile\ntorch.autoresearch_marker = 1\n"
            "open(os.path.join(tempfile.gettempdir(), 'left-behind'), 'w').write('x')\nh.finish(model)\n"
        )
    )
    assert first.status == "ok", first.error
    second = prepared(tmp_path, "b").run(
        job(
            "import os, tempfile\nassert not hasattr(torch, 'autoresearch_marker'), 'torch was patched'\n"
            "assert not os.path.exists(os.path.join(tempfile.gettempdir(), 'left-behind')), 'a file carried over'\n"
            "h.finish(model)\n",
            run_id=2,
        )
    )
    assert second.status == "ok", second.error


@pytest.mark.slow
def test_a_worker_whose_training_process_died_while_waiting_starts_a_new_one(smoke_prepared, tmp_path: Path) -> None:
    """Slow tier: a worker, then a training process started afresh and its run, both ways."""
    worker = prepared(tmp_path)
    os.killpg(worker.trainer.pid, 9)
    worker.trainer.wait()
    result = worker.run(job())
    assert result.status == "ok", result.error
    assert "starting a new one" in (tmp_path / "worker" / "log.txt").read_text()


@pytest.mark.slow
def test_a_worker_refuses_a_job_of_another_profile(smoke_prepared, tmp_path: Path) -> None:
    """Slow tier: a worker of its own (two processes that import torch), both ways."""
    worker = prepared(tmp_path)
    pids = [worker.trainer.pid, worker.scorer.proc.pid]
    result = worker.run(job(profile="cpu"))
    assert result.status == "crash" and "prepared for the smoke profile" in result.error
    assert not any(alive(pid) for pid in pids)


@pytest.mark.slow
def test_a_worker_moved_elsewhere_is_refused(smoke_prepared, tmp_path: Path) -> None:
    """Slow tier: a worker of its own (two processes that import torch), both ways."""
    worker = prepared(tmp_path)
    (tmp_path / "other").mkdir()
    with pytest.raises(RuntimeError, match="renamed"):
        worker.run(job(), out=tmp_path / "other")


# --- the command line: python -m runner.isolated --standby ---------------------------------------


def standby(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / ".standby-0"
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner.isolated", "--standby", "smoke", "--out", str(out), "--threads", "1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    wait_for_file(out / "ready", proc)
    return proc, out


@pytest.mark.slow
def test_a_standby_worker_runs_the_job_it_is_handed(smoke_prepared, tmp_path: Path) -> None:
    """Slow tier: a worker started on the command line and its run, both ways."""
    proc, out = standby(tmp_path)
    run_dir = tmp_path / "9"
    os.rename(out, run_dir)
    (run_dir / "jobspec.json").write_text(job(run_id=9).model_dump_json())
    order = json.dumps({"job": str(run_dir / "jobspec.json"), "out": str(run_dir)}) + "\n"
    output, _ = proc.communicate(order.encode(), timeout=READY_S)
    assert proc.returncode == 0, output.decode()
    result = ResultSpec.model_validate_json((run_dir / "result.json").read_text())
    assert result.run_id == 9 and result.status == "ok" and result.metrics["warm"] is True, result.error
    assert not (run_dir / "ready").exists()


@pytest.mark.slow
def test_a_standby_worker_not_needed_leaves_nothing(smoke_prepared, tmp_path: Path) -> None:
    """Slow tier: a worker started on the command line, both ways, to see it leave nothing."""
    proc, out = standby(tmp_path)
    inside = [int(pid) for pid in os.listdir("/proc") if pid.isdigit() and _started_by(int(pid), proc.pid)]
    proc.stdin.close()  # what happens when its runner shuts down, or is killed
    assert proc.wait(timeout=60) == 0
    assert not out.exists()
    assert inside and not any(alive(pid) for pid in inside)


@pytest.mark.slow
def test_a_standby_worker_handed_an_unreadable_job_says_so_and_stops(smoke_prepared, tmp_path: Path) -> None:
    """Slow tier: a worker started on the command line, both ways, for one refusal."""
    proc, _ = standby(tmp_path)
    output, _ = proc.communicate(b'{"job": "/nonexistent/jobspec.json", "out": "/nonexistent"}\n', timeout=60)
    assert proc.returncode == 2 and b"got no job it can read" in output


def _started_by(pid: int, parent: int) -> bool:
    try:
        ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return False
    return ppid == parent
