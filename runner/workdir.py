"""A process that waits in a directory which may be renamed before its job comes.

A warm worker's processes start in the worker's directory, and the local runner renames that
directory to the run's when the job arrives. A sandboxed process sees its bind mounts at the old
path and notices nothing; an unsandboxed one sees the rename. What it was told as relative paths
(its command line's) resolve against its working directory, which follows the directory itself;
what it was told as absolute paths in its environment (HOME, TMPDIR, and the caches torch writes
there, whose absolute paths torch's inductor puts in the environment the first time it asks for
them, which importing it may do) does not. `follow(before)`, called once the job has come, moves
those to the directory's new name: one left behind would make the process recreate the old
directory and leave it behind its run.
"""

from __future__ import annotations

import os
import tempfile

FOLLOWED = ("HOME", "TMPDIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def follow(before: str) -> str:
    """The working directory's path now; environment paths under `before` are moved under it."""
    here = os.getcwd()
    if here == before:
        return here
    for name in FOLLOWED:
        value = os.environ.get(name, "")
        if value == before or value.startswith(before + os.sep):
            os.environ[name] = here + value[len(before) :]
    tempfile.tempdir = None  # tempfile caches TMPDIR on first use
    return here
