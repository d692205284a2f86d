"""The local runner: each job is an isolated run (`python -m runner.isolated`) on this machine.

N slots. On the CPU each slot gets an equal share of the cores as torch threads and sees no GPU;
on a CUDA profile each slot sees only its own GPU (its device node in the sandbox, and
`CUDA_VISIBLE_DEVICES`). An operator may take slots away while the bot runs and give them back
(`slots_file`, bot.runners.capacity), up to the N it started with: a slot taken away finishes its
run, takes no new one, and its warm worker is sent away. Everything about a job lives in its run directory `<runs_dir>/<run_id>/`
(job.json, jobspec.json, pid, log.txt, scratch/progress.jsonl, result.json (a ResultSpec), and
outcome.json once the runner has collected it), so lookup() can answer from the files alone: a
restarted conductor finds the jobs that went on without it, and the results they left behind.

Warm workers (`warm=True`; the service and the demo turn them on): once a slot has started a
training job, a worker for its next job is started at once (`runner.isolated --standby`, in
`<runs_dir>/.standby-<slot>-<pid>-<n>/`): its training and scoring processes import torch and load
the data while the slot's current run trains. The next job of
that slot and profile renames the worker's directory to its run directory and hands it the job on
its stdin, so its start-up imports nothing. A worker serves one job and ends, like a cold one: a
train.py cannot leave anything in it for the next. It costs about a run's memory per slot while
it waits; it goes away when its pipe closes (close(), or this process killed).

Each run may hold a share of the machine (runner.limits: memory, tasks, scratch), by default half
its memory divided among the slots; AUTORESEARCH_RUN_MEMORY, _TASKS, _SCRATCH set it. Cancel,
the deadline and close() end a run's whole process tree, whatever train.py forked or detached:
the supervisor, told with SIGTERM, kills every process below it (it is their subreaper), and one
that has not ended after launch.STOP_GRACE_S is killed with its tree from here. A run whose
training process, or whose supervisor, was killed from outside (an operator, the OOM killer) is
`lost`, and runs again (the conductor charges it the second time in a row).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bot.core.records import Job, RunResult, RunStatus
from bot.runners.capacity import Slots
from bot.runners.specs import ResultRefused, checked_result, finished_status, job_spec
from runner import files, launch, limits, run_log, sandbox
from runner.profiles import get_profile, harness_hash
from runner.progress import last_progress
from runner.protocol import JobSpec, ResultSpec
from runner.tasks import DEFAULT_TASK

log = logging.getLogger(__name__)
SUPERVISOR_GRACE_S = 60.0  # beyond the training and scoring limits, before the supervisor itself is killed
STANDBY_PREFIX = ".standby-"


@dataclass
class Standby:
    """A warm worker waiting for its slot's next job."""

    proc: subprocess.Popen
    out: Path
    profile: str
    gpu: str | None

    def ready(self) -> bool:
        return self.proc.poll() is None and (self.out / "ready").exists()

    def send_away(self) -> None:
        """Close its pipe: it stops its processes and removes its directory (once it is ready)."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass


class LocalRunner:
    def __init__(
        self,
        runs_dir: Path,
        slots: int = 1,
        data: str | None = None,
        gpus: list[str] | None = None,
        warm: bool = False,
        slots_file: Path | None = None,
    ) -> None:
        # each slot's threads and memory share are fixed here: an operator may lend slots away and
        # back (slots_file), never more than these
        self._slots = Slots(slots_file, slots, cap=slots)
        self.runs_dir = runs_dir
        self.data = data
        self.gpus = gpus or [str(i) for i in range(slots)]  # a CUDA profile's device per slot
        self.threads = max(1, (os.cpu_count() or 1) // slots)
        self.limits = limits.from_env(slots=slots)  # what each run may hold
        usable, why = sandbox.available()
        self.sandboxed = usable
        if not usable:
            log.warning(
                "runs on this machine are NOT sandboxed: %s. The code the agent writes can read what this user "
                "can read and open connections; results are marked unsandboxed",
                why,
            )
        self._procs: dict[int, subprocess.Popen] = {}
        self._slot_of: dict[int, int] = {}
        self._notify: Callable[[], None] | None = None
        self.warm = warm
        self._standby: dict[int, Standby] = {}
        self._standby_names = itertools.count()
        _sweep_standby_dirs(runs_dir)

    @property
    def slots(self) -> int:
        """The slots this runner may fill now (bot.runners.capacity): a slot removed finishes its
        run and takes no new one. Its warm worker is sent away here, on purpose: the conductor reads
        the count at every tick (on its own thread, the only reader), so a slot lent away while the
        loop is paused or blocked frees its memory and its GPU at once, not at the next run."""
        count = self._slots()
        for slot in [s for s in self._standby if s >= count]:
            self._standby.pop(slot).send_away()
        return count

    # --- the protocol ----------------------------------------------------------------------------
    def check_ready(self, identity: dict[str, str]) -> None:
        """Nothing to ask: the app prepares this machine's data before it makes the runner, and the
        identity is this machine's own."""

    def on_change(self, callback: Callable[[], None]) -> None:
        self._notify = callback

    def notify(self) -> None:
        """Nothing to forget: a process that ends tells on_change's callback itself."""

    def submit(self, job: Job) -> str:
        out = self.runs_dir / str(job.run_id)
        if (out / "job.json").exists():
            return str(out)  # submitted before: one run per id
        profile = get_profile(job.profile)
        slot = self._free_slot()
        gpu = self.gpus[slot % len(self.gpus)] if profile.device == "cuda" else None
        training = job.task == DEFAULT_TASK  # warm workers prepare training; another task's run starts as it comes
        worker = self._take_standby(slot, job.profile, gpu) if training else None
        if worker is not None:
            if out.exists():  # a submit that died before it wrote job.json left this
                shutil.rmtree(out)
            os.rename(worker.out, out)  # its processes see the directory they were started in, under its new name
        out.mkdir(parents=True, exist_ok=True)
        spec = job_spec(job)
        files.write_text(out / "jobspec.json", spec.model_dump_json())
        record = {
            "run_id": job.run_id,
            "profile": job.profile,
            "seed": job.seed,
            "commit": job.commit,
            "asset_sha256": job.asset_sha256,
            "slot": slot,
            "submitted_at": time.time(),
            "warm": worker is not None,
            "deadline": time.time() + profile.max_total_s + profile.score_limit_s + SUPERVISOR_GRACE_S,
        }
        if worker is not None:
            proc = worker.proc
            files.write_text(
                out / "job.json", json.dumps(dict(record, pid=proc.pid))
            )  # first: a second submit starts nothing
            _hand_over(worker, out)
        else:
            files.write_text(out / "job.json", json.dumps(record))  # first: a second submit starts nothing
            proc = launch.start_isolated(
                out / "jobspec.json", out, data=self.data, threads=self.threads, gpu=gpu, limits=self.limits
            )
            files.write_text(out / "job.json", json.dumps(dict(record, pid=proc.pid)))
        self._procs[job.run_id] = proc
        self._slot_of[job.run_id] = slot
        if self._notify is not None:
            threading.Thread(target=self._watch, args=(proc,), daemon=True).start()
        if self.warm and training:
            self._start_standby(slot, job.profile, gpu)
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
            launch.stop_supervisors([job["pid"]])
            if proc is not None:
                proc.wait()
            return self._finish(run_id, out, job, None, timed_out=True)
        return RunStatus("running", progress=last_progress(out))

    def cancel(self, run_id: int) -> None:
        """Stop the run and every process it started (see the module docstring)."""
        self._stop([run_id])

    def close(self) -> None:
        """Stop every job this process started (the end of a demo or of the service, Ctrl-C), all
        at once, and its warm workers; a restarted conductor finds the jobs lost and runs them again."""
        self._stop(list(self._procs))
        workers, self._standby = list(self._standby.values()), {}
        for worker in workers:
            worker.send_away()
        for worker in workers:
            try:
                worker.proc.wait(timeout=10)  # a ready worker removes its directory itself
            except subprocess.TimeoutExpired:
                launch.stop_supervisors([worker.proc.pid])
                worker.proc.wait()
            shutil.rmtree(worker.out, ignore_errors=True)

    # --- internals -------------------------------------------------------------------------------
    def _stop(self, run_ids: list[int]) -> None:
        procs: list[subprocess.Popen] = []
        pids: list[int] = []
        for run_id in run_ids:
            out = self.runs_dir / str(run_id)
            job = _read_json(out / "job.json") or {}
            proc = self._procs.pop(run_id, None)
            pid = job.get("pid") or _read_pid(out) or (proc.pid if proc else None)
            if pid and (proc is not None or _is_our_child(pid)):  # a pid of a run adopted after a restart may be reused
                pids.append(pid)
            if proc is not None:
                procs.append(proc)
            self._slot_of.pop(run_id, None)  # no outcome is written: a later lookup finds it lost, never a crash
        if pids:
            took = launch.stop_supervisors(pids)
            log.info("stopped %d run(s) with every process they started in %.1f s", len(pids), took)
        for proc in procs:
            proc.wait()

    def _finish(
        self, run_id: int, out: Path, job: dict[str, Any], code: int | None, *, timed_out: bool = False
    ) -> RunStatus:
        outcome = _read_json(out / "result.json") or _lost_supervisor(out, code, timed_out)
        files.write_text(out / "outcome.json", json.dumps(outcome))  # later lookups read this
        self._procs.pop(run_id, None)
        self._slot_of.pop(run_id, None)
        return _finished(out, job, outcome)

    def _take_standby(self, slot: int, profile: str, gpu: str | None) -> Standby | None:
        """The slot's warm worker, if it is ready for this job; any other is sent away."""
        worker = self._standby.pop(slot, None)
        if worker is None:
            return None
        if worker.ready() and worker.profile == profile and worker.gpu == gpu:
            return worker
        log.info(
            "slot %d: its warm worker is %s; this run starts cold",
            slot,
            "not ready yet" if worker.proc.poll() is None else f"gone (exit code {worker.proc.returncode})",
        )
        worker.send_away()
        return None

    def _start_standby(self, slot: int, profile: str, gpu: str | None) -> None:
        out = self.runs_dir / f"{STANDBY_PREFIX}{slot}-{os.getpid()}-{next(self._standby_names)}"
        try:
            proc = launch.start_standby(profile, out, data=self.data, threads=self.threads, gpu=gpu, limits=self.limits)
        except OSError as error:  # no worker: the next run starts cold, which works as well
            log.warning("slot %d: could not start a warm worker (%s); its next run starts cold", slot, error)
            return
        self._standby[slot] = Standby(proc, out, profile, gpu)

    def _free_slot(self) -> int:
        taken = set(self._slot_of.values())
        count = self.slots
        return next((s for s in range(count) if s not in taken), len(taken) % count)

    def _watch(self, proc: subprocess.Popen) -> None:
        proc.wait()
        if self._notify is not None:
            self._notify()


