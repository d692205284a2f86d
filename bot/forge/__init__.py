"""The forge interface: where experiment branches live and how improvements reach main.

A forge owns the git side of the research loop: reading files at a ref, creating one branch (one
commit) per hypothesis, re-grafting a branch onto a newer main, squash-merging a winner into main
with a compare-and-swap on main, and marking finished experiments closed without deleting them.
`bot.forge.local.LocalForge` implements it over a repository on disk; a GitHub forge will later.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["Forge", "ForgeError", "MainMoved", "MergeConflict"]


class ForgeError(Exception):
    """A forge operation failed (unknown ref, bad path, git refused an update, ...)."""


class MainMoved(ForgeError):
    """Main is not at the expected sha, or the branch is not based on it: rebase and re-measure."""


class MergeConflict(ForgeError):
    """A 3-way merge of a branch's file onto a newer main conflicts."""


@runtime_checkable
class Forge(Protocol):
    """What the conductor needs from a git host. Every mutating call is safe to retry."""

    def main_sha(self) -> str:
        """The sha of main's head."""
        ...

    def read_file(self, ref: str, path: str) -> str:
        """The text of `path` at `ref` (a sha or branch name); FileNotFoundError if absent."""
        ...

    def branch_head(self, branch: str) -> str | None:
        """The head sha of `branch`, or None if there is no such branch."""
        ...

    def create_branch(self, branch: str, base_sha: str, files: dict[str, str], message: str) -> str:
        """Point `branch` at one commit on `base_sha` with `files` (path -> text) written; return it.

        Idempotent: an existing branch whose head already is exactly that (parent `base_sha`, same
        tree) is returned as is; an existing branch that differs is force-moved to a fresh commit.
        Never touches main, HEAD or a working tree.
        """
        ...

    def rebase_branch(self, branch: str, onto_sha: str, path: str) -> str:
        """Re-create `branch` as one commit on `onto_sha` carrying only its change to `path`.

        `path` becomes the 3-way merge of (base: the branch's parent, ours: onto_sha, theirs: the
        branch); everything else is onto_sha's. Keeps the commit message. Raises MergeConflict on a
        conflicting merge. A branch already based on onto_sha is returned unchanged.
        """
        ...

    def merge(self, branch: str, expected_main: str, message: str) -> str:
        """Squash-merge `branch` into main as one commit on `expected_main`; return main's new sha.

        Raises MainMoved if main is not at `expected_main` or the branch is not based on it.
        Idempotent: if main already is a commit with this message on `expected_main`, return it.
        """
        ...

    def close(self, branch: str, label: str) -> None:
        """Mark the experiment on `branch` finished with `label`, keeping the branch. Idempotent."""
        ...

    def closed_label(self, branch: str) -> str | None:
        """The label `branch` was closed with, or None if it is still open."""
        ...

    def list_branches(self, prefix: str = "autoresearch/") -> list[str]:
        """The names of the branches that start with `prefix`."""
        ...
