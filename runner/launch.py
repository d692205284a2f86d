"""Child processes for runs: the isolated supervisor, and the bare training process.

- `start_isolated` starts `python -m runner.isolated` for a job file: the path every runner takes
  (sandboxed training, scoring in a separate process; see runner.isolated). The local runner
  starts one per job, in its own session, with an environment scrubbed of secrets;
  `start_standby` starts one before its job is known (a warm worker), to be handed the job later.
- `start`/`run`/`collect` run `python -m runner.execute` alone, train.py and the in-process
  evaluation together, unsandboxed: what `python train.py` does, used by the harness's own tests
  and benches to look at the training process itself. No runner judges an experiment this way.
Whatever happens (a crash, a kill, a timeout) `collect` gives a result dict: the harness's
result.json, or a crash record built from the exit status and the log tail.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runner import proctree, run_log
from runner.limits import RunLimits

# The training child gets only what running Python and PyTorch needs (an allow-list: of the
# project's own variables only the harness's, none of the service's), and even then nothing
# whose name looks like a credential.
ALLOWED_NAME = re.compile(
    r"^(PATH|HOME|USER|LOGNAME|SHELL|TERM|LANG|LANGUAGE|TZ|TMPDIR|PWD|VIRTUAL_ENV|LD_LIBRARY_PATH|"
    r"LC_\w+|PYTHON\w*|AUTORESEARCH_(CACHE|PROFILE|OUT|DATA|SANDBOX|RUN_(MEMORY|TASKS|SCRATCH))|CUDA_\w+|NVIDIA_\w+|NCCL_\w+|TORCH\w*|"
    r"PYTORCH_\w+|TRITON_\w+|OMP_\w+|MKL_\w+|OPENBLAS_\w+|KMP_\w+|HF_HOME|XDG_CACHE_HOME)$"
)
SECRET_NAME = re.compile(
    r"(^|_)TOKEN($|_)|SECRET|PASSWORD|PASSWD|API_?KEY|PRIVATE_KEY|CREDENTIAL|"
    r"^GITHUB_|^ANTHROPIC_|^MODAL_|^AWS_|^GH_",
    re.IGNORECASE,
)
STOP_GRACE_S = 10.0  # a supervisor told to stop (SIGTERM) has this long to end its run before it is killed


def training_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The parent's environment, reduced to what training needs and free of credentials."""
    env = {k: v for k, v in os.environ.items() if ALLOWED_NAME.match(k) and not SECRET_NAME.search(k)}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def command(
    asset: Path, profile: str, out: Path, *, seed: int = 0, data: str | None = None, threads: int = 0
) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "runner.execute",
        "--asset",
        str(asset),
        "--profile",
        profile,
        "--out",
        str(out),
        "--seed",
        str(seed),
        "--threads",
        str(threads),
        "--started-at",
        f"{time.time():.3f}",
    ]
    if data:
        cmd += ["--data", data]
    return cmd


def start(
    asset: Path,
    profile: str,
    out: Path,
    *,
    seed: int = 0,
    data: str | None = None,
    threads: int = 0,
    echo: bool = False,
    extra_env: dict[str, str] | None = None,
) -> subprocess.Popen:
    """Start the child in its own process group; its output goes to out/log.txt (or to a pipe
    for the caller to read, with echo). `extra_env` (a slot's CUDA_VISIBLE_DEVICES, say) is added
    to the scrubbed environment."""
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("result.json", "progress.jsonl", "pid", "log.txt"):  # a reused directory
        (out / stale).unlink(missing_ok=True)
    extra = {"OMP_NUM_THREADS": str(threads)} if threads > 0 else {}
    env = training_env(dict(extra, **(extra_env or {})))
    cmd = command(asset, profile, out, seed=seed, data=data, threads=threads)
    if echo:  # the caller reads stdout and writes log.txt itself
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    else:
        with open(out / "log.txt", "ab") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    (out / "pid").write_text(str(proc.pid))
    return proc


