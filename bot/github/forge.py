"""The GitHub forge: experiment branches through the Git Data API, main moved by a fast-forward.

Commits are built on GitHub itself (a tree on the base commit's tree with train.py's new text
inline, a commit, a ref), so no token ever reaches a git remote URL, `.git/config` or a log line.
Keeping a change fast-forwards main to the very commit that was measured with a non-forced ref
update: GitHub refuses it (422) when main has moved, which is the compare-and-swap the conductor
needs, and it marks the experiment's pull request merged. Pull requests, check runs, labels and
comments are the publisher's (bot.github.publisher); this module is the git side only.

Every mutating call is safe to repeat: a branch that already is the wanted commit is left alone,
a ref that a lost answer already created is found, a main already at the measured commit is a
merge that happened.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from urllib.parse import quote

from github import GithubException, InputGitTreeElement
from github.Repository import Repository

from bot.forge import ForgeError, MainMoved
from bot.forge.merge import merge_text

__all__ = ["GitHubForge"]

log = logging.getLogger(__name__)

FILE_MODE = "100644"


def _is_sha(ref: str) -> bool:
    return len(ref) == 40 and all(c in "0123456789abcdef" for c in ref)


class GitHubForge:
    """A forge over one GitHub repository (a PyGithub Repository)."""

    def __init__(self, repo: Repository, *, main_branch: str = "main",
                 pace_write: Callable[[], None] = lambda: None) -> None:
        self.repo = repo
        self.main_branch = main_branch
        self.pace_write = pace_write  # called before each request that creates content
        self._files: dict[tuple[str, str], str | None] = {}  # (commit sha, path) -> text; commits never change
        self._main = ""  # main's head as last read, and the ETag of that answer
        self._main_etag: str | None = None

    # -- reading ---------------------------------------------------------------------------------
    def main_sha(self) -> str:
        """Main's head, read with a conditional request: the conductor asks at every tick, and an
        unchanged answer (304) costs nothing against the rate limit."""
        url = f"{self.repo.url}/git/ref/heads/{quote(self.main_branch)}"
        headers = {"If-None-Match": self._main_etag} if self._main_etag else {}
        status, answer_headers, body = self.repo.requester.requestJson("GET", url, headers=headers)
        if status == 304 and self._main:
            return self._main
        if status == 404:
            raise ForgeError(f"the repository {self.repo.full_name} has no {self.main_branch!r} branch")
        if status != 200:
            raise GithubException(status, body, answer_headers)
        self._main = json.loads(body)["object"]["sha"]
        self._main_etag = answer_headers.get("etag")
        return self._main

    def read_file(self, ref: str, path: str) -> str:
        key = (ref, path)
        if key not in self._files:
            try:
                content = self.repo.get_contents(path, ref=ref)
            except GithubException as error:
                if error.status != 404:
                    raise
                text = None
            else:
                if isinstance(content, list) or content.type != "file":
                    raise FileNotFoundError(f"{path} is not a file at {ref}")
                text = content.decoded_content.decode("utf-8")
            if not _is_sha(ref):
                if text is None:
                    raise FileNotFoundError(f"{path} does not exist at {ref}")
                return text
            self._files[key] = text
        text = self._files[key]
        if text is None:
            raise FileNotFoundError(f"{path} does not exist at {ref}")
        return text

    def _read_or_empty(self, sha: str, path: str) -> str:
        try:
            return self.read_file(sha, path)
        except FileNotFoundError:
            return ""

    def branch_head(self, branch: str) -> str | None:
        try:
            return self.repo.get_git_ref(f"heads/{branch}").object.sha
        except GithubException as error:
            if error.status == 404:
                return None
            raise

    def list_branches(self, prefix: str = "autoresearch/") -> list[str]:
        refs = self.repo.get_git_matching_refs(f"heads/{prefix}")
        return sorted(ref.ref.removeprefix("refs/heads/") for ref in refs)

    # -- building commits ------------------------------------------------------------------------
    def _commit_on(self, base_sha: str, files: dict[str, str], message: str) -> tuple[str, str]:
        """A new commit on `base_sha` with `files` written: (commit sha, tree sha)."""
        base = self.repo.get_git_commit(base_sha)
        elements = [InputGitTreeElement(path, FILE_MODE, "blob", content=text) for path, text in files.items()]
        self.pace_write()
        tree = self.repo.create_git_tree(elements, base_tree=base.tree)
        self.pace_write()
        commit = self.repo.create_git_commit(message, tree, [base])
        return commit.sha, tree.sha

    def _point(self, branch: str, sha: str, current: str | None) -> None:
        """Move (or create) `branch` to `sha`, forced: experiment branches are the bot's own."""
        self.pace_write()
        if current is None:
            try:
                self.repo.create_git_ref(f"refs/heads/{branch}", sha)
                return
            except GithubException as error:
                if error.status != 422:  # 422: it exists already (an earlier attempt's answer was lost)
                    raise
        self.repo.get_git_ref(f"heads/{branch}").edit(sha, force=True)

    def _guard_branch(self, branch: str) -> None:
        if branch == self.main_branch or not branch or branch.startswith(("-", "/")) or ".." in branch:
            raise ForgeError(f"not an experiment branch name: {branch!r}")

    def create_branch(self, branch: str, base_sha: str, files: dict[str, str], message: str) -> str:
        self._guard_branch(branch)
        head = self.branch_head(branch)
        if head is not None and self._is_commit_of(head, base_sha, files):
            return head
        sha, _ = self._commit_on(base_sha, files, message)
        self._point(branch, sha, head)
        log.info("pushed %s at %s", branch, sha[:7])
        return sha

    def _is_commit_of(self, head: str, base_sha: str, files: dict[str, str]) -> bool:
        commit = self.repo.get_git_commit(head)
        if [p.sha for p in commit.parents] != [base_sha]:
            return False
        return all(self._read_or_empty(head, path) == text for path, text in files.items())

    def rebase_branch(self, branch: str, onto_sha: str, path: str) -> str:
        self._guard_branch(branch)
        head = self.branch_head(branch)
        if head is None:
            raise ForgeError(f"no such branch: {branch}")
        commit = self.repo.get_git_commit(head)
        if len(commit.parents) != 1:
            raise ForgeError(f"{branch} head {head} is not a single-parent commit")
        parent = commit.parents[0].sha
        if parent == onto_sha:
            return head
        merged = merge_text(self._read_or_empty(parent, path), self._read_or_empty(onto_sha, path),
                            self._read_or_empty(head, path), path=path, branch=branch)
        sha, _ = self._commit_on(onto_sha, {path: merged}, commit.message)
        self._point(branch, sha, head)
        log.info("rebased %s onto %s as %s", branch, onto_sha[:7], sha[:7])
        return sha

    # -- main ------------------------------------------------------------------------------------
    def merge(self, branch: str, expected_main: str, message: str) -> str:
        """Fast-forward main to the branch's head, the measured commit (`message` goes to the pull
        request's comment, not to a commit: the commit that lands is exactly the one measured)."""
        head = self.branch_head(branch)
        if head is None:
            raise ForgeError(f"no such branch: {branch}")
        current = self.main_sha()
        if current == head:
            return head  # an earlier attempt did it; its answer was lost
        if current != expected_main:
            raise MainMoved(f"main is at {current[:7]}, not {expected_main[:7]}")
        parents = [p.sha for p in self.repo.get_git_commit(head).parents]
        if parents != [expected_main]:
            raise MainMoved(f"{branch} is not based on main {expected_main[:7]}: rebase and re-measure")
        self.pace_write()
        try:
            self.repo.get_git_ref(f"heads/{self.main_branch}").edit(head, force=False)
        except GithubException as error:
            if error.status != 422:
                raise
            now = self.main_sha()
            if now == head:
                return head
            raise MainMoved(f"main moved to {now[:7]} while {branch} was being merged") from error
        log.info("main fast-forwarded to %s (%s)", head[:7], branch)
        return head

    # -- closing ---------------------------------------------------------------------------------
    def close(self, branch: str, label: str) -> None:
        """Nothing to do on the git side: the branch stays as the record, and the publisher closes
        the pull request and labels it once the decision is on it."""

    def closed_label(self, branch: str) -> str | None:
        """The autoresearch label of the branch's closed pull request, or None while it is open."""
        owner = self.repo.owner.login
        for pull in self.repo.get_pulls(state="all", head=f"{owner}:{branch}"):
            if pull.state == "closed":
                for label in pull.labels:
                    if label.name.startswith("autoresearch: ") and label.name != "autoresearch: running":
                        return label.name.removeprefix("autoresearch: ")
                return "closed"
        return None
