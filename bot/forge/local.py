"""The local forge: a git repository on disk (bare or with a working tree on main).

It owns how commits are built without touching anyone's checkout (a temporary index and git
plumbing), the compare-and-swap update of main, and how a closed experiment is recorded: an
annotated tag `autoresearch/closed/<branch tail>` on the branch head whose message is the label.
`init_research_repo` creates (or reopens) such a repository.
"""

from __future__ import annotations

import io
import logging
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

import git
from git.exc import GitCommandError
from gitdb.base import IStream

from bot.core.merge import merge_text
from bot.core.protocols import ForgeError, MainMoved

__all__ = ["LocalForge", "init_research_repo", "BOT_NAME", "BOT_EMAIL", "CLOSED_TAG_PREFIX"]

log = logging.getLogger(__name__)

BOT_NAME = "autoresearch-bot"
BOT_EMAIL = "autoresearch-bot@localhost"
BRANCH_PREFIX = "autoresearch/"
CLOSED_TAG_PREFIX = "autoresearch/closed/"
ZERO_SHA = "0" * 40
FILE_MODE = "100644"
FILE_MODES = ("100644", "100755")


def _natural_key(name: str) -> list[int | str]:
    """Sort key that orders autoresearch/2-x before autoresearch/12-y."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _clean_path(path: str) -> str:
    """A repository-relative posix path; refuses absolute paths, '..' and anything inside .git."""
    pure = PurePosixPath(path)
    if not path or pure.is_absolute() or ".." in pure.parts or ".git" in pure.parts:
        raise ForgeError(f"not a repository-relative file path: {path!r}")
    cleaned = str(pure)
    if cleaned in ("", "."):
        raise ForgeError(f"not a repository-relative file path: {path!r}")
    return cleaned


def _configured(repo: git.Repo, key: str) -> str | None:
    """The value git itself sees for a config key (all levels), or None."""
    try:
        value = repo.git.config("--get", key)
    except GitCommandError:
        return None
    return value or None


class LocalForge:
    """A forge over a git repository on disk, via GitPython."""

    def __init__(self, path: Path | str, main_branch: str = "main") -> None:
        try:
            self.repo = git.Repo(Path(path))
        except (git.InvalidGitRepositoryError, git.NoSuchPathError) as exc:
            raise ForgeError(f"not a git repository: {path}") from exc
        self.path = Path(path)
        self.main_branch = main_branch

    # -- reading ---------------------------------------------------------------------------------

    def _resolve(self, ref: str) -> str | None:
        """The commit sha `ref` names, or None."""
        if not ref or ref.startswith("-"):
            return None
        try:
            return self.repo.git.rev_parse("--verify", "--quiet", f"{ref}^{{commit}}")
        except GitCommandError:
            return None

    def _commit(self, ref: str) -> git.Commit:
        sha = self._resolve(ref)
        if sha is None:
            raise ForgeError(f"unknown ref: {ref!r}")
        return self.repo.commit(sha)

    def main_sha(self) -> str:
        sha = self._resolve(f"refs/heads/{self.main_branch}")
        if sha is None:
            raise ForgeError(f"the repository has no {self.main_branch!r} branch")
        return sha

    def read_file(self, ref: str, path: str) -> str:
        commit = self._commit(ref)
        try:
            item = commit.tree / _clean_path(path)
        except KeyError:
            raise FileNotFoundError(f"{path} does not exist at {ref}") from None
        if item.type != "blob":
            raise FileNotFoundError(f"{path} is not a file at {ref}")
        return item.data_stream.read().decode("utf-8")

    def _read_or_empty(self, commit: git.Commit, path: str) -> str:
        try:
            return self.read_file(commit.hexsha, path)
        except FileNotFoundError:
            return ""

    def branch_head(self, branch: str) -> str | None:
        return self._resolve(f"refs/heads/{branch}")

    def list_branches(self, prefix: str = BRANCH_PREFIX) -> list[str]:
        names = [head.name for head in self.repo.heads if head.name.startswith(prefix)]
        return sorted(names, key=_natural_key)

    # -- building commits ------------------------------------------------------------------------

    def _identity_env(self) -> dict[str, str]:
        """Author/committer for plumbing commands: the configured one, else the bot's."""
        env: dict[str, str] = {}
        if _configured(self.repo, "user.name") is None:
            for var in ("GIT_AUTHOR_NAME", "GIT_COMMITTER_NAME"):
                if var not in os.environ:
                    env[var] = BOT_NAME
        if _configured(self.repo, "user.email") is None:
            for var in ("GIT_AUTHOR_EMAIL", "GIT_COMMITTER_EMAIL"):
                if var not in os.environ:
                    env[var] = BOT_EMAIL
        return env

    def _write_blob(self, text: str) -> str:
        data = text.encode("utf-8")
        stored = self.repo.odb.store(IStream("blob", len(data), io.BytesIO(data)))
        hexsha = stored.hexsha
        return hexsha.decode("ascii") if isinstance(hexsha, bytes) else hexsha

    @contextmanager
    def _temp_index(self) -> Iterator[dict[str, str]]:
        """An env whose GIT_INDEX_FILE is a fresh, private index (never the checkout's)."""
        with tempfile.TemporaryDirectory(prefix="autoresearch-index-") as tmp:
            yield {"GIT_INDEX_FILE": str(Path(tmp) / "index")}

    def _tree_with(self, base: git.Commit, files: dict[str, str]) -> str:
        """The sha of base's tree with `files` (path -> text) written into it."""
        with self._temp_index() as env:
            self.repo.git.read_tree(base.hexsha, env=env)
            args: list[str] = ["--add"]
            for raw_path, text in files.items():
                path = _clean_path(raw_path)
                mode = FILE_MODE
                try:
                    existing = base.tree / path
                    if existing.type == "blob" and f"{existing.mode:o}" in FILE_MODES:
                        mode = f"{existing.mode:o}"
                except KeyError:
                    pass
                args += ["--cacheinfo", mode, self._write_blob(text), path]
            try:
                self.repo.git.update_index(*args, env=env)
                return self.repo.git.write_tree(env=env)
            except GitCommandError as exc:
                raise ForgeError(f"cannot write {sorted(files)} onto {base.hexsha}: {exc.stderr}") from exc

    def _commit_tree(
        self, tree: str, parent: str, message: str, author: git.Actor | None = None, author_date: str | None = None
    ) -> str:
        env = self._identity_env()
        if author is not None:
            env["GIT_AUTHOR_NAME"] = author.name or BOT_NAME
            env["GIT_AUTHOR_EMAIL"] = author.email or BOT_EMAIL
        if author_date is not None:
            env["GIT_AUTHOR_DATE"] = author_date
        return self.repo.git.commit_tree(tree, "-p", parent, "--no-gpg-sign", "-m", message, env=env)

    def _update_ref(self, ref: str, new: str, old: str, reason: str) -> None:
        """Compare-and-swap `ref` from `old` (ZERO_SHA: must not exist) to `new`."""
        self.repo.git.update_ref("-m", f"autoresearch: {reason}", ref, new, old)

    def _guard_branch(self, branch: str) -> None:
        if branch == self.main_branch:
            raise ForgeError(f"refusing to rewrite {self.main_branch!r} as an experiment branch")
        if not self.repo.bare and not self.repo.head.is_detached:
            if self.repo.head.ref.path == f"refs/heads/{branch}":
                raise ForgeError(f"refusing to rewrite the checked-out branch {branch!r}")
        try:
            self.repo.git.check_ref_format("--branch", branch)
        except GitCommandError as exc:
            raise ForgeError(f"not a valid branch name: {branch!r}") from exc

    # -- experiment branches ---------------------------------------------------------------------

    def create_branch(self, branch: str, base_sha: str, files: dict[str, str], message: str) -> str:
        self._guard_branch(branch)
        base = self._commit(base_sha)
        tree = self._tree_with(base, files)
        head = self.branch_head(branch)
        if head is not None:
            current = self.repo.commit(head)
            if [p.hexsha for p in current.parents] == [base.hexsha] and current.tree.hexsha == tree:
                return head
        new = self._commit_tree(tree, base.hexsha, message)
        try:
            self._update_ref(f"refs/heads/{branch}", new, head or ZERO_SHA, f"create {branch}")
        except GitCommandError as exc:
            raise ForgeError(f"{branch} changed while it was being written: {exc.stderr}") from exc
        return new

    def rebase_branch(self, branch: str, onto_sha: str, path: str) -> str:
        self._guard_branch(branch)
        path = _clean_path(path)
        head_sha = self.branch_head(branch)
        if head_sha is None:
            raise ForgeError(f"no such branch: {branch}")
        head = self.repo.commit(head_sha)
        onto = self._commit(onto_sha)
        if len(head.parents) != 1:
            raise ForgeError(f"{branch} head {head_sha} is not a single-parent commit")
        parent = head.parents[0]
        if parent.hexsha == onto.hexsha:
            return head_sha
        base_text = self._read_or_empty(parent, path)
        ours_text = self._read_or_empty(onto, path)
        theirs_text = self._read_or_empty(head, path)
        merged = merge_text(base_text, ours_text, theirs_text, path=path, branch=branch)
        tree = self._tree_with(onto, {path: merged})
        new = self._commit_tree(
            tree,
            onto.hexsha,
            head.message.rstrip("\n"),
            author=head.author,
            author_date=f"{head.authored_date} {_tz_offset(head.author_tz_offset)}",
        )
        try:
            self._update_ref(f"refs/heads/{branch}", new, head_sha, f"rebase {branch} onto {onto.hexsha}")
        except GitCommandError as exc:
            raise ForgeError(f"{branch} changed while it was being rebased: {exc.stderr}") from exc
        return new

    # -- main ------------------------------------------------------------------------------------

    def merge(self, branch: str, expected_main: str, message: str, *, measured: str | None = None) -> str:
        main_ref = f"refs/heads/{self.main_branch}"
        expected = self._resolve(expected_main) or expected_main
        current = self.main_sha()
        if current != expected:
            done = self.repo.commit(current)
            if [p.hexsha for p in done.parents] == [expected] and done.message.strip() == message.strip():
                return current  # a retry after the merge already happened
            raise MainMoved(f"main is at {current}, not {expected}")
        head_sha = self.branch_head(branch)
        if head_sha is None:
            raise ForgeError(f"no such branch: {branch}")
        if measured is not None and head_sha != measured:
            raise ForgeError(f"{branch} moved to {head_sha[:7]} since {measured[:7]} was measured: not merged")
        head = self.repo.commit(head_sha)
        if [p.hexsha for p in head.parents] != [expected]:
            raise MainMoved(f"{branch} is not based on main {expected}: rebase and re-measure")
        new = self._commit_tree(head.tree.hexsha, expected, message)
        try:
            self._update_ref(main_ref, new, expected, f"squash-merge {branch}")
        except GitCommandError as exc:
            if self.main_sha() != expected:
                raise MainMoved(f"main moved while merging {branch}") from exc
            raise ForgeError(f"cannot update {self.main_branch}: {exc.stderr}") from exc
        self._sync_checkout(expected, new)
        return new

    def _sync_checkout(self, old: str, new: str) -> None:
        """If main is checked out, carry its index and working tree from `old` to `new`.

        A two-tree `read-tree -u -m` only touches paths that differ between the two commits and
        refuses (leaving everything as it was) rather than overwrite local edits or untracked files.
        """
        repo = self.repo
        if repo.bare or repo.head.is_detached:
            return
        if repo.head.ref.path != f"refs/heads/{self.main_branch}":
            return
        try:
            repo.git.read_tree("-u", "-m", old, new)
        except GitCommandError as exc:
            log.warning(
                "main moved to %s but the checkout at %s was left as is: %s", new, repo.working_tree_dir, exc.stderr
            )

    # -- closing ---------------------------------------------------------------------------------

    @staticmethod
    def _closed_tag(branch: str) -> str:
        tail = branch[len(BRANCH_PREFIX) :] if branch.startswith(BRANCH_PREFIX) else branch
        return f"refs/tags/{CLOSED_TAG_PREFIX}{tail}"

    def close(self, branch: str, label: str) -> None:
        head = self.branch_head(branch)
        if head is None:
            raise ForgeError(f"no such branch: {branch}")
        tag_ref = self._closed_tag(branch)
        tag = git.TagReference(self.repo, tag_ref)
        if tag.is_valid() and tag.tag is not None:
            if tag.commit.hexsha == head and tag.tag.message.strip() == label.strip():
                return
        # The tagger is the committer identity, so the same fallback applies.
        self.repo.git.tag(
            "-a", "-f", "--no-sign", "-m", label, tag_ref[len("refs/tags/") :], head, env=self._identity_env()
        )

    def closed_label(self, branch: str) -> str | None:
        tag = git.TagReference(self.repo, self._closed_tag(branch))
        if not tag.is_valid() or tag.tag is None:
            return None
        return tag.tag.message.strip()


