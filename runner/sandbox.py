"""The sandbox a training or scoring process runs in: bubblewrap (kernel namespaces).

`Sandbox` describes what one process may see; `wrap(argv, sandbox)` turns a command into the
`bwrap` command that runs it so. Inside:
- a new user, pid, network, IPC, UTS and cgroup namespace: no network (loopback only), no other
  process visible; the command is the namespace's first process, and when it ends every process
  it left behind dies with it;
- the system's programs and libraries, the Python installation and the `runner` package,
  read-only; nothing else of the host: no home directory, no project checkout (its `.env`), no
  state directory (an App key), no credential files;
- exactly the files `read` names (read-only) and `write` names (read-write, a private scratch
  directory), a fresh /tmp of bounded size, a minimal /dev, and the GPU device nodes named;
  nothing else is writable;
- each directory `hide` names as an empty, read-only directory: what lies under a directory
  mounted whole (the runner package's vendored sample, whose labels a task holds out) is gone;
- an environment built from nothing (`env`), no capabilities, uid 65534;
- at most `tasks` processes and threads at once (RLIMIT_NPROC, set inside: see runner.limits).

Where bubblewrap is missing or cannot create namespaces (a laptop or container that forbids user
namespaces), `available()` says why; the caller then runs unsandboxed, warns loudly and marks the
result unsandboxed. Requirement: the Debian package `bubblewrap` (0.8 or later) and unprivileged
user namespaces (`kernel.unprivileged_userns_clone=1` where that switch exists).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from runner import limits

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/sys")
# Files of /etc that programs read to start (the dynamic linker, user and group names, time zone);
# none holds a secret.
SYSTEM_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/group",
    "/etc/localtime",
    "/etc/hosts",
)
NVIDIA_SHARED_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
TMP_BYTES = 1 << 30
NOBODY = 65534


@dataclass
class Sandbox:
    read: list[Path] = field(default_factory=list)  # visible read-only, at the same path
    write: list[Path] = field(default_factory=list)  # visible read-write, at the same path
    env: dict[str, str] = field(default_factory=dict)  # the whole environment inside
    gpus: list[str] = field(default_factory=list)  # NVIDIA device indexes whose nodes are visible
    cwd: Path | None = None
    hide: list[Path] = field(default_factory=list)  # directories seen empty (and read-only), at their resolved path
    # Processes and threads the sandbox may run at once (RLIMIT_NPROC in its own user namespace,
    # runner.limits); 0: no limit. By default the supervisor's setting.
    tasks: int = field(default_factory=lambda: limits.from_env().tasks)


def python_dirs() -> list[Path]:
    """What running this Python needs: its installation, the virtual environment, the runner package."""
    dirs = {Path(sys.base_prefix), Path(sys.prefix), Path(__file__).resolve().parent}
    executable = Path(sys.executable)
    dirs.add(executable.resolve().parent.parent)
    return sorted(dirs)


def wrap(argv: list[str], sandbox: Sandbox, *, bwrap: str = "bwrap") -> list[str]:
    """The bwrap command that runs `argv` inside `sandbox`."""
    # --as-pid-1: the command is the namespace's first process, so that bwrap's exit status and
    # the kernel's CPU account (wait4) are the command's own, and everything dies with it.
    cmd = [
        bwrap,
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--as-pid-1",
        "--cap-drop",
        "ALL",
        "--uid",
        str(NOBODY),
        "--gid",
        str(NOBODY),
        "--hostname",
        "sandbox",
        "--clearenv",
    ]
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            cmd += ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):
            cmd += ["--ro-bind", path, path]
    for path in SYSTEM_FILES:
        cmd += ["--ro-bind-try", path, path]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--size", str(TMP_BYTES), "--tmpfs", "/tmp"]
    for path in python_dirs():
        cmd += ["--ro-bind", str(path), str(path)]
    for path in sandbox.read:
        cmd += ["--ro-bind", str(path), str(path)]
    for path in sandbox.write:
        cmd += ["--bind", str(path), str(path)]
    for path in sandbox.hide:  # after the mounts above, so that an empty tmpfs lies over what they show
        hidden = str(Path(path).resolve())
        cmd += ["--tmpfs", hidden, "--remount-ro", hidden]
    for index in sandbox.gpus:
        cmd += ["--dev-bind-try", f"/dev/nvidia{index}", f"/dev/nvidia{index}"]
    if sandbox.gpus:
        for node in NVIDIA_SHARED_NODES:
            cmd += ["--dev-bind-try", node, node]
    for name, value in sorted(sandbox.env.items()):
        cmd += ["--setenv", name, value]
    if sandbox.cwd is not None:
        cmd += ["--chdir", str(sandbox.cwd)]
    cmd += ["--remount-ro", "/"]  # the directories made to hold the mounts are not a place to write either
    if sandbox.tasks > 0:  # set inside, once the namespace exists: there it counts the sandbox's tasks only
        argv = limits.nproc_argv(argv, sandbox.tasks)
    return cmd + ["--", *argv]


OFF_SWITCH = "AUTORESEARCH_SANDBOX"  # "off": run unsandboxed even where bubblewrap works


def available() -> tuple[bool, str]:
    """(True, "bubblewrap X") when a sandbox can be made here, else (False, why not).
    AUTORESEARCH_SANDBOX=off says no without looking: the unsandboxed path, on purpose (CI runs
    the demo both ways; a machine whose bubblewrap misbehaves can go on without it)."""
    if os.environ.get(OFF_SWITCH, "").strip().lower() in ("off", "0", "no", "false"):
        return False, f"turned off by {OFF_SWITCH}=off"
    return _probe()


@functools.lru_cache(maxsize=1)
def _probe() -> tuple[bool, str]:
    binary = shutil.which("bwrap")
    if binary is None:
        return False, (
            "bubblewrap is not installed (Debian/Ubuntu: `apt-get install bubblewrap`; "
            "Fedora: `dnf install bubblewrap`)"
        )
    try:
        version = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
        probe = subprocess.run(wrap(["/bin/true"], Sandbox(), bwrap=binary), capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return False, f"bubblewrap could not be run ({error})"
    if probe.returncode != 0:
        why = probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else f"exit code {probe.returncode}"
        return False, (
            f"bubblewrap cannot create namespaces here ({why}); enable unprivileged user "
            "namespaces (sysctl kernel.unprivileged_userns_clone=1, or on Ubuntu 24.04 "
            "kernel.apparmor_restrict_unprivileged_userns=0)"
        )
    return True, version or "bubblewrap"
