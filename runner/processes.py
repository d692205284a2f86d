"""The processes of this process's runs: which ones are still waited for, how they are ended, and
whether an ending was this process's doing or came from outside.

A supervisor (runner.isolated) registers each training and scoring process it starts
(`started`). Ending one (`kill_group`) takes its process group, everything below it, and the
orphans this process adopted as a subreaper (runner.proctree), however detached, while sparing
the other runs' processes this process still waits for (`managed`). A process killed here is
remembered, so that a kill from outside (an operator, a shutdown, the OOM killer) can be told
apart from the supervisor's own (`killed_here`, `signal_of`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import weakref
from pathlib import Path
from typing import TypeVar

from runner import proctree

# what an operator, a shutdown or the OOM killer send
OUTSIDE_SIGNALS = (signal.SIGKILL, signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
END_ALL_S = (
    8.0  # a stopped supervisor's time to end its runs' trees: under runner.launch.STOP_GRACE_S, which then kills it
)

_STARTED: weakref.WeakSet[subprocess.Popen] = weakref.WeakSet()  # the runs' processes this process started
_KILLED: set[int] = set()  # those this process killed itself (not killed from outside)

P = TypeVar("P", bound=subprocess.Popen)


def started(proc: P) -> P:
    """Register a run's process (training or scoring) that this process started and will reap."""
    _STARTED.add(proc)
    return proc


def managed() -> set[int]:
    """The runs' processes this process started and still waits for."""
    return {proc.pid for proc in list(_STARTED) if proc.returncode is None}


def killed_here(pid: int) -> bool:
    return pid in _KILLED


def kill_group(pid: int) -> None:
    """SIGKILL the process `pid` (a child not reaped yet), its process group, everything below it, and
    the orphans this process adopted (runner.proctree): all a run's process started, however detached."""
    _KILLED.add(pid)
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proctree.kill_tree([pid], orphans_of=os.getpid() if proctree.is_subreaper() else None, spare=managed() - {pid})


def kill_leftovers(pid: int | None, *, within_s: float = proctree.KILL_PASSES_S) -> None:
    """After a run's process ended and was reaped: what it left in its process group, and the
    orphans this process adopted (another run's processes in this process are spared)."""
    if pid is not None:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if proctree.is_subreaper():
        proctree.kill_tree([], orphans_of=os.getpid(), spare=managed(), within_s=within_s)


def end_all_and_exit(signum: int, frame: object) -> None:
    """The SIGTERM handler of a supervisor's own process (the run was cancelled, its runner shuts
    down): end every process of its runs, then this one, without a result (the runner records the
    run cancelled or lost)."""
    deadline = time.monotonic() + END_ALL_S  # one for them all: the runner kills this process after STOP_GRACE_S
    for pid in managed():
        _KILLED.add(pid)
        proctree.kill_tree([pid], within_s=max(0.0, deadline - time.monotonic()))
    kill_leftovers(None, within_s=max(0.0, deadline - time.monotonic()))
    os._exit(128 + signum)


def signal_of(code: int | None) -> int | None:
    """The signal that ended a process with exit status `code` (Popen's), or None."""
    if code is not None and code > 128 and code - 128 in signal.valid_signals():
        return code - 128  # bubblewrap reports a command killed by signal N as exit code 128 + N
    return -code if code is not None and code < 0 else None


def oom_kills() -> int:
    """How many processes the kernel's OOM killer has killed on this machine since it started."""
    try:
        for line in Path("/proc/vmstat").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def exit_reason(code: int | None) -> str:
    """A training process's end in words, when it said nothing itself."""
    signum = signal_of(code)
    if signum is not None:
        return f"the training process was killed by {signal.Signals(signum).name}"
    return f"the training process exited with code {code} without handing over a model"
