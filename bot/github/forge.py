"""The GitHub forge: experiment branches through the REST API, main moved by a fast-forward.

Commits are made on GitHub itself, so no token ever reaches a git remote URL, `.git/config` or a
log line. A new experiment branch costs two writes: its ref created at the base commit, then one
PUT of train.py on it (each charged to the write budget as the research's, never waited for:
bot.github.budget) (the contents API makes the commit, with the given message, by the caller).
A rebase (or a change of more than one file) builds the commit with the Git Data API instead
(a tree on the base commit's tree, a commit, one ref update): a branch whose pull request is open
must never point at main's commit, even for a moment, or GitHub would mark that pull request
merged. Keeping a change fast-forwards main to the very commit that was measured with a
non-forced ref update: GitHub refuses it (422) when main has moved, which is the compare-and-swap
the conductor needs, and it marks the experiment's pull request merged. Pull requests, check runs,
labels and comments are the publisher's (bot.github.publisher); this module is the git side only.

Every mutating call is safe to repeat: a branch that already is the wanted commit is left alone,
a ref that a lost answer already created is found, a branch left at its base (its PUT never made,
or made and its answer lost: then GitHub refuses a second one, 409, and the branch is read again)
gets its commit, a main already at the measured commit is a merge that happened.

Commits never change, so what the forge learns of one (its tree and parents, a file's text and
blob sha, from a read or from creating it) is kept for the life of the process: a branch on a main
that an earlier branch was built on, or on a kept commit the bot made, needs no read of its base,
and a merge no read of the measured commit. Refs are moved with one PATCH, never a read first, and
a branch this forge moved is rebased from where it moved it, without reading the ref: a rebase is
then its three writes alone (a tree, a commit, the ref), which matters in the wave of rebases that
follows a keep with many experiments in flight (see `rebase_branch` for when it reads anyway).

A new branch needs no read of its own either: the first branch made under a prefix
(`autoresearch/`) lists the prefix's branches once, and a branch absent from that list that this
process has never tried to create does not exist (the bot's branch names carry the experiment's
id). A branch whose creation was tried, answered or not, is read before anything is built on it,
which is what keeps a retry from making a second commit.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from github import GithubException
from github.Repository import Repository

from bot.core.merge import merge_text
from bot.core.protocols import ForgeError, MainMoved

__all__ = ["GitHubForge"]

log = logging.getLogger(__name__)

FILE_MODE = "100644"


def _is_sha(ref: str) -> bool:
    return len(ref) == 40 and all(c in "0123456789abcdef" for c in ref)


class GitHubForge:
    """A forge over one GitHub repository (a PyGithub Repository)."""

    def __init__(
        self,
        repo: Repository,
        *,
        main_branch: str = "main",
        pace_write: Callable[[str], None] = lambda what: None,
    ) -> None:
        self.repo = repo
        self.main_branch = main_branch
        self.pace_write = pace_write  # called before each request that creates content, with what it makes
        self._files: dict[tuple[str, str], str | None] = {}  # (commit sha, path) -> text; commits never change
        self._blobs: dict[tuple[str, str], str] = {}  # (commit sha, path) -> the file's blob sha
        self._commits: dict[str, tuple[str, list[str], str]] = {}  # commit sha -> (tree sha, parent shas, message)
        self._listed: dict[str, set[str]] = {}  # prefix -> its branches when first listed (this process)
        self._tried: set[str] = set()  # branches this process tried to create or move
        self._heads: dict[str, str] = {}  # branch -> the commit this process last moved it to (answered)
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
                if _is_sha(ref):
                    self._blobs[key] = content.sha
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
    def _commit(self, sha: str) -> tuple[str, list[str], str]:
        """(tree sha, parent shas, message) of a commit, read once."""
        if sha not in self._commits:
            commit = self.repo.get_git_commit(sha)
            self._commits[sha] = (commit.tree.sha, [p.sha for p in commit.parents], commit.message)
        return self._commits[sha]

    def _commit_on(self, base_sha: str, files: dict[str, str], message: str) -> tuple[str, str]:
        """A new commit on `base_sha` with `files` written: (commit sha, tree sha)."""
        base_tree = self._commit(base_sha)[0]
        tree = [{"path": path, "mode": FILE_MODE, "type": "blob", "content": text} for path, text in files.items()]
        self.pace_write("tree")
        tree_sha = self._api("POST", "/git/trees", {"base_tree": base_tree, "tree": tree})["sha"]
        self.pace_write("commit")
        sha = self._api("POST", "/git/commits", {"message": message, "tree": tree_sha, "parents": [base_sha]})["sha"]
        self._commits[sha] = (tree_sha, [base_sha], message)
        return sha, tree_sha

    def _api(self, method: str, path: str, body: dict[str, Any]) -> Any:
        return self.repo.requester.requestJsonAndCheck(method, f"{self.repo.url}{path}", input=body)[1]

    def _move(self, branch: str, sha: str, *, force: bool) -> None:
        """One PATCH of the branch's ref (GitHub refuses a non-forced one that is no fast-forward: 422)."""
        self._api("PATCH", f"/git/refs/heads/{quote(branch)}", {"sha": sha, "force": force})

    def _point(self, branch: str, sha: str, current: str | None) -> None:
        """Move (or create) `branch` to `sha`, forced: experiment branches are the bot's own."""
        self._tried.add(branch)
        self.pace_write("branch" if current is None else "ref")
        if current is None:
            try:
                self._api("POST", "/git/refs", {"ref": f"refs/heads/{branch}", "sha": sha})
                self._heads[branch] = sha
                return
            except GithubException as error:
                if error.status != 422:  # 422: it exists already (an earlier attempt's answer was lost)
                    raise
        self._move(branch, sha, force=True)
        self._heads[branch] = sha

    def _guard_branch(self, branch: str) -> None:
        if branch == self.main_branch or not branch or branch.startswith(("-", "/")) or ".." in branch:
            raise ForgeError(f"not an experiment branch name: {branch!r}")

    def _surely_absent(self, branch: str) -> bool:
        """True when `branch` cannot exist: not in its prefix's listing, never tried since."""
        prefix = branch.split("/")[0] + "/" if "/" in branch else ""
        if not prefix or branch in self._tried:
            return False
        if prefix not in self._listed:
            self._listed[prefix] = set(self.list_branches(prefix))
        return branch not in self._listed[prefix]

    def create_branch(self, branch: str, base_sha: str, files: dict[str, str], message: str) -> str:
        self._guard_branch(branch)
        head = None if self._surely_absent(branch) else self.branch_head(branch)
        one_file = len(files) == 1
        if head is None and one_file:
            head = self._create_ref(branch, base_sha)
        if head not in (None, base_sha) and self._is_commit_of(head, base_sha, files):
            self._heads[branch] = head
            return head
        sha = self._put_file(branch, base_sha, files, message) if head == base_sha and one_file else None
        if sha is None:  # more than one file, or the branch is elsewhere (an older attempt on an older main)
            sha, _ = self._commit_on(base_sha, files, message)
            self._point(branch, sha, head)
        self._heads[branch] = sha
        self._remember(sha, base_sha, files)
        log.info("pushed %s at %s", branch, sha[:7])
        return sha

    def _remember(self, sha: str, base_sha: str, files: dict[str, str]) -> None:
        """The files of a commit this forge made on `base_sha` with `files` written: those, and every
        other file read at the base (its tree is the base's but for them). A keep fast-forwards main
        to such a commit, and the tick that merged reads main's train.py and program.md at once, while
        the slots the keep freed wait for main's new runs: known, they cost no request. The other
        files are the base's only where the commit's one parent is the base (a PUT commits on the
        branch's head as it is then, which someone may have moved)."""
        parents = self._commits[sha][1] if sha in self._commits else None
        for (ref, path), text in list(self._files.items()) if parents == [base_sha] else ():
            if ref == base_sha and path not in files:
                self._files[(sha, path)] = text
                if (ref, path) in self._blobs:
                    self._blobs[(sha, path)] = self._blobs[(ref, path)]
        for path, text in files.items():
            self._files[(sha, path)] = text
            self._blobs[(sha, path)] = git_blob_sha(text)

    def _create_ref(self, branch: str, sha: str) -> str | None:
        """Create `branch` at `sha`; where it is when it existed already (an earlier attempt's answer
        was lost: 422), None if it is gone again."""
        self._tried.add(branch)
        self.pace_write("branch")
        try:
            self._api("POST", "/git/refs", {"ref": f"refs/heads/{branch}", "sha": sha})
        except GithubException as error:
            if error.status != 422:
                raise
            return self.branch_head(branch)
        return sha

    def _put_file(self, branch: str, base_sha: str, files: dict[str, str], message: str) -> str | None:
        """The branch's one commit, made by PUT contents on the branch standing at its base: the
        file's blob sha at the base is the compare-and-swap (GitHub answers 409 once the file on the
        branch is another). After a 409 the branch is read again: a commit of this very change (the
        answer to an earlier PUT was lost, and the client sent it again) is the result; None when it
        is something else."""
        [(path, text)] = files.items()
        fields = {
            "message": message,
            "content": base64.b64encode(text.encode("utf-8")).decode("ascii"),
            "branch": branch,
        }
        blob = self._blob(base_sha, path)
        if blob is not None:
            fields["sha"] = blob
        self.pace_write("commit")
        try:
            answer = self._api("PUT", f"/contents/{quote(path)}", fields)
        except GithubException as error:
            if error.status not in (409, 422):  # 422: a new file's repeat ("sha" wasn't supplied)
                raise
            head = self.branch_head(branch)
            if head is not None and head != base_sha and self._is_commit_of(head, base_sha, files):
                return head
            if error.status == 422:
                raise
            return None
        commit = answer["commit"]
        sha = commit["sha"]
        self._commits[sha] = (commit["tree"]["sha"], [p["sha"] for p in commit["parents"]], commit["message"])
        self._files[(sha, path)] = text
        self._blobs[(sha, path)] = answer["content"]["sha"]
        return sha

    def _blob(self, sha: str, path: str) -> str | None:
        """The blob sha of `path` at commit `sha` (None: no such file), from the read that the
        conductor's own reading of the base already made, else one read now."""
        if (sha, path) not in self._blobs:
            if self._files.get((sha, path)) is not None:  # its text alone is known: read it for the blob
                del self._files[(sha, path)]
            try:
                self.read_file(sha, path)
            except FileNotFoundError:
                return None
        return self._blobs.get((sha, path))

    def _is_commit_of(self, head: str, base_sha: str, files: dict[str, str]) -> bool:
        if self._commit(head)[1] != [base_sha]:
            return False
        return all(self._read_or_empty(head, path) == text for path, text in files.items())

    def rebase_branch(self, branch: str, onto_sha: str, path: str) -> str:
        """The rebase (the protocol's). The branch's head is read only when this forge did not move
        it itself: the bot's branches are its own, and a rebase after a keep is one of many. A head
        so remembered is never the answer without a read: where it already stands on `onto_sha`
        (nothing to do, by what this forge knows), the ref is read, since another forge of the
        process (the conductor's, following main) or a person may have moved it since; and a
        rebase from a remembered head that is no longer the branch's makes the same text, forced
        over whatever is there (the branch is the bot's)."""
        self._guard_branch(branch)
        known = self._heads.get(branch)
        head = known or self.branch_head(branch)
        if head is None:
            raise ForgeError(f"no such branch: {branch}")
        _, parents, message = self._commit(head)
        if len(parents) != 1:
            raise ForgeError(f"{branch} head {head} is not a single-parent commit")
        parent = parents[0]
        if parent == onto_sha:
            if known is not None:
                del self._heads[branch]
                return self.rebase_branch(branch, onto_sha, path)  # read, then decide
            return head
        merged = merge_text(
            self._read_or_empty(parent, path),
            self._read_or_empty(onto_sha, path),
            self._read_or_empty(head, path),
            path=path,
            branch=branch,
        )
        sha, _ = self._commit_on(onto_sha, {path: merged}, message)
        # the re-measure reads it next, and a keep's branch is the next proposals' base (whose
        # compare-and-swap needs its blob sha): both known, no read
        self._remember(sha, onto_sha, {path: merged})
        try:
            self._point(branch, sha, head)
        except GithubException as error:
            if known is None or error.status != 422:
                raise
            self._heads.pop(branch, None)  # deleted by hand since this process moved it
            if self.branch_head(branch) is None:
                raise ForgeError(f"no such branch: {branch}") from error
            raise
        log.info("rebased %s onto %s as %s", branch, onto_sha[:7], sha[:7])
        return sha

    # -- main ------------------------------------------------------------------------------------
    def merge(self, branch: str, expected_main: str, message: str, *, measured: str | None = None) -> str:
        """Fast-forward main to the branch's head, the measured commit (`message` goes to the pull
        request's comment, not to a commit: the commit that lands is exactly the one measured)."""
        head = self.branch_head(branch)
        if head is None:
            raise ForgeError(f"no such branch: {branch}")
        current = self.main_sha()
        if current == head:
            return head  # an earlier attempt did it; its answer was lost
        if measured is not None and head != measured:
            raise ForgeError(f"{branch} moved to {head[:7]} since {measured[:7]} was measured: not merged")
        if current != expected_main:
            raise MainMoved(f"main is at {current[:7]}, not {expected_main[:7]}")
        if self._commit(head)[1] != [expected_main]:
            raise MainMoved(f"{branch} is not based on main {expected_main[:7]}: rebase and re-measure")
        self.pace_write("merge")
        try:
            self._move(self.main_branch, head, force=False)
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
                    # "autoresearch: running": put on pull requests by older versions of the bot
                    if label.name.startswith("autoresearch: ") and label.name != "autoresearch: running":
                        return label.name.removeprefix("autoresearch: ")
                return "closed"
        return None


def git_blob_sha(text: str) -> str:
    """The id git (and so GitHub) gives a file of this text: SHA-1 of its header and bytes."""
    data = text.encode("utf-8")
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()
