"""The stand-in's repository: a real bare git repository on disk, read and written with git's own
plumbing (hash-object, mktree through a scratch index, commit-tree, update-ref, diff-tree).

Nothing here knows about HTTP or GitHub's JSON; it answers in plain records. Callers hold the
state lock, so each call sees a repository nobody else is changing.

A question about objects named only by full shas (a commit's fields, a tree, a diff between two
commits, their merge base) has one answer forever, since objects never change: the first answer
git gives is kept and given again without asking git (a pull request's payload asks the same ones
several times a request). Anything that names a ref, or an abbreviated sha, asks git every time.
The refs themselves are read once and kept until they move: by set_ref or delete_ref here, or by a
push through git-http-backend, whose caller says so (refs_moved).
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

ZERO = "0" * 40
FULL_SHA = re.compile(r"[0-9a-f]{40}")
_STATUS = {"A": "added", "D": "removed", "M": "modified", "R": "renamed", "C": "copied", "T": "changed"}


def hermetic_env(**extra: str) -> dict[str, str]:
    """The environment for a git process: no GIT_* variables inherited (a test run from inside a
    git hook has GIT_DIR and GIT_INDEX_FILE set) and no user or system config (commit signing,
    default branch names)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    return {**env, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, **extra}


class GitError(Exception):
    """A git command failed; the message carries git's own words."""


@dataclass(frozen=True)
class Person:
    name: str
    email: str
    when: int  # unix seconds (GitHub shows UTC)


@dataclass(frozen=True)
class CommitInfo:
    sha: str
    tree: str
    parents: list[str]
    author: Person
    committer: Person
    message: str


@dataclass(frozen=True)
class TreeEntry:
    mode: str
    type: str
    sha: str
    size: int | None
    path: str


@dataclass(frozen=True)
class FileChange:
    filename: str
    status: str
    sha: str
    additions: int
    deletions: int
    patch: str | None
    previous_filename: str | None = None


def _fixed(*revs: str | None) -> bool:
    """Whether every rev is a full sha (or the "a..b" range of two): what they name never changes."""
    return all(rev is not None and all(FULL_SHA.fullmatch(r) for r in rev.split("..")) for rev in revs)


