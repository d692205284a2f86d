"""What one run may hold: memory, tasks (processes and threads), and its scratch directory's size.

A train.py (or another task's asset, a router.py) that allocates without end, forks without end or
writes without end must end its own run, not the machine's other work (the bot, the next run,
another slot). Each limit is enforced twice, once by the kernel where it can be and once by the supervisor, which looks at the run's
process tree and scratch directory about once a second and stops the run that crossed a limit:

- memory: RLIMIT_DATA on each process of a CPU profile (its private writable memory: the heap and
  every tensor; an allocation past it fails inside train.py, which crashes with its own
  MemoryError). Not on a CUDA profile: the CUDA runtime maps large ranges of address space for its
  own use, and no GPU here showed which of them a data limit counts, so there the supervisor's
  check alone bounds host memory. RLIMIT_AS is not used anywhere: it counts the reservations of
  every thread's allocator arena and would fail honest runs. The supervisor's check sums the
  private resident memory of the whole tree, so that many processes cannot each take the limit;
- tasks: in the sandbox, RLIMIT_NPROC set inside its user namespace (`nproc_argv`), where it
  counts only the sandbox's own tasks of uid 65534: a fork past it fails. It is not set on the
  unsandboxed path: there the count is of every task of the bot's own user on the machine (the bot,
  the other slots), and root is exempt; the supervisor's count of the tree is what stops a run;
- scratch: the supervisor sums the blocks of the files under DIR/scratch (and stops counting, and
  the run, past SCRATCH_FILES entries); RLIMIT_FSIZE bounds any one file; the sandbox's /tmp is a
  tmpfs of bounded size (runner.sandbox).

A run that crosses one ends as a `crash` whose error names the limit (and the asset): an experiment that needs
more than a run may hold has failed, as one that does not fit its GPU has.

The limits come from the environment of the supervisor (AUTORESEARCH_RUN_MEMORY, _TASKS,
_SCRATCH: a number of bytes with an optional K, M, G or T), which the local runner sets per
slot; by default a run may hold MEMORY_SHARE of the machine's memory divided among its slots.
"""

from __future__ import annotations

import os
import re
import resource
import sys
from dataclasses import dataclass
from pathlib import Path

from runner import proctree

MEMORY_SHARE = (
    0.5  # of the machine's memory, for all slots' runs together: the rest is the bot's, warm workers', the cache's
)
TASKS_BASE, TASKS_PER_CPU = 256, 16  # torch's threads, compile workers, a data loader's processes: 288 on 2 cores
SCRATCH_BYTES = 20 << 30  # the exported model (at most 8 GiB), checkpoints, logs
SCRATCH_FILES = 100_000  # entries under scratch: walking more would cost the supervisor more than a moment
FILE_BYTES = 16 << 30  # no single file a run writes may be larger
ENV = {"memory": "AUTORESEARCH_RUN_MEMORY", "tasks": "AUTORESEARCH_RUN_TASKS", "scratch": "AUTORESEARCH_RUN_SCRATCH"}
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


@dataclass(frozen=True)
class RunLimits:
    memory: int  # bytes of private memory, the whole process tree
    tasks: int  # processes and threads
    scratch: int  # bytes under the scratch directory

    def as_env(self) -> dict[str, str]:
        """The environment that gives a supervisor these limits."""
        return {ENV["memory"]: str(self.memory), ENV["tasks"]: str(self.tasks), ENV["scratch"]: str(self.scratch)}


def machine_memory() -> int:
    """Bytes of memory this machine has (MemTotal), or 16 GiB if /proc does not say."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 16 << 30


def default_limits(slots: int = 1) -> RunLimits:
    """A run's share of this machine when `slots` runs share it."""
    memory = max(1 << 30, int(machine_memory() * MEMORY_SHARE / max(1, slots)))
    return RunLimits(memory=memory, tasks=TASKS_BASE + TASKS_PER_CPU * (os.cpu_count() or 1), scratch=SCRATCH_BYTES)


def from_env(environ: dict[str, str] | None = None, *, slots: int = 1) -> RunLimits:
    """The limits the environment gives (see the module docstring); the defaults for `slots`
    slots where it gives none. Raises ValueError for a value that is not a size."""
    environ = dict(os.environ) if environ is None else environ
    default = default_limits(slots)
    values = {}
    for key, name in ENV.items():
        text = environ.get(name, "").strip()
        values[key] = parse_size(text, name) if text else getattr(default, key)
    return RunLimits(**values)


