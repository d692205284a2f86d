"""The local runner: each job is a `python -m runner.execute` child process on this machine.

N slots; on the CPU each slot gets an equal share of the cores as torch threads. Run directories
(`<runs_dir>/<run_id>/`) hold train.py, log.txt, progress.jsonl and result.json, so a restarted
conductor can pick up a job that went on without it, or collect the result it left behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bot.records import Job, RunResult
from runner import launch
from runner.profiles import get_profile


@dataclass
class _Active:
    run_id: int
    out: Path
    deadline: float
    proc: subprocess.Popen | None = None  # None: a job adopted after a restart (only its pid is known)
    pid: int | None = None


class LocalRunner:
    def __init__(self, runs_dir: Path, slots: int = 1, data: str | None = None) -> None:
        if slots < 1:
            raise ValueError("a runner needs at least one slot")
        self.runs_dir = runs_dir
        self.slots = slots
        self.data = data
        self.threads = max(1, (os.cpu_count() or 1) // slots)
        self._active: dict[int, _Active] = {}
        self._finished: list[RunResult] = []

    def free_slots(self) -> int:
        return self.slots - len(self._active)

    def handle(self, run_id: int) -> str:
        return str(self.runs_dir / str(run_id))

    def start(self, job: Job) -> str:
        out = Path(self.handle(job.run_id))
        out.mkdir(parents=True, exist_ok=True)
        asset = out / "train.py"
        asset.write_text(job.asset, encoding="utf-8")
        proc = launch.start(asset, job.profile, out, seed=job.seed, data=self.data, threads=self.threads)
        limit = get_profile(job.profile).max_total_s
        self._active[job.run_id] = _Active(job.run_id, out, time.time() + limit, proc=proc, pid=proc.pid)
        return str(out)

    def reattach(self, run_id: int, handle: str) -> bool:
        out = Path(handle)
        if (out / "result.json").exists():
            self._finished.append(self._result(run_id, out, returncode=None))
            return True
        pid = _read_pid(out)
        if pid is not None and _is_our_child(pid):
            self._active[run_id] = _Active(run_id, out, time.time() + 3600, pid=pid)
            return True
        return False

    def poll(self) -> list[RunResult]:
        for run_id, active in list(self._active.items()):
            finished, returncode, timed_out = self._check(active)
            if finished:
                del self._active[run_id]
                self._finished.append(self._result(run_id, active.out, returncode, timed_out=timed_out))
        finished_results, self._finished = self._finished, []
        return finished_results

    def progress(self, run_id: int) -> dict[str, Any] | None:
        active = self._active.get(run_id)
        if active is None:
            return None
        return last_progress(active.out)

    def cancel(self, run_id: int) -> None:
        active = self._active.pop(run_id, None)
        if active and active.pid:
            launch.kill_group(active.pid)
            if active.proc:
                active.proc.wait()

    def shutdown(self) -> None:
        for run_id in list(self._active):
            self.cancel(run_id)

    def _check(self, active: _Active) -> tuple[bool, int | None, bool]:
        """(finished, exit code if known, timed out)."""
        if active.proc is not None:
            code = active.proc.poll()
            if code is not None:
                return True, code, False
        elif not (active.pid is not None and _is_our_child(active.pid)):
            return True, None, False  # adopted after a restart and now gone: its files tell the rest
        if time.time() > active.deadline:
            if active.pid:
                launch.kill_group(active.pid)
            if active.proc:
                active.proc.wait()
            return True, None, True
        return False, None, False

    def _result(self, run_id: int, out: Path, returncode: int | None, timed_out: bool = False) -> RunResult:
        data = launch.collect(out, returncode, timed_out=timed_out)
        status = "ok" if data.get("status") == "ok" else "crash"
        metrics = {k: v for k, v in data.items() if k not in ("status", "error", "log_tail")}
        return RunResult(run_id=run_id, status=status, val_bpb=data.get("val_bpb") if status == "ok" else None,
                         metrics=metrics, log_tail=data.get("log_tail", ""), error=data.get("error"))


def last_progress(out: Path) -> dict[str, Any] | None:
    try:
        with open(out / "progress.jsonl", "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 4096))
            lines = handle.read().decode(errors="replace").strip().splitlines()
        return json.loads(lines[-1]) if lines else None
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _read_pid(out: Path) -> int | None:
    try:
        return int((out / "pid").read_text())
    except (FileNotFoundError, ValueError):
        return None


def _is_our_child(pid: int) -> bool:
    """True if `pid` is alive and is a harness process (not a recycled pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return b"runner.execute" in cmdline and "State:\tZ" not in status
