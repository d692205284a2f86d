"""A run's process tree, read from the kernel while it runs (/proc), and ended whole.

`TreeCPU` is the supervisor's clock for a CPU-time profile. `wait4` reports only the processes a parent
reaped, so a train.py that hands its work to a child process, and never waits for it, would
train on CPU time nobody counted. `TreeCPU.sample()` walks /proc for every process descending
from the root (inside a pid namespace every orphan is re-parented to the namespace's first
process, so it stays in the tree; unsandboxed it comes to the supervisor, a subreaper, and is
counted as its adopted orphan) and remembers the largest CPU time seen for each; a process
that ends between two samples loses at most one interval of its time.

Ending a tree: a train.py may fork, call setsid, or double-fork a daemon, so neither the process
group nor the session of the training process holds everything it started. The supervisor makes
itself a child subreaper (`become_subreaper`): an orphan of its tree is re-parented to it, not to
PID 1, and stays findable. `kill_tree` then SIGKILLs every descendant again and again until none
is left (a process forking while its tree is walked is found on the next pass; one killed while it
forks takes its unborn child along), and reaps the orphans it adopted. `Usage` reads what a tree
holds now (its tasks and private memory) for the supervisor's limits (runner.limits).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36  # linux/prctl.h
KILL_PASSES_S = 10.0  # how long kill_tree goes on killing and waiting before it gives up and says what is left
DYING_POLL_S = 0.05  # between two looks at processes killed and still dying (nothing left to kill)
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up now: a child between fork and exec calls it
    _prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
except (OSError, AttributeError):  # not Linux: no subreaper, no parent-death signal
    _prctl = None
_subreaper = False


@dataclass(frozen=True)
class Proc:
    """One process as /proc/PID/stat shows it."""

    ppid: int
    start: int  # clock ticks after boot: with the pid, names the process (pids are reused)
    cpu: float  # user + system seconds
    threads: int
    zombie: bool


def snapshot() -> dict[int, Proc]:
    """Every process on the machine now (that this user can see)."""
    procs: dict[int, Proc] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended meanwhile
        # fields[0] is the state (field 3 of proc(5)); fields[i] is field i + 3.
        procs[int(entry.name)] = Proc(
            ppid=int(fields[1]),
            start=int(fields[19]),
            cpu=(int(fields[11]) + int(fields[12])) / TICKS,
            threads=int(fields[17]),
            zombie=fields[0] in ("Z", "X"),
        )
    return procs


def descendants(roots: Collection[int], procs: dict[int, Proc]) -> set[int]:
    """The processes below `roots` in `procs` (the roots themselves not included)."""
    children: dict[int, list[int]] = {}
    for pid, proc in procs.items():
        children.setdefault(proc.ppid, []).append(pid)
    found: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


@dataclass(frozen=True)
class Usage:
    """What a process tree holds at one moment."""

    processes: int
    tasks: int  # processes and threads: what RLIMIT_NPROC counts
    memory: int  # bytes of private resident memory (resident minus shared, summed over the processes)


def usage(pids: Collection[int], procs: dict[int, Proc]) -> Usage:
    """The tasks and private memory of `pids` (taken from a snapshot)."""
    live = [pid for pid in pids if pid in procs and not procs[pid].zombie]
    memory = 0
    for pid in live:
        try:
            fields = Path(f"/proc/{pid}/statm").read_text().split()
            memory += (int(fields[1]) - int(fields[2])) * PAGE
        except (OSError, IndexError, ValueError):
            continue
    return Usage(processes=len(live), tasks=sum(procs[pid].threads for pid in live), memory=memory)


def become_subreaper() -> bool:
    """Make this process a child subreaper (Linux): orphans of its descendants come to it, not to
    PID 1. False where the system has no such thing."""
    global _subreaper
    _subreaper = _subreaper or (_prctl is not None and _prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    return _subreaper


def is_subreaper() -> bool:
    """True once become_subreaper() made this process one."""
    return _subreaper


def die_with_parent(parent: int) -> None:
    """For a child between fork and exec: SIGKILL it when the thread that started it ends, so a
    supervisor killed outright takes its direct children along. `parent`: the starter's pid, read
    before the fork (if it already ended, the child ends now). One system call, no allocation."""
    if _prctl is not None:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(137)


def kill_tree(
    roots: Collection[int],
    *,
    orphans_of: int | None = None,
    spare: Collection[int] = (),
    within_s: float = KILL_PASSES_S,
) -> int:
    """SIGKILL `roots` and everything below them, pass after pass until nothing is left; with
    `orphans_of` (this process, a subreaper), also its children that are not in `spare` (the
    processes it started itself and still manages: another run's) and everything below those.
    Zombies among this process's children that no one else waits for are reaped. Returns, with how
    many processes were killed, once every one of them is gone or a zombie, wherever it has moved
    in the tree meanwhile, or after `within_s` (a process stuck in the kernel, in uninterruptible
    sleep, cannot be hurried): then what is left is logged."""
    me = os.getpid()
    killed: set[tuple[int, int]] = set()
    deadline = time.monotonic() + within_s
    while True:
        procs = snapshot()
        top = {pid for pid in roots if pid in procs}
        if orphans_of is not None:
            top |= {pid for pid, proc in procs.items() if proc.ppid == orphans_of and pid not in spare}
        tree = top | descendants(top, procs)
        alive = {pid for pid in tree if not procs[pid].zombie}
        for pid in tree - alive:  # an orphan it adopted: nobody else will reap it
            if procs[pid].ppid == me and pid not in spare and pid not in roots:
                _reap(pid)
        # A process killed on an earlier pass may still be dying outside the tree: its parent died
        # first and it was re-parented away (a pid namespace's first process waits for the whole
        # namespace before it dies). Killed is not gone; wait for it too.
        dying = {pid for pid, start in killed if pid in procs and procs[pid].start == start and not procs[pid].zombie}
        if not (alive or dying):
            return len(killed)
        if time.monotonic() > deadline:
            log.warning(
                "gave up after %.1f s on ending processes %s (killed, still dying: %s)",
                within_s,
                sorted(alive) or "none alive",
                sorted(dying) or "none",
            )
            return len(killed)
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add((pid, procs[pid].start))
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01 if alive else DYING_POLL_S)  # nothing to kill: only waiting for the dying


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


class TreeCPU:
    """The CPU time of `root` and everything below it. With `orphans_of` (this process, a
    subreaper), also of its children that `spare()` does not name (the processes it manages
    itself) and everything below those: what the tree detached, which came to this process, is
    still the tree's, and trains on the same budget (unsandboxed; in a sandbox, orphans stay below
    the root)."""

    def __init__(
        self, root: int, *, orphans_of: int | None = None, spare: Callable[[], Collection[int]] = frozenset
    ) -> None:
        self.root = root
        self.orphans_of, self.spare = orphans_of, spare
        self._seen: dict[tuple[int, int], float] = {}  # (pid, start time) -> CPU seconds

    def sample(self, procs: dict[int, Proc] | None = None) -> None:
        """Look at the tree now (in `procs`, a snapshot taken for other uses too, or a new one)."""
        procs = snapshot() if procs is None else procs
        top = {self.root}
        if self.orphans_of is not None:
            spared = set(self.spare())
            top |= {pid for pid, proc in procs.items() if proc.ppid == self.orphans_of and pid not in spared}
        for pid in (top | descendants(top, procs)) & procs.keys():
            key = (pid, procs[pid].start)
            self._seen[key] = max(self._seen.get(key, 0.0), procs[pid].cpu)

    def total(self) -> float:
        return sum(self._seen.values())