def parse_size(text: str, name: str = "size") -> int:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?", text.strip(), re.IGNORECASE)
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(f"{name}={text!r} is not a size: give bytes, or a number with K, M, G or T (6G)")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def describe(size: int) -> str:
    """6 GiB, 512 MiB: a size for people."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift:
            value = size / (1 << shift)
            return f"{value:.0f} {unit}" if value == int(value) or value >= 10 else f"{value:.1f} {unit}"
    return f"{size} bytes"


def child_rlimits(limits: RunLimits, *, cuda: bool) -> list[tuple[int, int]]:
    """(resource, value) pairs a run's processes get between fork and exec (see the docstring)."""
    pairs = [(resource.RLIMIT_FSIZE, FILE_BYTES), (resource.RLIMIT_CORE, 0)]
    if not cuda:
        pairs.append((resource.RLIMIT_DATA, limits.memory))
    lowered = []
    for which, value in pairs:  # never above what this process may have: raising a hard limit is refused
        hard = resource.getrlimit(which)[1]
        lowered.append((which, value if hard == resource.RLIM_INFINITY else min(value, hard)))
    return lowered


def nproc_argv(argv: list[str], tasks: int) -> list[str]:
    """`argv` preceded by a step that sets RLIMIT_NPROC to `tasks` and execs it: the first command
    inside a sandbox, whose user namespace then counts its own tasks only (see the docstring)."""
    code = (
        "import os, resource, sys; n = int(sys.argv[1]); resource.setrlimit(resource.RLIMIT_NPROC, (n, n)); "
        "os.execvp(sys.argv[2], sys.argv[2:])"
    )
    return [sys.executable, "-I", "-S", "-c", code, str(tasks), *argv]


@dataclass
class ScratchSize:
    """What a scratch directory holds: bytes on disk, entries, and whether the count stopped early."""

    bytes: int
    entries: int
    complete: bool


def scratch_size(root: Path, max_entries: int = SCRATCH_FILES) -> ScratchSize:
    """The blocks the files under `root` take (links are not followed), counting at most
    `max_entries` entries."""
    total, entries = 0, 0
    todo = [str(root)]
    while todo:
        try:
            with os.scandir(todo.pop()) as listing:
                for entry in listing:
                    entries += 1
                    if entries > max_entries:
                        return ScratchSize(total, entries, False)
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    total += info.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        todo.append(entry.path)
        except OSError:
            continue
    return ScratchSize(total, entries, True)


def crossed(limits: RunLimits, root: int, scratch: Path, *, spare: set[int], asset: str = "train.py") -> str:
    """Which limit the run whose process running `asset` (train.py, router.py...) is `root`
    crossed, in words that name the asset ("" for none): the memory and tasks of its whole tree
    (with what it detached, adopted by this process as a subreaper, except `spare`: other runs'
    processes), and its scratch directory's size."""
    procs = proctree.snapshot()
    tops = {root}
    if proctree.is_subreaper():  # what it detached came to this process: still the run's
        tops |= {pid for pid, p in procs.items() if p.ppid == os.getpid()} - spare
    held = proctree.usage(tops | proctree.descendants(tops, procs), procs)
    if held.memory > limits.memory:
        return (
            f"{asset} used more than {describe(limits.memory)} of memory (the limit per run): its "
            f"{held.processes} process(es) held {describe(held.memory)} when the supervisor stopped "
            f"them. A run that needs more needs {'a smaller model or batch' if asset == 'train.py' else 'a leaner ' + asset}, "
            f"or a larger share of the machine ({ENV['memory']}, or fewer slots)"
        )
    if held.tasks > limits.tasks:
        return (
            f"{asset} ran more than {limits.tasks} processes and threads at once (the limit per run): "
            f"{held.tasks} when the supervisor stopped them"
        )
    size = scratch_size(scratch)
    if not size.complete:
        return (
            f"{asset} wrote more than {SCRATCH_FILES} files and directories to its scratch "
            "directory (the limit per run)"
        )
    if size.bytes > limits.scratch:
        return (
            f"{asset} wrote more than {describe(limits.scratch)} to its scratch directory (the limit per "
            f"run): {describe(size.bytes)} when the supervisor stopped it"
        )
    return ""
