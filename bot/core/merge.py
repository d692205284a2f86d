"""The 3-way merge of one file, shared by every forge: `git merge-file` on three texts.

Rebasing an experiment onto a newer main re-applies only its change to train.py: the merge of
(base: the branch's parent's text, ours: the new main's, theirs: the branch's). The conductor
merges the same way a proposal answered on a main that has moved since (bot.loop.proposals).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import git

from bot.core.protocols import ForgeError, MergeConflict


def merge_text(base: str, ours: str, theirs: str, *, path: str, branch: str) -> str:
    """The merged text; MergeConflict when the two changes overlap."""
    with tempfile.TemporaryDirectory(prefix="autoresearch-merge-") as tmp:
        names = {}
        for label, text in (("ours", ours), ("base", base), ("theirs", theirs)):
            names[label] = Path(tmp) / label
            names[label].write_bytes(text.encode("utf-8"))
        status, out, err = git.Git(tmp).merge_file(
            "-p",
            "-L",
            "main",
            "-L",
            "base",
            "-L",
            branch,
            str(names["ours"]),
            str(names["base"]),
            str(names["theirs"]),
            with_exceptions=False,
            with_extended_output=True,
            strip_newline_in_stdout=False,
        )
    if status == 0:
        return out
    if 0 < status < 128:
        raise MergeConflict(f"{path} of {branch} conflicts with main ({status} conflict(s))")
    raise ForgeError(f"git merge-file failed on {path} of {branch}: {err}")
