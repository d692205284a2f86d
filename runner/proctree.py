"""CPU time of a process tree, read from the kernel while it runs (/proc).

The supervisor's clock for a CPU-time profile. `wait4` reports only the processes a parent
reaped, so a train.py that hands its work to a child process, and never waits for it, would
train on CPU time nobody counted. `TreeCPU.sample()` walks /proc for every process descending
from the root (inside a pid namespace every orphan is re-parented to the namespace's first
process, so it stays in the tree) and remembers the largest CPU time seen for each; a process
that ends between two samples loses at most one interval of its time.
"""

from __future__ import annotations

import os
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


class TreeCPU:
    def __init__(self, root: int) -> None:
        self.root = root
        self._seen: dict[tuple[int, int], float] = {}  # (pid, start time) -> CPU seconds

    def sample(self) -> None:
        parent: dict[int, int] = {}
        usage: dict[int, tuple[int, float]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue  # ended meanwhile
            pid = int(entry.name)
            parent[pid] = int(fields[1])  # fields[0] is the state; see proc(5) for the numbering
            usage[pid] = (int(fields[19]), (int(fields[11]) + int(fields[12])) / TICKS)
        tree = {self.root}
        grew = True
        while grew:
            found = {pid for pid, ppid in parent.items() if ppid in tree and pid not in tree}
            tree |= found
            grew = bool(found)
        for pid in tree & usage.keys():
            start, seconds = usage[pid]
            key = (pid, start)
            self._seen[key] = max(self._seen.get(key, 0.0), seconds)

    def total(self) -> float:
        return sum(self._seen.values())