def start_isolated(
    job_file: Path,
    out: Path,
    *,
    data: str | None = None,
    threads: int = 0,
    gpu: str | None = None,
    limits: RunLimits | None = None,
) -> subprocess.Popen:
    """Start the supervisor of one isolated run (runner.isolated) in its own session; it writes
    out/result.json. Its pid goes to out/pid. `limits`: what the run may hold (default: the
    environment's, runner.limits)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "pid").unlink(missing_ok=True)
    return _start_supervisor(["--job", str(job_file)], out, data=data, threads=threads, gpu=gpu, limits=limits)


def start_standby(
    profile: str,
    out: Path,
    *,
    data: str | None = None,
    threads: int = 0,
    gpu: str | None = None,
    limits: RunLimits | None = None,
) -> subprocess.Popen:
    """Start a warm worker (`python -m runner.isolated --standby`) in its own session: it prepares
    a run of `profile` in `out`, writes out/ready, and waits for its job's line on its stdin (a
    pipe the caller holds: closing it sends the worker away). Its pid goes to out/pid."""
    out.mkdir(parents=True, exist_ok=True)
    return _start_supervisor(
        ["--standby", profile], out, data=data, threads=threads, gpu=gpu, limits=limits, stdin=subprocess.PIPE
    )


def _start_supervisor(
    what: list[str],
    out: Path,
    *,
    data: str | None,
    threads: int,
    gpu: str | None,
    limits: RunLimits | None,
    stdin: int | None = None,
) -> subprocess.Popen:
    """`python -m runner.isolated` with `what` (its job, or --standby), in its own session, with
    the scrubbed environment; its output goes to out/supervisor.log and its pid to out/pid."""
    cmd = [sys.executable, "-m", "runner.isolated", *what, "--out", str(out), "--backend", "local"]
    cmd += ["--threads", str(threads)]
    cmd += ["--data", data] if data else []
    cmd += ["--gpu", gpu] if gpu else []
    with open(out / "supervisor.log", "ab") as log:
        proc = subprocess.Popen(
            cmd,
            stdin=stdin,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=training_env(limits.as_env() if limits else None),
            start_new_session=True,
        )
    (out / "pid").write_text(str(proc.pid))
    return proc


def collect(out: Path, returncode: int | None, *, timed_out: bool = False) -> dict[str, Any]:
    """The run's result: result.json if the harness wrote one, else a crash record."""
    result_file = out / "result.json"
    try:
        result = json.loads(result_file.read_text()) if result_file.exists() else None
        if result is not None and not isinstance(result, dict):
            raise ValueError("not a JSON object")
    except ValueError as error:
        result = {"status": "crash", "error": f"result.json is unreadable ({error}): the run is not counted"}
    if result is not None:
        if result.get("status") == "ok" and returncode not in (0, None):
            result = {
                "status": "crash",
                "error": f"train.py exited with code {returncode} after the harness measured it",
                "measured": result,
            }
    elif timed_out:
        result = {"status": "crash", "error": "the run exceeded its wall-clock limit and was killed"}
    elif returncode is not None and returncode < 0:
        name = signal.Signals(-returncode).name
        result = {
            "status": "crash",
            "error": f"the training process was killed by {name} (out of memory, or stopped from outside)",
        }
    elif returncode is None:
        result = {"status": "crash", "error": "the training process ended without writing a result"}
    else:
        result = {"status": "crash", "error": f"the training process exited with code {returncode} without a result"}
    result["log_tail"] = run_log.tail(out / "log.txt")
    return result


def run(
    asset: Path,
    profile: str,
    out: Path,
    *,
    seed: int = 0,
    data: str | None = None,
    threads: int = 0,
    timeout_s: float | None = None,
    on_line: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run one job to completion (blocking) and return its result dict."""
    from runner.profiles import get_profile

    limit = timeout_s or get_profile(profile).max_total_s
    proc = start(asset, profile, out, seed=seed, data=data, threads=threads, echo=on_line is not None)
    deadline = time.time() + limit
    timed_out = False
    pump = None
    if on_line is not None:
        # Read the child's output in a thread: a blocking read here would let a silent, hung
        # child outlive its wall-clock limit.
        log = open(out / "log.txt", "ab")
        assert proc.stdout is not None

        def pump_output() -> None:
            try:
                for raw in proc.stdout:
                    log.write(raw)
                    on_line(raw.decode(errors="replace").rstrip("\n"))
            finally:
                log.close()

        pump = threading.Thread(target=pump_output, daemon=True)
        pump.start()
    try:
        proc.wait(timeout=max(0.0, deadline - time.time()))
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:  # on a timeout, and on Ctrl-C: the child is in its own session and would go on
        if proc.poll() is None:
            kill_group(proc.pid)
            proc.wait()
    if pump is not None:
        pump.join(timeout=10)
    return collect(out, proc.returncode, timed_out=timed_out)


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def stop_supervisors(pids: list[int], grace_s: float = STOP_GRACE_S) -> float:
    """End isolated runs from outside, each with every process it started: SIGTERM to each
    supervisor (it kills its run's whole tree and exits, runner.isolated), and after `grace_s` one
    that has not exited is stopped (SIGSTOP: it forks nothing more, and its orphans still come to
    it), its tree killed, then it. Returns the seconds it took. The supervisors must be this
    process's children or dead: a pid is not checked for reuse here."""
    started = time.time()
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = started + grace_s
    for pid in pids:
        while _alive(pid) and time.time() < deadline:
            time.sleep(0.02)
        if _alive(pid):
            _signal(pid, signal.SIGSTOP)
            proctree.kill_tree([pid])
    return time.time() - started


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, ended but not reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")
