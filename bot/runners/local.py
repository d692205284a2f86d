"""The local runner: each job is a `python -m runner.execute` child process on this machine.

N slots. On the CPU each slot gets an equal share of the cores as torch threads and sees no GPU;
on a CUDA profile each slot sees only its own GPU (`CUDA_VISIBLE_DEVICES`). Everything about a
job lives in its run directory `<runs_dir>/<run_id>/` (job.json, train.py, pid, log.txt,
progress.jsonl, result.json, and outcome.json once the runner has collected it), so lookup() can
answer from the files alone: a restarted conductor finds the jobs that went on without it, and
the results they left behind.
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
from runner import files, launch
from runner.profiles import get_profile

log = logging.getLogger(__name__)


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
        asset = out / "train.py"
        asset.write_text(job.asset, encoding="utf-8")
        record = {"run_id": job.run_id, "profile": job.profile, "seed": job.seed, "commit": job.commit,
                  "asset_sha256": job.asset_sha256, "slot": slot, "submitted_at": time.time(),
                  "deadline": time.time() + profile.max_total_s}
        files.write_text(out / "job.json", json.dumps(record))  # first: a second submit starts nothing
        visible = self.gpus[slot % len(self.gpus)] if profile.device == "cuda" else ""
        proc = launch.start(asset, job.profile, out, seed=job.seed, data=self.data, threads=self.threads,
                            extra_env={"CUDA_VISIBLE_DEVICES": visible})
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
            return RunStatus("finished", result=_result(job, outcome))
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
        outcome = launch.collect(out, code, timed_out=timed_out)
        files.write_text(out / "outcome.json", json.dumps(outcome))  # later lookups read this
        self._procs.pop(run_id, None)
        self._slot_of.pop(run_id, None)
        return RunStatus("finished", result=_result(job, outcome))

    def _free_slot(self) -> int:
        taken = set(self._slot_of.values())
        return next((s for s in range(self.slots) if s not in taken), len(taken) % self.slots)

    def _watch(self, proc: subprocess.Popen) -> None:
        proc.wait()
        if self._notify is not None:
            self._notify()


def _result(job: dict[str, Any], outcome: dict[str, Any]) -> RunResult:
    status = "ok" if outcome.get("status") == "ok" else "crash"
    metrics = {k: v for k, v in outcome.items() if k not in ("status", "error", "log_tail")}
    return RunResult(run_id=job["run_id"], status=status,
                     val_bpb=outcome.get("val_bpb") if status == "ok" else None,
                     metrics=metrics, log_tail=outcome.get("log_tail", ""), error=outcome.get("error"))


def last_progress(out: Path) -> dict[str, Any] | None:
    try:
        with open(out / "progress.jsonl", "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 4096))
            lines = handle.read().decode(errors="replace").strip().splitlines()
        return json.loads(lines[-1]) if lines else None
    except (FileNotFoundError, json.JSONDecodeError):
        return None


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
    return b"runner.execute" in cmdline and "State:\tZ" not in status
