"""The forge in memory: commits, branches and closed labels held in dicts, no git process.

It keeps the Forge contract (bot.core.protocols) as the local forge does, so the loop cannot tell
them apart (tests/bot/forge/test_contract.py runs the same scenarios on both): a commit is one
snapshot of files on one parent, named by a hash of its parent, files and message; branches and
main are names of commits; main moves only by a compare-and-swap; a rebase re-grafts one file by
the same three-way merge (bot.core.merge). What it leaves out is what only a repository on disk
has: a working tree to keep in step, authors and dates, anything after the process ends.

It is for what must drive the conductor thousands of times (bench/schedule_sim.py: the judge on
the real schedule), where the local forge's git processes would be most of the cost.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from bot.core.merge import merge_text
from bot.core.protocols import ForgeError, MainMoved
from bot.forge.local import BRANCH_PREFIX, _clean_path, _natural_key

__all__ = ["MemoryForge"]

# what git check-ref-format --branch refuses, for names the loop could make
BAD_BRANCH = re.compile(r"(^[-/.]|\.\.|//|@\{|[\x00-\x20~^:?*\[\\\x7f]|[/.]$|\.lock$|/\.)")


@dataclass(frozen=True)
class Commit:
    parent: str | None
    files: dict[str, str]  # path -> text; never changed once made
    message: str


class MemoryForge:
    """A forge whose repository lives in this process. `main_moves` records main's commits in the
    order they became main (the first is the initial commit)."""

    def __init__(self, files: dict[str, str], message: str = "Initial research repository") -> None:
        self.commits: dict[str, Commit] = {}
        self.heads: dict[str, str] = {}  # branch name -> commit sha; "main" included
        self.labels: dict[str, str] = {}  # branch -> the label it was closed with
        self.main_branch = "main"
        root = self._store(Commit(None, {_clean_path(p): t for p, t in files.items()}, message))
        self.heads[self.main_branch] = root
        self.main_moves = [root]

    def _store(self, commit: Commit) -> str:
        body = json.dumps([commit.parent, sorted(commit.files.items()), commit.message])
        sha = hashlib.sha1(body.encode("utf-8")).hexdigest()
        self.commits.setdefault(sha, commit)
        return sha

    def _resolve(self, ref: str) -> str | None:
        name = ref[len("refs/heads/") :] if ref.startswith("refs/heads/") else ref
        if name in self.heads:
            return self.heads[name]
        return ref if ref in self.commits else None

    def _commit(self, ref: str) -> Commit:
        sha = self._resolve(ref)
        if sha is None:
            raise ForgeError(f"unknown ref: {ref!r}")
        return self.commits[sha]

    def _guard_branch(self, branch: str) -> None:
        if branch == self.main_branch:
            raise ForgeError(f"refusing to rewrite {self.main_branch!r} as an experiment branch")
        if not branch or BAD_BRANCH.search(branch):
            raise ForgeError(f"not a valid branch name: {branch!r}")

    # -- reading ---------------------------------------------------------------------------------

    def main_sha(self) -> str:
        return self.heads[self.main_branch]

    def read_file(self, ref: str, path: str) -> str:
        files = self._commit(ref).files
        path = _clean_path(path)
        if path not in files:
            raise FileNotFoundError(f"{path} does not exist at {ref}")
        return files[path]

    def branch_head(self, branch: str) -> str | None:
        return self.heads.get(branch)

    def list_branches(self, prefix: str = BRANCH_PREFIX) -> list[str]:
        return sorted((name for name in self.heads if name.startswith(prefix)), key=_natural_key)

    def parent(self, sha: str) -> str | None:
        """The parent of commit `sha` (None for the first commit)."""
        return self._commit(sha).parent

    # -- experiment branches ---------------------------------------------------------------------

    def create_branch(self, branch: str, base_sha: str, files: dict[str, str], message: str) -> str:
        self._guard_branch(branch)
        base = self._resolve(base_sha)
        if base is None:
            raise ForgeError(f"unknown ref: {base_sha!r}")
        tree = dict(self.commits[base].files)
        tree.update({_clean_path(path): text for path, text in files.items()})
        head = self.heads.get(branch)
        if head is not None and self.commits[head].parent == base and self.commits[head].files == tree:
            return head
        self.heads[branch] = new = self._store(Commit(base, tree, message))
        return new

    def rebase_branch(self, branch: str, onto_sha: str, path: str) -> str:
        self._guard_branch(branch)
        path = _clean_path(path)
        head_sha = self.heads.get(branch)
        if head_sha is None:
            raise ForgeError(f"no such branch: {branch}")
        head, onto = self.commits[head_sha], self._resolve(onto_sha)
        if onto is None:
            raise ForgeError(f"unknown ref: {onto_sha!r}")
        if head.parent is None:
            raise ForgeError(f"{branch} head {head_sha} is not a single-parent commit")
        if head.parent == onto:
            return head_sha
        base, ours = self.commits[head.parent].files, self.commits[onto].files
        merged = merge_text(base.get(path, ""), ours.get(path, ""), head.files.get(path, ""), path=path, branch=branch)
        self.heads[branch] = new = self._store(Commit(onto, {**ours, path: merged}, head.message))
        return new

    # -- main ------------------------------------------------------------------------------------

    def merge(self, branch: str, expected_main: str, message: str, *, measured: str | None = None) -> str:
        expected = self._resolve(expected_main) or expected_main
        current = self.main_sha()
        if current != expected:
            done = self.commits[current]
            if done.parent == expected and done.message.strip() == message.strip():
                return current  # a retry after the merge already happened
            raise MainMoved(f"main is at {current}, not {expected}")
        head_sha = self.heads.get(branch)
        if head_sha is None:
            raise ForgeError(f"no such branch: {branch}")
        if measured is not None and head_sha != measured:
            raise ForgeError(f"{branch} moved to {head_sha[:7]} since {measured[:7]} was measured: not merged")
        head = self.commits[head_sha]
        if head.parent != expected:
            raise MainMoved(f"{branch} is not based on main {expected}: rebase and re-measure")
        self.heads[self.main_branch] = new = self._store(Commit(expected, head.files, message))
        self.main_moves.append(new)
        return new

    # -- closing ---------------------------------------------------------------------------------

    def close(self, branch: str, label: str) -> None:
        if branch not in self.heads:
            raise ForgeError(f"no such branch: {branch}")
        self.labels[branch] = label.strip()

    def closed_label(self, branch: str) -> str | None:
        return self.labels.get(branch)