def _hand_over(worker: Standby, out: Path) -> None:
    """Give a warm worker its job: the job file and its directory's new name, on its stdin."""
    order = json.dumps({"job": str(out / "jobspec.json"), "out": str(out)}) + "\n"
    try:
        assert worker.proc.stdin is not None
        worker.proc.stdin.write(order.encode())
        worker.proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass  # it died just now: lookup() finds its supervisor ended without a result, a crash


def _sweep_standby_dirs(runs_dir: Path) -> None:
    """Remove the directories of warm workers that are gone (their runner was killed, then they)."""
    if not runs_dir.is_dir():
        return
    for path in runs_dir.glob(f"{STANDBY_PREFIX}*"):
        if not _is_our_child(_read_pid(path)):
            shutil.rmtree(path, ignore_errors=True)


def _finished(out: Path, job: dict[str, Any], outcome: dict[str, Any]) -> RunStatus:
    """The supervisor's ResultSpec, checked against the job; or the crash record of a supervisor
    that died before it wrote one."""
    if "version" not in outcome:
        crash = RunResult(
            run_id=job["run_id"],
            status="crash",
            error=outcome["error"],
            log_tail=outcome.get("log_tail", ""),
            metrics={"outcome": outcome.get("outcome", "crash")},
        )
        return (
            RunStatus("lost", detail=outcome["error"], result=crash)
            if outcome.get("outcome") == "lost"
            else RunStatus("finished", result=crash)
        )
    try:
        spec = JobSpec.model_validate_json((out / "jobspec.json").read_text())
        return finished_status(
            checked_result(spec, ResultSpec.model_validate(outcome), harness=harness_hash(spec.task))
        )
    except (OSError, ValueError, ResultRefused) as error:
        return RunStatus("lost", detail=f"result refused: {error}")