class BareRepo:
    def __init__(self, path: Path):
        self.path = path
        self._kept: dict[tuple[str, ...], bytes] = {}  # git's answers about full shas, by its arguments
        self._refs: dict[str, str] | None = None  # every ref's sha, as git last listed them

    @classmethod
    def create(cls, path: Path, files: dict[str, str | bytes], branch: str, author: Person) -> BareRepo:
        """A bare repository whose `branch` holds `files` in one first commit (no commit at all
        when `files` is empty, like a repository created without a README)."""
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "init", "-q", "--bare", "-b", branch, str(path)], env=hermetic_env(), check=True)
        repo = cls(path)
        repo.git("config", "http.receivepack", "true")
        if files:
            entries = [
                {
                    "path": p,
                    "mode": "100644",
                    "type": "blob",
                    "sha": repo.write_blob(t.encode() if isinstance(t, str) else t),
                }
                for p, t in files.items()
            ]
            sha = repo.commit(repo.write_tree(None, entries), [], "Initial commit", author, author)
            repo.set_ref(f"refs/heads/{branch}", sha, ZERO)
        return repo

    def git(self, *args: str, input: bytes | None = None, env: dict[str, str] | None = None) -> bytes:
        full_env = hermetic_env(GIT_DIR=str(self.path), **(env or {}))
        done = subprocess.run(["git", *args], input=input, env=full_env, capture_output=True)
        if done.returncode != 0:
            raise GitError(done.stderr.decode(errors="replace").strip() or f"git {args[0]} failed")
        return done.stdout

    def _ask(self, fixed: bool, *args: str) -> bytes:
        """git's answer; when `fixed` (the question names objects only by full sha), asked once and
        then kept (an error, such as an object not there yet, is not kept)."""
        if not fixed:
            return self.git(*args)
        if args not in self._kept:
            self._kept[args] = self.git(*args)
        return self._kept[args]

    def _ok(self, fixed: bool, *args: str) -> bool:
        try:
            self._ask(fixed, *args)
            return True
        except GitError:
            return False

    # objects --------------------------------------------------------------------------------

    def object_type(self, sha: str) -> str | None:
        try:
            return self._ask(_fixed(sha), "cat-file", "-t", sha).decode().strip()
        except GitError:
            return None

    def resolve(self, rev: str) -> str | None:
        """The commit a branch name, tag or (abbreviated) sha names, or None."""
        if not rev or rev.startswith("-"):
            return None
        for candidate in (f"refs/heads/{rev}", f"refs/tags/{rev}", rev):
            try:
                return (
                    self.git("rev-parse", "--verify", "-q", "--end-of-options", f"{candidate}^{{commit}}")
                    .decode()
                    .strip()
                )
            except GitError:
                continue
        return None

    def write_blob(self, data: bytes) -> str:
        return self.git("hash-object", "-w", "--stdin", input=data).decode().strip()

    def read_blob(self, sha: str) -> bytes:
        return self._ask(_fixed(sha), "cat-file", "blob", sha)

    def tree(self, sha: str, recursive: bool = False) -> list[TreeEntry]:
        args = ["ls-tree", "-l", "-z"] + (["-r", "-t"] if recursive else []) + [sha]
        entries = []
        for line in self._ask(_fixed(sha), *args).decode().split("\0"):
            if line:
                meta, path = line.split("\t", 1)
                mode, kind, obj, size = meta.split()
                entries.append(TreeEntry(mode, kind, obj, None if size == "-" else int(size), path))
        return entries

    def entry(self, rev: str, path: str) -> TreeEntry | None:
        """The tree entry at `path` in commit `rev` (the root tree for an empty path)."""
        if not path:
            root = self._ask(_fixed(rev), "rev-parse", f"{rev}^{{tree}}").decode().strip()
            return TreeEntry("040000", "tree", root, None, "")
        out = self._ask(_fixed(rev), "ls-tree", "-l", "-z", rev, "--", path).decode().split("\0")[0]
        if not out:
            return None
        meta, found = out.split("\t", 1)
        mode, kind, obj, size = meta.split()
        return TreeEntry(mode, kind, obj, None if size == "-" else int(size), found) if found == path else None

    def write_tree(self, base: str | None, entries: list[dict]) -> str:
        """A new tree: `base` (or nothing) with `entries` laid over it. An entry is
        {path, mode, type, sha}; sha None deletes the path; nested paths make subtrees."""
        with tempfile.TemporaryDirectory(dir=self.path) as scratch:
            env = {"GIT_INDEX_FILE": str(Path(scratch) / "index")}
            present = []  # a new index file is empty: no need to ask git for it
            if base:
                self.git("read-tree", base, env=env)
                present = [p for p in self.git("ls-files", "-z", env=env).decode().split("\0") if p]
            removals, additions, subtrees = set(), [], []
            for e in entries:
                path = e["path"].strip("/")
                parents = {"/".join(path.split("/")[:i]) for i in range(1, path.count("/") + 1)}
                removals |= {p for p in present if p == path or p.startswith(path + "/") or p in parents}
                if e.get("sha") is None:
                    continue
                if e["type"] == "tree":
                    subtrees.append((path, e["sha"]))
                else:
                    additions.append(f"{e['mode']} {e['sha']}\t{path}")
            lines = [f"0 {ZERO}\t{p}" for p in sorted(removals)] + additions
            if lines:
                self.git("update-index", "--index-info", input=("\n".join(lines) + "\n").encode(), env=env)
            for path, sha in subtrees:
                self.git("read-tree", f"--prefix={path}/", sha, env=env)
            return self.git("write-tree", env=env).decode().strip()

    def commit(self, tree: str, parents: list[str], message: str, author: Person, committer: Person) -> str:
        env = {
            "GIT_AUTHOR_NAME": author.name,
            "GIT_AUTHOR_EMAIL": author.email,
            "GIT_AUTHOR_DATE": f"{author.when} +0000",
            "GIT_COMMITTER_NAME": committer.name,
            "GIT_COMMITTER_EMAIL": committer.email,
            "GIT_COMMITTER_DATE": f"{committer.when} +0000",
        }
        args = ["commit-tree", tree] + [a for p in parents for a in ("-p", p)]
        return self.git(*args, input=message.encode(), env=env).decode().strip()

    def read_commit(self, sha: str) -> CommitInfo:
        raw = self._ask(_fixed(sha), "cat-file", "commit", sha).decode(errors="replace")
        head, _, message = raw.partition("\n\n")
        fields: dict[str, list[str]] = {}
        for line in head.split("\n"):
            if line and not line.startswith(" "):
                key, _, value = line.partition(" ")
                fields.setdefault(key, []).append(value)
        return CommitInfo(
            sha,
            fields["tree"][0],
            fields.get("parent", []),
            _person(fields["author"][0]),
            _person(fields["committer"][0]),
            message,
        )

    # refs -----------------------------------------------------------------------------------

    def refs(self) -> dict[str, str]:
        if self._refs is None:
            out = self.git("for-each-ref", "--format=%(refname) %(objectname)", "refs/").decode()
            self._refs = dict(line.split(" ", 1) for line in out.splitlines() if line)
        return dict(self._refs)

    def refs_moved(self) -> None:
        """Another git process (git-http-backend taking a push) may have moved refs: list them again."""
        self._refs = None

    def set_ref(self, name: str, new: str, old: str) -> None:
        """Move `name` from `old` (ZERO: must not exist yet) to `new`, atomically."""
        try:
            self.git("update-ref", name, new, old)
        finally:
            self._refs = None

    def delete_ref(self, name: str, old: str) -> None:
        try:
            self.git("update-ref", "-d", name, old)
        finally:
            self._refs = None

    # history --------------------------------------------------------------------------------

    def is_ancestor(self, a: str, b: str) -> bool:
        return self._ok(_fixed(a, b), "merge-base", "--is-ancestor", a, b)

    def merge_base(self, a: str, b: str) -> str | None:
        try:
            return self._ask(_fixed(a, b), "merge-base", a, b).decode().strip()
        except GitError:
            return None

    def rev_list(self, *specs: str) -> list[str]:
        """Commits in the range, oldest first."""
        return self._ask(_fixed(*specs), "rev-list", "--reverse", *specs, "--").decode().split()

    def mergeable(self, base: str, head: str) -> bool:
        """Whether head merges into base without conflicts (git merge-tree, no work tree)."""
        return self._ok(_fixed(base, head), "merge-tree", "--write-tree", base, head)

    @functools.cached_property
    def empty_tree(self) -> str:
        return self.git("hash-object", "-t", "tree", "--stdin", input=b"").decode().strip()

    def changes(self, a: str | None, b: str) -> list[FileChange]:
        """Files changed from commit `a` (None: the empty tree) to commit `b`, with line counts
        and the unified-diff hunks GitHub shows as `patch`."""
        old = a or self.empty_tree
        fixed = _fixed(old, b)
        raw = self._ask(fixed, "diff-tree", "-r", "-z", "-M", "--raw", "--numstat", old, b).decode().split("\0")
        metas, counts, i = [], {}, 0
        while i < len(raw) and raw[i]:
            item = raw[i]
            if item.startswith(":"):
                status = item.split()[4][0]
                paths = raw[i + 1 : i + (3 if status in "RC" else 2)]
                old_sha, new_sha = item.split()[2:4]
                metas.append((status, old_sha if status == "D" else new_sha, paths))
                i += 1 + len(paths)
            else:
                added, deleted, path = item.split("\t")
                if not path:  # a rename: old and new names follow
                    path, i = raw[i + 2], i + 2
                counts[path] = (int(added) if added != "-" else 0, int(deleted) if deleted != "-" else 0)
                i += 1
        out = []
        for status, sha, paths in metas:
            name = paths[-1]
            patch = self._ask(fixed, "diff-tree", "-p", "-M", old, b, "--", *paths).decode(errors="replace")
            hunks = patch[patch.find("\n@@") + 1 :] if "\n@@" in patch else None
            plus, minus = counts.get(name, (0, 0))
            out.append(
                FileChange(
                    name,
                    _STATUS.get(status, "modified"),
                    sha,
                    plus,
                    minus,
                    hunks.rstrip("\n") if hunks else None,
                    paths[0] if status in "RC" else None,
                )
            )
        return out


def _person(text: str) -> Person:
    name, _, rest = text.partition(" <")
    email, _, stamp = rest.partition("> ")
    return Person(name, email, int(stamp.split()[0]))