def _tz_offset(seconds_west: int) -> str:
    """GitPython's tz offset (seconds west of UTC) as git's +HHMM."""
    east = -seconds_west
    sign = "+" if east >= 0 else "-"
    east = abs(east)
    return f"{sign}{east // 3600:02d}{(east % 3600) // 60:02d}"


def init_research_repo(path: Path, files: dict[str, str], message: str = "Initial research repository") -> LocalForge:
    """Create (or reopen) a research repository at `path` whose `main` holds `files`.

    Idempotent: an existing repository is opened, not re-initialised; a repository that has no
    main commit yet (an interrupted earlier call) gets its first commit.
    """
    path = Path(path)
    try:
        repo = git.Repo(path)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        path.mkdir(parents=True, exist_ok=True)
        repo = git.Repo.init(path, initial_branch="main")
    missing = {
        key: value
        for key, value in (("name", BOT_NAME), ("email", BOT_EMAIL))
        if _configured(repo, f"user.{key}") is None
    }
    if missing:
        with repo.config_writer("repository") as config:
            for key, value in missing.items():
                config.set_value("user", key, value)
    forge = LocalForge(path)
    if forge._resolve("refs/heads/main") is None:
        if repo.bare:
            raise ForgeError(f"{path} is a bare repository without a main branch")
        if repo.head.is_valid():
            raise ForgeError(f"{path} has commits but no main branch")
        repo.git.symbolic_ref("HEAD", "refs/heads/main")
        written = []
        for raw_path, text in files.items():
            rel = _clean_path(raw_path)
            target = path / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(text.encode("utf-8"))
            written.append(rel)
        if written:
            repo.git.add("--", *written)
        repo.git.commit("--no-verify", "--no-gpg-sign", "--allow-empty", "-m", message)
    return forge
