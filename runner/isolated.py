"""The isolated run: the one path every runner takes to turn a JobSpec into a ResultSpec.

This docstring is training's path. A job of another task (JobSpec.task, runner.tasks) goes to its
task's evaluator instead (runner.tasks.run), from run_job and from a warm worker alike.

`run_job` (or `python -m runner.isolated --job JOB.json --out DIR`) is the supervisor. It never
runs train.py's code itself. In order:
1. checks the prepared data against its fingerprint;
2. starts the training process (runner.execute --export) in a sandbox (runner.sandbox) that sees
   the training split, the tokenizer, train.py, on a CUDA profile Flash Attention 3 as prepare
   fetched it (runner.kernels, read-only, offline), and a private scratch directory DIR/scratch, and
   nothing else: not the validation split, not DIR/result.json, not a credential. Its output goes
   to DIR/log.txt, capped; its progress lines (DIR/scratch/progress.jsonl) are for display only;
3. measures that process from outside, from the hand-over of its job to its end: wall time, and
   CPU time of the whole process tree from the kernel (/proc while it runs, wait4 at the end).
   That is the budget's only clock: on the profile's (wall, or tree CPU / allotted threads),
   everything counts, start-up, compilation, warm-up steps, training, the export. The moment it
   reaches the cap, budget + allowance (runner.profiles), the process is stopped and the run is
   `rejected`: its train.py trained past the budget, whatever its harness was told (the harness
   in the process reads the same clock and ends an honest run's training in time). Past the
   profile's hard limit on wall time (a process that sleeps costs no CPU) it is killed (`timeout`);
4. scores the exported model (a copy of DIR/scratch/model.pt2 in DIR/handoff/) in a second
   sandboxed process that never ran train.py (runner.score): causality probe, then val_bpb on the
   validation split. That process is started with the training one and gets ready meanwhile
   (torch, the validation split, the tokenizer), so its start-up costs the run nothing;
5. writes DIR/result.json, which no process of the run can reach.
Steps 1-2 need no job: `Supervisor.prepare()` does them, and both processes then import torch and
load their data, the training one waiting for its job's line (runner.execute --wait). `run(job)`
writes train.py to DIR/asset/ and hands the job over once the training process is ready; the
clocks start there, and CPU time the training process spent before it (its imports, cold or
warm) is not counted. run_job does both at once (a cold run); a supervisor prepared
ahead of its job (`--standby`, kept by the local runner and the Modal app) is a warm worker, and
its run's start-up imports nothing. Either way a worker serves one job, in processes that ran no
other train.py.
What train.py says about itself (steps, tokens, memory, in scratch/claims.json) is kept as
information; only the scorer's val_bpb and the supervisor's clocks decide anything.

The supervisor's parts: runner.sandbox (the boxes), runner.limits (what a run may hold),
runner.processes (the run's processes, and how they end), runner.run_log (DIR/log.txt) and
runner.score_process (the scoring process's lifetime). It imports no torch (its two processes do):
it only moves the exported model's file, and every run and warm worker would pay for the import.

Without a usable bubblewrap the run goes on unsandboxed, with a loud warning in the log and
`sandboxed: false` in the result: train.py can then read what the user running it can read.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from runner import files, kernels, limits, processes, proctree, run_log, sandbox
from runner.data import DataMissing, cache_dir, load_dataset, verify_dataset
from runner.files import MODEL_FILE
from runner.proctree import TreeCPU
from runner.profiles import Profile, get_profile, harness_hash
from runner.protocol import Hashes, JobSpec, ResultSpec, RunnerIdentity, Timings
from runner.score_process import ScoreProcess
from runner.tasks import DEFAULT_TASK
from runner.tasks.run import run_task_job
from runner.tokenizer import is_cached, tokenizer_dir

MODEL_LIMIT_BYTES = 8 << 30  # the exported model handed to the scorer
FILE_LIMIT_BYTES = limits.FILE_BYTES  # no single file written by a sandboxed process may be larger
LIMITS_EVERY_S = 1.0  # how often the supervisor looks at the run's memory, tasks and scratch directory
CLAIMED_SCORE = b"val_bpb:"  # a line train.py prints this way is shown as its claim, not the score
READY_LINE = b"[harness] ready"  # what the training process prints once it waits for its job (runner.execute)
STANDBY_READY_S = 600.0  # how long a warm worker waits for its processes to say they are ready
CLAIMED_KEYS = (
    "num_steps",
    "total_tokens_M",
    "tokens_per_second",
    "tokens_per_wall_second",
    "peak_vram_mb",
    "mfu_percent",
    "num_params_M",
    "startup_seconds",
    "training_seconds",
    "training_wall_seconds",
    "extra",
)


class Supervisor:
    """One isolated run in directory `out`. See the module docstring.

    `prepare()` does everything that does not depend on the job, `run(job)` the rest; run_job does
    both at once. A supervisor prepared ahead of its job is a warm worker (`--standby`)."""

    def __init__(
        self,
        out: Path,
        profile: str,
        *,
        backend: str = "local",
        data: str | None = None,
        threads: int = 0,
        gpu: str | None = None,
        detail: str = "",
        use_sandbox: bool | None = None,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
        on_line: Callable[[str], None] | None = None,
    ) -> None:
        self.out, self.profile_name, self.data, self.gpu = out, profile, data, gpu
        self.threads = threads
        self.on_progress, self.on_line = on_progress, on_line
        self.scratch, self.handoff = out / "scratch", out / "handoff"
        self.timings = Timings()
        self.hashes = Hashes(asset="", harness=harness_hash(), data="")
        ok, what = sandbox.available() if use_sandbox is not False else (False, "turned off")
        self.sandboxed = ok
        self.identity = RunnerIdentity(
            backend=backend, host=socket.gethostname(), device="cpu", sandbox=what if ok else "none", detail=detail
        )
        self.why_unsandboxed = "" if ok else what
        self.profile: Profile | None = None
        self.failure = ""  # why this run cannot happen, found while preparing it
        self.prepared_at: float | None = None
        self.trainer: subprocess.Popen[bytes] | None = None
        self.scorer = ScoreProcess(self._spawn_scorer)
        self.log = run_log.RunLog()
        self._data_views: tuple[list[Path], list[Path]] = ([], [])  # the data the trainer and the scorer see
        self._trainer_ready = threading.Event()
        self._ready_cpu = 0.0
        self._warm = False  # the training process was ready (torch imported) when the job came
        self._inode = 0
        self._tree: TreeCPU | None = None
        self._progress_at = 0
        self._job: JobSpec | None = None
        self._received = time.time()
        self.limits = limits.from_env()  # what the run may hold (runner.limits); the local runner sets it per slot
        self._limit_hit = ""  # the limit the run crossed, in words, once the supervisor stopped it for that
        self._capped_at: float | None = None  # the clock's reading when the training process was stopped at its cap
        self._limits_due = 0.0
        self._oom_kills = processes.oom_kills()
        self._rlimits: list[tuple[int, int]] = []  # what _child_setup sets in each process it starts
        self._parent = os.getpid()

    # --- before the job --------------------------------------------------------------------------
    def prepare(self) -> None:
        """Check the data, make the run's directories, and start both sandboxed processes: the
        training process waits for its job's line, the scorer for `go`. Both import torch meanwhile."""
        try:
            profile = self.profile = get_profile(self.profile_name)
        except ValueError as error:
            self.failure = str(error)
            return
        self._prepare_dirs()
        try:
            dataset = load_dataset(self.data or profile.data, profile.name)
            self.hashes = self.hashes.model_copy(update={"data": verify_dataset(dataset, profile.name)})
        except DataMissing as error:
            self.failure = str(error)
            return
        tokens = tokenizer_dir(dataset, profile.vocab_size)
        if not is_cached(dataset, profile.vocab_size):  # the data may be another profile's, shared
            self.failure = (
                f"the {profile.name} profile's tokenizer ({profile.vocab_size} tokens) is not prepared: "
                f"run `autoresearch prepare --profile {profile.name}` first"
            )
            return
        if not self.sandboxed:
            self.log.say(
                f"WARNING: running train.py WITHOUT a sandbox: {self.why_unsandboxed}. It can read every "
                "file this user can and open network connections; the result is marked unsandboxed."
            )
        # Every process of the run stays below this one, whatever it forks or detaches (runner.proctree).
        proctree.become_subreaper()
        self._rlimits = limits.child_rlimits(self.limits, cuda=profile.device == "cuda")
        self._parent = os.getpid()
        manifest = dataset.root / "manifest.json"
        self._data_views = ([manifest, *dataset.paths("train"), tokens], [manifest, *dataset.paths("val"), tokens])
        self.scorer.start()
        self.trainer = self._start_trainer(profile)
        self.prepared_at = time.time()

    def discard(self) -> None:
        """Stop whatever this supervisor started and still runs (a worker that was not needed, the
        end of a run), and every process those started, detached or not."""
        for proc in (self.trainer, self.scorer.proc):
            if proc is not None and proc.poll() is None:
                processes.kill_group(proc.pid)
                proc.wait()
        processes.kill_leftovers(None)
        self.log.close()

    # --- the run -----------------------------------------------------------------------------------
    def run(
        self,
        job: JobSpec,
        *,
        out: Path | None = None,
        received_at: float | None = None,
        detail: str | None = None,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> ResultSpec:
        """Run `job`. `out`: where the caller has since moved the run directory (a warm worker's
        directory renamed to its run's); `received_at`: when the job arrived (default: now);
        `detail`, `on_progress`: the job's, for a worker prepared before they were known."""
        if job.task != DEFAULT_TASK:  # a worker prepares training; another task's job goes to its evaluator
            self.discard()
            return run_task_job(
                job,
                out or self.out,
                backend=self.identity.backend,
                detail=detail or "",
                data=self.data,
                on_line=self.on_line,
            )
        self._job, self._received = job, received_at or time.time()
        if detail is not None:
            self.identity = self.identity.model_copy(update={"detail": detail})
        if on_progress is not None:
            self.on_progress = on_progress
        self.hashes = self.hashes.model_copy(update={"asset": job.asset_sha256})
        try:
            if out is not None and out != self.out:
                self._moved_to(out)
            if self.failure:
                return self._result("crash", error=self.failure, profile=self.profile)
            assert self.profile is not None, "prepare() comes first"
            if job.profile != self.profile.name:
                return self._result(
                    "crash",
                    profile=self.profile,
                    error=(
                        f"this worker was prepared for the {self.profile.name} profile, the job is for {job.profile}"
                    ),
                )
            files.write_text(self.out / "asset" / "train.py", job.asset)  # the sandbox sees it from now on
            budget = self.profile.time_budget_s * job.budget_fraction  # a screening run's cap scales with it
            return self._train_then_score(replace(self.profile, time_budget_s=budget))
        finally:
            self.discard()

    def _moved_to(self, out: Path) -> None:
        if not out.is_dir() or os.stat(out).st_ino != self._inode:
            raise RuntimeError(f"{out} is not this worker's directory {self.out} renamed")
        self.out, self.scratch, self.handoff = out, out / "scratch", out / "handoff"

    def _train_then_score(self, profile: Profile) -> ResultSpec:
        code, cpu, wall, killed = self._run_training(profile)
        self.timings.training_wall = wall
        claims = self._read_claims()
        if killed:
            return self._result(
                "timeout",
                profile=profile,
                claims=claims,
                cpu=cpu,
                error=f"the training process ran past the profile's hard limit of "
                f"{profile.max_total_s:.0f} s and was killed with everything it started",
            )
        used = self.timings.training = self._used(profile, cpu, wall)
        cap = profile.cap_s(self._clock_threads())
        if self._capped_at is not None or used > cap:
            # Checked first: a process stopped at its cap hands over no model, and that is why.
            return self._result(
                "rejected",
                profile=profile,
                claims=claims,
                cpu=cpu,
                error=(
                    f"the training process used {max(used, self._capped_at or 0.0):.1f} s on the {profile.clock} clock "
                    f"since its job was handed over, measured outside its sandbox, past its cap of {cap:.1f} s (the "
                    f"budget of {profile.time_budget_s:.0f} s plus {cap - profile.time_budget_s:.1f} s for start-up, "
                    "warm-up steps and the export), and was stopped: train.py trained past the budget. "
                    "The harness ends training in time when train.py loops `while not h.time_up()` and calls "
                    "h.finish(model) right after; work before, between or after the harness's calls counts too"
                ),
            )
        model = self.scratch / MODEL_FILE
        if code != 0 or claims.get("status") != "exported" or not os.path.lexists(model):
            status, error = self._failure(code, claims)  # its own crash, a limit it crossed, or a kill from outside
            return self._result(status, profile=profile, claims=claims, cpu=cpu, error=error)
        graph = files.read_regular(model, MODEL_LIMIT_BYTES)
        if graph is None:
            return self._result(
                "rejected",
                profile=profile,
                claims=claims,
                cpu=cpu,
                error=(
                    f"{MODEL_FILE} is not a regular file under {MODEL_LIMIT_BYTES >> 30} GiB (a link, a pipe, or too large)"
                ),
            )
        files.write_bytes(self.handoff / MODEL_FILE, graph)  # the scorer reads a copy no training process can reach
        score, self.timings.evaluation = self.scorer.score(profile.score_limit_s)
        self.timings.probe = float(score.get("probe_seconds") or 0.0)
        if "rejected" in score:
            return self._result("rejected", profile=profile, claims=claims, cpu=cpu, error=str(score["rejected"]))
        if "val_bpb" not in score:
            return self._result(
                "crash",
                profile=profile,
                claims=claims,
                cpu=cpu,
                error=str(score.get("error") or "the scoring process gave no answer"),
            )
        self.identity = self.identity.model_copy(update={"device": str(score.get("device", "cpu"))})
        return self._result("ok", profile=profile, claims=claims, cpu=cpu, score=score)

    # --- the two processes ---------------------------------------------------------------------------
    def _start_trainer(self, profile: Profile) -> subprocess.Popen[bytes]:
        """The training process, sandboxed, started before its job: it imports torch and waits
        for the job's line (runner.execute --wait)."""
        # Paths relative to its working directory (scratch): a warm worker's directory is renamed
        # when its job comes, and an unsandboxed process sees the rename (a sandboxed one sees its
        # bind mounts at the old path). The working directory follows the directory, not its name.
        cmd = [
            sys.executable,
            "-m",
            "runner.execute",
            "--asset",
            "../asset/train.py",
            "--profile",
            profile.name,
            "--out",
            ".",
            "--threads",
            str(self.threads),
            "--export",
            "--wait",
        ]
        if self.data:
            cmd += ["--data", self.data]
        fa3 = kernels.view(profile)  # Flash Attention 3 as prepared: read-only, offline
        box = sandbox.Sandbox(
            read=[self.out / "asset", *self._data_views[0], *fa3.read],
            write=[self.scratch],
            env=self._env(profile, home=self.scratch) | fa3.env,
            gpus=self._gpus(profile),
            cwd=self.scratch,
        )
        argv = sandbox.wrap(cmd, box) if self.sandboxed else cmd
        proc = processes.started(
            subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=box.env,
                cwd=box.cwd,
                start_new_session=True,
                preexec_fn=self._child_setup,
            )
        )
        # Only a CPU-clock budget needs the process tree's CPU time: walking /proc ten times a second
        # is not free on a busy GPU machine, whose budget is wall time. What it detaches comes to this
        # process (a subreaper): still its CPU time, as in _limit_crossed.
        orphans_of = os.getpid() if proctree.is_subreaper() else None
        self._tree = (
            TreeCPU(proc.pid, orphans_of=orphans_of, spare=lambda: processes.managed() - {proc.pid})
            if profile.clock == "cpu"
            else None
        )
        self._trainer_ready.clear()
        self._pump = threading.Thread(target=self._pump_output, args=(proc,), daemon=True)
        self._pump.start()
        return proc

    def _run_training(self, profile: Profile) -> tuple[int | None, float, float, bool]:
        """Hand the job to the training process and measure it until it ends: (exit code, CPU
        seconds, wall seconds, killed at the hard limit). Both clocks start at the hand-over; at the
        cap the process is stopped and `_capped_at` set."""
        assert self._job is not None and self.trainer is not None
        if self.trainer.poll() is not None:  # a worker whose process died while it waited: start afresh
            self.log.say(
                f"[supervisor] the waiting training process had ended (exit code {self.trainer.returncode}); "
                "starting a new one"
            )
            self.trainer = self._start_trainer(profile)
        proc = self.trainer
        self._warm = self._trainer_ready.is_set()
        self._await_ready(proc, profile)  # a cold run's imports are no more the run's than a warm one's
        ready_cpu = 0.0
        if self._tree is not None:
            self._tree.sample()
            ready_cpu = self._tree.total()  # its imports, before the job: not the run's
        go = time.time()
        self.timings.sandbox_setup = go - self._received
        try:
            assert proc.stdin is not None
            line = {"seed": self._job.seed, "started_at": go, "budget_fraction": self._job.budget_fraction}
            proc.stdin.write((json.dumps(line) + "\n").encode())
            proc.stdin.close()
        except BrokenPipeError:
            pass  # it died just now: reaped below, and reported as the crash it is
        deadline = go + profile.max_total_s
        killed = False
        while True:
            if self._tree is not None:
                self._tree.sample()
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            self._relay_progress()
            if self._over_limits(proc):  # stopped, with everything it started: reaped below
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            if self._past_cap(profile, go, ready_cpu):  # it trained past its budget, whatever its harness said
                processes.kill_group(proc.pid)
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            if time.time() > deadline:
                processes.kill_group(proc.pid)
                killed = True
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.1)
        wall = time.time() - go
        proc.returncode = os.waitstatus_to_exitcode(status)
        processes.kill_leftovers(proc.pid)  # unsandboxed: whatever it left behind; sandboxed: already gone
        self._pump.join(timeout=10)
        self._relay_progress()
        # The kernel's account of what was reaped, or what was seen running, whichever is more.
        cpu = usage.ru_utime + usage.ru_stime
        if self._tree is not None:
            cpu = max(cpu, self._tree.total())
        self._ready_cpu = ready_cpu
        return proc.returncode, max(0.0, cpu - ready_cpu), wall, killed

    def _spawn_scorer(self) -> subprocess.Popen[str]:
        """The scoring process, sandboxed, reading the handoff directory (empty until the model is
        copied there) and the validation split; it gets ready and waits for `go` on its stdin."""
        profile = self.profile
        assert profile is not None
        cmd = [
            sys.executable,
            "-m",
            "runner.score",
            "--model",
            MODEL_FILE,
            "--profile",
            profile.name,
            "--wait",
        ]  # relative to its working directory, handoff: see _start_trainer
        if self.data:
            cmd += ["--data", self.data]
        box = sandbox.Sandbox(
            read=[self.handoff, *self._data_views[1]],
            env=self._env(profile, home=self.handoff),
            gpus=self._gpus(profile),
            cwd=self.handoff,
        )
        argv = sandbox.wrap(cmd, box) if self.sandboxed else cmd
        return subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=box.env,
            cwd=self.handoff,
            start_new_session=True,
            preexec_fn=self._child_setup,
        )

    def wait_ready(self, timeout: float) -> bool:
        """True once both processes are ready for the job (torch imported, data loaded), within
        `timeout` seconds; False if one is not (it failed, or is slow: run() copes with both)."""
        deadline = time.time() + timeout
        for ready in (self._trainer_ready, self.scorer.ready):
            if not ready.wait(max(0.0, deadline - time.time())):
                return False
        return True

    def _env(self, profile: Profile, *, home: Path) -> dict[str, str]:
        """The whole environment of a sandboxed process: nothing inherited but the basics."""
        env = {
            "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(home),
            "TMPDIR": "/tmp" if self.sandboxed else str(home),
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "AUTORESEARCH_CACHE": str(cache_dir()),
            "CUDA_VISIBLE_DEVICES": (self.gpu or "0") if profile.device == "cuda" else "",
        }
        if self.threads > 0:
            env["OMP_NUM_THREADS"] = str(self.threads)
        if profile.device != "cuda":
            # OpenMP threads that spin while they wait burn the cores their neighbours need: on a busy
            # 2-core machine a forward of the scorer took twice as long spinning as sleeping.
            env["OMP_WAIT_POLICY"] = "PASSIVE"
        return env

    def _gpus(self, profile: Profile) -> list[str]:
        return [self.gpu or "0"] if profile.device == "cuda" else []

    # --- limits and kills ---------------------------------------------------------------------------
    def _child_setup(self) -> None:
        """Runs in each child between fork and exec, while the supervisor has threads: system calls
        only, nothing that could wait for a lock another thread held at the fork. Its limits
        (runner.limits); in a supervisor's own process, death with it (runner.proctree)."""
        for which, value in self._rlimits:
            resource.setrlimit(which, (value, value))
        if _OWN_PROCESS:
            proctree.die_with_parent(self._parent)

    def _over_limits(self, proc: subprocess.Popen[bytes]) -> bool:
        """About once a second: has the run crossed a limit (runner.limits)? If so it is stopped, with
        everything it started, and `_limit_hit` says which limit, in words."""
        now = time.monotonic()
        if now < self._limits_due:
            return False
        self._limits_due = now + LIMITS_EVERY_S
        why = limits.crossed(self.limits, proc.pid, self.scratch, spare=processes.managed())
        if not why:
            return False
        self._limit_hit = why
        self.log.say(f"[supervisor] {why}")
        processes.kill_group(proc.pid)
        return True

    def _failure(self, code: int | None, claims: dict[str, Any]) -> tuple[str, str]:
        """Why the training process handed over no model, and whose failure that is: `crash` (its
        own code, or a limit it crossed) or `lost` (killed from outside the run, by a signal this
        supervisor did not send and its limits do not explain: run again, not charged to train.py).
        A train.py can fake that last one (exit code 137 in the sandbox, SIGKILL to itself outside
        it): the conductor charges a run lost that way a second time (bot.loop.runs)."""
        own = str(claims.get("error") or "")[-4000:]
        if self._limit_hit:
            return "crash", self._limit_hit + (f". Its own last words: {own}" if own else "")
        signum = processes.signal_of(code)
        assert self.trainer is not None
        if signum in processes.OUTSIDE_SIGNALS and not processes.killed_here(self.trainer.pid):
            name = signal.Signals(signum).name
            by = (
                "the kernel's OOM killer (this machine ran out of memory: it killed a process while the run went on)"
                if processes.oom_kills() > self._oom_kills
                else "something outside the run (an operator, a shutdown, another process's memory)"
            )
            return "lost", (
                f"the training process was killed by {name}, sent by {by}, not by its own code or "
                "a limit of the run: the run is lost and runs again"
            )
        error = own or processes.exit_reason(code)
        if self.profile is not None and self.profile.device != "cuda" and OUT_OF_MEMORY.search(error):
            error = (
                f"train.py ran out of memory: a run may hold {limits.describe(self.limits.memory)} "
                f"(the limit per run). {error}"
            )
        elif self.sandboxed and OUT_OF_TASKS.search(error):
            error = (
                f"train.py could not start another process or thread: a run may have {self.limits.tasks} "
                f"(the limit per run). {error}"
            )
        return "crash", error

    # --- output ----------------------------------------------------------------------------------------
    def _prepare_dirs(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        for stale in ("scratch", "handoff", "asset"):  # a reused directory starts clean
            shutil.rmtree(self.out / stale, ignore_errors=True)
        (self.out / "result.json").unlink(missing_ok=True)
        self.scratch.mkdir()
        os.chmod(self.scratch, 0o777)  # the sandbox's user (nobody) writes here
        (self.out / "asset").mkdir()  # train.py is written there when the job comes
        self.handoff.mkdir()
        self._inode = os.stat(self.out).st_ino
        self.log.open(self.out / "log.txt")

    def _pump_output(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            if not self._trainer_ready.is_set() and raw.startswith(READY_LINE):
                self._trainer_ready.set()  # the supervisor's business: not train.py's output
                continue
            if raw.startswith(CLAIMED_SCORE):  # only the supervisor's summary says val_bpb (see _result)
                raw = b"(train.py printed) " + raw
            self.log.write(raw)
            if self.on_line is not None:
                self.on_line(raw.decode(errors="replace").rstrip("\n"))

    def _relay_progress(self) -> None:
        if self.on_progress is None:
            return
        chunk = files.read_regular(self.scratch / "progress.jsonl", 1 << 20, offset=self._progress_at)
        if chunk is None:
            return
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._progress_at += len(complete)
        for line in complete.splitlines():
            try:
                self.on_progress(json.loads(line))
            except ValueError:
                continue

    def _read_claims(self) -> dict[str, Any]:
        try:
            claims = json.loads(files.read_regular(self.scratch / "claims.json", 1 << 20) or b"{}")
        except ValueError:
            return {}
        return claims if isinstance(claims, dict) else {}

    def _clock_threads(self) -> int:
        """The threads allotted, the CPU clock's divisor; with none given, the CPUs this process may
        use (runner.execute allots the training process as many)."""
        return self.threads if self.threads > 0 else len(os.sched_getaffinity(0))

    def _used(self, profile: Profile, cpu: float, wall: float) -> float:
        """Seconds on the profile's clock, from CPU seconds of the tree and wall seconds."""
        return wall if profile.clock == "wall" else cpu / self._clock_threads()

    def _past_cap(self, profile: Profile, go: float, ready_cpu: float) -> bool:
        """Has the training process used its cap (budget + allowance) since the hand-over at `go`?
        Sets `_capped_at` then. The tree was sampled just before."""
        cpu = self._tree.total() - ready_cpu if self._tree is not None else 0.0
        used = self._used(profile, cpu, time.time() - go)
        if used < profile.cap_s(self._clock_threads()):
            return False
        self._capped_at = used
        self.log.say(
            f"[supervisor] the training process used {used:.1f} s on the {profile.clock} clock, its cap: stopped"
        )
        return True

    def _await_ready(self, proc: subprocess.Popen[bytes], profile: Profile) -> None:
        """Wait until the training process says it is ready (torch imported) or has ended, within
        the profile's hard limit: what a cold run's process does before then is not the run's."""
        ready_by = time.time() + min(STANDBY_READY_S, profile.max_total_s)
        while not self._trainer_ready.wait(0.1) and time.time() < ready_by:
            try:
                if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                    return  # it ended (left for the caller to reap and report)
            except ChildProcessError:
                return

    def _result(
        self,
        status: str,
        *,
        error: str | None = None,
        profile: Profile | None = None,
        claims: dict[str, Any] | None = None,
        cpu: float = 0.0,
        score: dict[str, Any] | None = None,
    ) -> ResultSpec:
        claims = claims or {}
        self.timings.startup = float(claims.get("startup_seconds") or 0.0)
        self.timings.export = float(claims.get("eval_seconds") or 0.0)  # finish() exported, in the sandbox
        self.timings.total = time.time() - self._received
        job = self._job
        assert job is not None
        metrics: dict[str, Any] = {key: claims[key] for key in CLAIMED_KEYS if key in claims}
        if "training_seconds" in metrics:
            metrics["claimed_training_seconds"] = metrics.pop("training_seconds")
        if profile is not None:
            threads = self._clock_threads()
            wall = self.timings.training_wall
            metrics.update(
                clock=profile.clock,
                threads=threads,
                cpu_seconds=round(cpu, 3),
                training_seconds=round(self.timings.training, 3),
                cpu_share=round(cpu / (wall * threads), 4) if wall > 0 else 0.0,
                warm=self._warm,
                ready_cpu_seconds=round(self._ready_cpu, 3),
            )
        if score:
            metrics.update(
                {
                    k: score[k]
                    for k in ("eval_tokens", "eval_bytes", "probe", "probe_max_change", "params_fingerprint")
                    if k in score
                }
            )
        metrics.update(total_seconds=round(self.timings.total, 3), eval_seconds=round(self.timings.evaluation, 3))
        result = ResultSpec(
            run_id=job.run_id,
            experiment_id=job.experiment_id,
            status=status,  # type: ignore[arg-type]
            val_bpb=float(score["val_bpb"]) if score else None,
            error=error,
            metrics=metrics,
            log_tail=run_log.tail(self.out / "log.txt"),
            timings=self.timings,
            hashes=self.hashes,
            runner=self.identity,
            sandboxed=self.sandboxed,
            profile=job.profile,
            seed=job.seed,
            budget_fraction=job.budget_fraction,
        )
        if self.log.is_open:
            # the reference's summary block, with the scorer's number: `grep "^val_bpb:" log.txt`
            self.log.close(summary=result.summary_block())
            result = result.model_copy(update={"log_tail": run_log.tail(self.out / "log.txt")})
        for model in (self.scratch / MODEL_FILE, self.handoff / MODEL_FILE):  # scored: no use kept
            if not model.is_symlink():  # a link planted by train.py is left alone, not followed
                model.unlink(missing_ok=True)
        self.out.mkdir(parents=True, exist_ok=True)
        files.write_text(self.out / "result.json", result.model_dump_json(indent=2))
        return result


def run_job(job: JobSpec, out: Path, **options: Any) -> ResultSpec:
    """Run `job` through the isolated path in directory `out`, cold: its processes start now.
    See Supervisor for the options. A job of another task than training goes to its evaluator
    (runner.tasks.run), with the options that path takes."""
    if job.task != DEFAULT_TASK:
        return run_task_job(job, out, **{key: options[key] for key in TASK_OPTIONS if key in options})
    received = time.time()
    supervisor = Supervisor(out, job.profile, **options)
    supervisor.prepare()
    return supervisor.run(job, received_at=received)


_OWN_PROCESS = False  # main() runs here: this process serves its supervisor only, from its main thread
OUT_OF_MEMORY = re.compile(r"MemoryError|can't allocate memory|Cannot allocate memory|bad_alloc")
TASK_OPTIONS = ("backend", "detail", "data", "on_line")  # what another task's run takes of run_job's options
OUT_OF_TASKS = re.compile(r"BlockingIOError|Resource temporarily unavailable|can't start new thread")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runner.isolated", description=__doc__.splitlines()[0])
    parser.add_argument("--job", type=Path, help="a JobSpec as JSON: run it now, cold")
    parser.add_argument(
        "--standby",
        metavar="PROFILE",
        default=None,
        help=(
            "a warm worker: prepare a run of PROFILE, write OUT/ready, then read one line from stdin, "
            '{"job": JOB.json, "out": DIR} (DIR: OUT renamed by the caller), and run that job; at end of '
            "input instead, stop and remove OUT"
        ),
    )
    parser.add_argument("--out", type=Path, required=True, help="the run directory")
    parser.add_argument("--backend", default="local")
    parser.add_argument("--data", default=None, help="data source (default: the profile's)")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--gpu", default=None, help="the NVIDIA device index of this slot")
    parser.add_argument("--detail", default="", help="the backend's reference for this run (a URL)")
    parser.add_argument("--no-sandbox", action="store_true", help="run without bubblewrap (marked unsandboxed)")
    parser.add_argument("--echo", action="store_true", help="copy the training output to stderr")
    args = parser.parse_args(argv)
    if (args.job is None) == (args.standby is None):
        parser.error("give either --job or --standby")
    global _OWN_PROCESS
    _OWN_PROCESS = True  # its children die with it, and a SIGTERM ends the whole run
    signal.signal(signal.SIGTERM, processes.end_all_and_exit)
    args.out = args.out.resolve()  # the sandbox binds absolute paths
    echo = (lambda line: print(line, file=sys.stderr, flush=True)) if args.echo else None
    options: dict[str, Any] = {
        "backend": args.backend,
        "data": args.data,
        "threads": args.threads,
        "gpu": args.gpu,
        "detail": args.detail,
        "use_sandbox": False if args.no_sandbox else None,
        "on_line": echo,
    }
    if args.standby is not None:
        return _standby(args.standby, args.out, options)
    try:
        job = JobSpec.model_validate_json(args.job.read_text())
    except (OSError, ValueError) as error:
        print(f"error: {args.job} is not a job: {error}", file=sys.stderr)
        return 2
    _report(job, run_job(job, args.out, **options))
    return 0


def _standby(profile: str, out: Path, options: dict[str, Any]) -> int:
    """A warm worker (see --standby): prepared before its job, so the job's start-up does not
    import torch. It serves one job and ends, so nothing a train.py did outlives its run."""
    supervisor = Supervisor(out, profile, **options)
    supervisor.prepare()
    if supervisor.wait_ready(STANDBY_READY_S):
        files.write_text(out / "ready", f"{time.time():.3f}\n")
    line = sys.stdin.readline()
    received = time.time()
    if not line.strip():  # not needed after all (its runner stopped): leave nothing behind
        supervisor.discard()
        shutil.rmtree(out, ignore_errors=True)
        return 0
    try:
        order = json.loads(line)
        job = JobSpec.model_validate_json(Path(order["job"]).read_text())
        moved = Path(order["out"]).resolve()
    except (OSError, ValueError, KeyError, TypeError) as error:
        supervisor.discard()
        print(f"error: the standby worker got no job it can read ({error}): {line[:200]!r}", file=sys.stderr)
        return 2
    (moved / "ready").unlink(missing_ok=True)
    _report(job, supervisor.run(job, out=moved, received_at=received))
    return 0


def _report(job: JobSpec, result: ResultSpec) -> None:
    print(
        re.sub(
            r"\s+",
            " ",
            f"run {job.run_id}: {result.status} {result.value if result.value is not None else result.error or ''}",
        )[:300],
        file=sys.stderr,
    )


if __name__ == "__main__":
    sys.exit(main())