def _lost_supervisor(out: Path, code: int | None, timed_out: bool) -> dict[str, Any]:
    """The record of a supervisor that wrote no result. Killed by a signal this runner did not
    send (an operator, the OOM killer; cancel writes no record), its run is lost, not a crash."""
    outcome = "crash"
    if timed_out:
        why = "the run's supervisor outlived every limit and was killed"
    elif code is not None and code < 0:
        why = (
            f"the run's supervisor was killed by {signal.Signals(-code).name} from outside before it wrote a "
            "result: the run is lost and runs again"
        )
        outcome = "lost"
    else:
        why = f"the run's supervisor exited with code {code} without writing a result"
    return {"status": "crash", "outcome": outcome, "error": why, "log_tail": run_log.tail(out / "supervisor.log")}


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


EXEC_WAIT_S = 1.0  # how long a live process whose command line reads empty is given to finish its exec


def _is_our_child(pid: int | None, proc: Path = Path("/proc")) -> bool:
    """True if `pid` is alive and is a harness process (not a recycled pid).

    A process just started can read as having an empty command line: its exec has passed the point
    where the starter's Popen returns (close-on-exec descriptors closed) but has not yet set up its
    new arguments. On a loaded machine that window is long enough for a restarted runner to look, so
    an empty command line is read again for up to EXEC_WAIT_S (a kernel thread, which has none, is
    then not ours)."""
    if not pid:
        return False
    deadline = time.monotonic() + EXEC_WAIT_S
    while True:
        try:
            cmdline = (proc / str(pid) / "cmdline").read_bytes()
            status = (proc / str(pid) / "status").read_text()
        except OSError:
            return False
        if "State:\tZ" in status:
            return False
        if cmdline or time.monotonic() >= deadline:
            return b"runner.isolated" in cmdline
        time.sleep(0.01)
