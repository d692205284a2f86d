"""Pieces of hostile train.py files that several tests use: processes that try to outlive their run.

Each test names its own marker, which the processes carry on their command lines, so that it finds
its own leftovers and no other test's. (`sleep 600 MARK` would not do: sleep refuses the extra
argument and exits at once, and a test of leftovers would then prove nothing.)
"""

from __future__ import annotations

from pathlib import Path


def sleeper(mark: str) -> str:
    """Python source of the argv of a process that sleeps ten minutes with `mark` on its command line."""
    return f'[sys.executable, "-c", "import time; time.sleep(600)", "{mark}"]'


def escape(mark: str) -> str:
    """train.py source that leaves the run's process tree every way it can (a child, a setsid child,
    a setsid double fork), waits until all three run, and prints `escaped`."""
    argv = sleeper(mark)
    return f"""
import os, subprocess, sys, time
subprocess.Popen({argv})
subprocess.Popen({argv}, start_new_session=True)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, {argv})
    os._exit(0)
def marked():
    found = 0
    for p in os.listdir("/proc"):
        try:
            found += p.isdigit() and b"{mark}" in open(f"/proc/{{p}}/cmdline", "rb").read()
        except OSError:
            pass  # a process that ended between the listing and the read (unsandboxed, it sees them all)
    return found
while marked() < 3:
    time.sleep(0.1)
print("escaped", flush=True)
"""


def marked(mark: str) -> list[int]:
    """The processes alive now (zombies excluded) whose command line carries `mark`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and mark.encode() in (entry / "cmdline").read_bytes():
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found
