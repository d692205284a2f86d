"""The local runner: each job is an isolated run (`python -m runner.isolated`) on this machine.

N slots. On the CPU each slot gets an equal share of the cores as torch threads and sees no GPU;
on a CUDA profile each slot sees only its own GPU (its device node in the sandbox, and
`CUDA_VISIBLE_DEVICES`). Everything about a job lives in its run directory `<runs_dir>/<run_id>/`
(job.json, jobspec.json, pid, log.txt, scratch/progress.jsonl, result.json (a ResultSpec), and
outcome.json once the runner has collected it), so lookup() can answer from the files alone: a
restarted conductor finds the jobs that went on without it, and the results they left behind.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bot.records import Job, RunResult, RunStatus
from bot.runners.protocol import ResultRefused, checked_result, job_spec
from runner import files, launch, sandbox
from runner.isolated import read_regular
from runner.profiles import get_profile, harness_hash
from runner.protocol import JobSpec, ResultSpec

log = logging.getLogger(__name__)
SUPERVISOR_GRACE_S = 60.0  # beyond the training and scoring limits, before the supervisor itself is killed


class LocalRunner:
    def __init__(self, runs_dir: Path, slots: int = 1, data: str | None = None,
                 gpus: list[str] | None = None) -> None:
        if slots < 1:
            raise ValueError("a runner needs at least one slot")
        self.runs_dir = runs_dir
        self.slots = slots
        self.data = data
        self.gpus = gpus or [str(i) for i in range(slots)]  # a CUDA profile's device per slot
        self.threads = max(1, (os.cpu_count() or 1) // slots)
        usable, why = sandbox.available()
        self.sandboxed = usable
        if not usable:
            log.warning("training runs on this machine are NOT sandboxed: %s. train.py (written by the agent) can "
                        "read what this user can read and open connections; results are marked unsandboxed", why)
        self._procs: dict[int, subprocess.Popen] = {}
        self._slot_of: dict[int, int] = {}
        self._notify: Callable[[], None] | None = None

    def on_change(self, callback: Callable[[], None]) -> None:
        self._notify = callback

    # --- the protocol ----------------------------------------------------------------------------
    def submit(self, job: Job) -> str:
        out = self.runs_dir / str(job.run_id)
        if (out / "job.json").exists():
            return str(out)  # submitted before: one run per id
        out.mkdir(parents=True, exist_ok=True)
        profile = get_profile(job.profile)
        slot = self._free_slot()
        spec = job_spec(job)
        files.write_text(out / "jobspec.json", spec.model_dump_json())
        record = {"run_id": job.run_id, "profile": job.profile, "seed": job.seed, "commit": job.commit,
                  "asset_sha256": job.asset_sha256, "slot": slot, "submitted_at": time.time(),
                  "deadline": time.time() + profile.max_total_s + profile.score_limit_s + SUPERVISOR_GRACE_S}
        files.write_text(out / "job.json", json.dumps(record))  # first: a second submit starts nothing
        gpu = self.gpus[slot % len(self.gpus)] if profile.device == "cuda" else None
        proc = launch.start_isolated(out / "jobspec.json", out, data=self.data, threads=self.threads, gpu=gpu)
        files.write_text(out / "job.json", json.dumps(dict(record, pid=proc.pid)))
        self._procs[job.run_id] = proc
        self._slot_of[job.run_id] = slot
        if self._notify is not None:
            threading.Thread(target=self._watch, args=(proc,), daemon=True).start()
        return str(out)

    def lookup(self, run_id: int) -> RunStatus:
        out = self.runs_dir / str(run_id)
        job = _read_json(out / "job.json")
        if job is None:
            return RunStatus("unknown", detail=f"no job {run_id} was submitted to {self.runs_dir}")
        job.setdefault("pid", _read_pid(out))  # launch.start writes it before job.json has it
        outcome = _read_json(out / "outcome.json")
        if outcome is not None:
            return _finished(out, job, outcome)
        proc = self._procs.get(run_id)
        if proc is not None:
            code = proc.poll()
            if code is not None:
                return self._finish(run_id, out, job, code)
        elif _is_our_child(job.get("pid")):
            self._slot_of.setdefault(run_id, job.get("slot", 0))  # a job adopted after a restart
        elif (out / "result.json").exists():
            return self._finish(run_id, out, job, None)
        else:
            return RunStatus("lost", detail="its process ended without a result while no conductor watched it")
        if time.time() > job.get("deadline", float("inf")):
            launch.kill_group(job["pid"])
            if proc is not None:
                proc.wait()
            return self._finish(run_id, out, job, None, timed_out=True)
        return RunStatus("running", progress=last_progress(out))

    def cancel(self, run_id: int) -> None:
        out = self.runs_dir / str(run_id)
        job = _read_json(out / "job.json") or {}
        proc = self._procs.pop(run_id, None)
        pid = job.get("pid") or _read_pid(out) or (proc.pid if proc else None)
        if proc is not None or _is_our_child(pid):
            launch.kill_group(pid)
        if proc is not None:
            proc.wait()
        self._slot_of.pop(run_id, None)  # no outcome is written: a later lookup finds it lost, never a crash

    def shutdown(self) -> None:
        """Stop every job this process started (the end of a demo, Ctrl-C); a restarted conductor
        finds them lost and runs them again."""
        for run_id in list(self._procs):
            self.cancel(run_id)

    # --- internals -------------------------------------------------------------------------------
    def _finish(self, run_id: int, out: Path, job: dict[str, Any], code: int | None, *,
                timed_out: bool = False) -> RunStatus:
        outcome = _read_json(out / "result.json") or _lost_supervisor(out, code, timed_out)
        files.write_text(out / "outcome.json", json.dumps(outcome))  # later lookups read this
        self._procs.pop(run_id, None)
        self._slot_of.pop(run_id, None)
        return _finished(out, job, outcome)

    def _free_slot(self) -> int:
        taken = set(self._slot_of.values())
        return next((s for s in range(self.slots) if s not in taken), len(taken) % self.slots)

    def _watch(self, proc: subprocess.Popen) -> None:
        proc.wait()
        if self._notify is not None:
            self._notify()


def _finished(out: Path, job: dict[str, Any], outcome: dict[str, Any]) -> RunStatus:
    """The supervisor's ResultSpec, checked against the job; or the crash record of a supervisor
    that died before it wrote one."""
    if "version" not in outcome:
        return RunStatus("finished", result=RunResult(run_id=job["run_id"], status="crash", error=outcome["error"],
                                                      log_tail=outcome.get("log_tail", ""), metrics={}))
    try:
        spec = JobSpec.model_validate_json((out / "jobspec.json").read_text())
        return RunStatus("finished", result=checked_result(spec, ResultSpec.model_validate(outcome),
                                                           harness=harness_hash()))
    except (OSError, ValueError, ResultRefused) as error:
        return RunStatus("lost", detail=f"result refused: {error}")


def _lost_supervisor(out: Path, code: int | None, timed_out: bool) -> dict[str, Any]:
    if timed_out:
        why = "the run's supervisor outlived every limit and was killed"
    elif code is not None and code < 0:
        why = f"the run's supervisor was killed by signal {-code} before it wrote a result"
    else:
        why = f"the run's supervisor exited with code {code} without writing a result"
    return {"status": "crash", "error": why, "log_tail": launch.log_tail(out / "supervisor.log")}


def last_progress(out: Path) -> dict[str, Any] | None:
    """The latest progress line of a running job, for display. The file is the sandbox's: read
    without following a link it may have planted there."""
    path = out / "scratch" / "progress.jsonl"
    try:
        size = os.lstat(path).st_size
    except OSError:
        return None
    chunk = read_regular(path, 4096, offset=max(0, size - 4096))
    lines = chunk.decode(errors="replace").strip().splitlines() if chunk else []
    try:
        line = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        return None
    return line if isinstance(line, dict) else None


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _read_pid(out: Path) -> int | None:
    try:
        return int((out / "pid").read_text())
    except (FileNotFoundError, ValueError):
        return None


def _is_our_child(pid: int | None) -> bool:
    """True if `pid` is alive and is a harness process (not a recycled pid)."""
    if not pid:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return b"runner.isolated" in cmdline and "State:\tZ" not in status
