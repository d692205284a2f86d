"""The stand-in's world and GitHub's rules over it: refs (through the bare repository), pull
requests, issues, comments, reactions, labels, reviews, check runs and statuses.

Every change goes through a method here, under one lock, and announces itself the way GitHub
would (a webhook body handed to `sink`). The rule that matters most to the bot lives in
`_refs_changed`: a pull request whose head becomes reachable from its base branch is merged,
whoever moved the branch and however (API ref update or git push).

Issues that are not pull requests share the pull requests' numbers, as on GitHub. Their own
changes announce nothing (the App is not subscribed to `issues` events, server.APP_EVENTS); comments
on them are kept and announced like a pull request's (issue_comment, whose `issue` has no
`pull_request`); labels and reviews on them are not served yet (those routes take pull request
numbers only).

Each close, reopen and merge of a pull request or an issue is recorded with who did it
(`issue_events`), as GitHub's issue events API lists them: a merge records `merged` then `closed`,
both by whoever moved the ref.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import checks, events
from .errors import ApiError, invalid, not_found, unprocessable
from .gitrepo import ZERO, BareRepo, Person
from .model import CheckRun, Comment, Issue, IssueEvent, Label, Pull, Reaction, Review, Status

STATUS_DESCRIPTION_LIMIT = 140
COMMENT_LIMIT = 65536
ISSUE_BODY_LIMIT = 65536
PUSH_ROLES = ("admin", "maintain", "write")
REVIEW_STATES = ("APPROVED", "CHANGES_REQUESTED", "COMMENTED")


class Clock:
    """Wall time plus an offset the tests can advance (token expiry, rate-limit windows)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


class State:
    def __init__(
        self,
        root: Path,
        owner: str,
        name: str,
        files: dict[str, str | bytes],
        *,
        collaborators: dict[str, str],
        members: set[str],
        private: bool,
        owner_type: str,
    ):
        self.lock = threading.RLock()
        self.clock = Clock()
        self.owner, self.name, self.default_branch = owner, name, "main"
        self.collaborators, self.members, self.private, self.owner_type = collaborators, members, private, owner_type
        self.git_root = root / "git"
        self.repo = BareRepo.create(
            self.git_root / owner / f"{name}.git",
            files,
            "main",
            Person(owner, f"{owner}@users.noreply.github.com", int(self.clock())),
        )
        self.created_at = self.pushed_at = self.clock()
        self.repo_id = 424_242
        self.base_url = ""  # http://127.0.0.1:PORT, known once the server listens
        self.app: dict[str, Any] | None = None  # the GitHub App (slug, id, installation_id), when configured
        self.sink: Callable[[str, dict[str, Any]], None] = lambda event, body: None
        self.pulls: dict[int, Pull] = {}
        self.issues: dict[int, Issue] = {}  # issues that are not pull requests, by number
        self.deleted_issues: set[int] = set()  # GitHub answers 410 Gone for these
        self.comments: dict[int, Comment] = {}
        self.issue_events: dict[int, IssueEvent] = {}  # closed, reopened, merged: by id, oldest first
        self.reactions: dict[int, Reaction] = {}
        self.reviews: dict[int, Review] = {}
        self.labels: dict[str, Label] = {}  # by lower-cased name: GitHub's names are case-insensitive
        self.check_runs: dict[int, CheckRun] = {}
        self.suites: dict[str, int] = {}  # head_sha -> check suite id
        self.statuses: list[Status] = []
        self._user_ids: dict[str, int] = {owner: 9000}
        self._ids = {
            kind: itertools.count(start)
            for kind, start in [
                ("pull", 5_000_001),
                ("comment", 7_000_001),
                ("reaction", 3_000_001),
                ("review", 8_000_001),
                ("label", 4_000_001),
                ("check", 6_000_001),
                ("suite", 2_000_001),
                ("status", 1_000_001),
                ("user", 100),
                ("issue", 97_000_001),
                ("event", 11_000_001),
            ]
        }
        self._numbers = itertools.count(1)

    # people ---------------------------------------------------------------------------------

    def user_id(self, login: str) -> int:
        with self.lock:
            if login not in self._user_ids:
                self._user_ids[login] = next(self._ids["user"])
            return self._user_ids[login]

    def user_type(self, login: str) -> str:
        if login.endswith("[bot]"):
            return "Bot"
        return self.owner_type if login == self.owner else "User"

    def permission(self, login: str) -> str:
        """The role GitHub reports for `login` (admin, maintain, write, triage, read or none)."""
        if login == self.owner:
            return "admin"
        return self.collaborators.get(login, "read" if not self.private or login in self.members else "none")

    def association(self, login: str) -> str:
        if login == self.owner:
            return "OWNER"
        if login in self.members:
            return "MEMBER"
        if login in self.collaborators:
            return "COLLABORATOR"
        if any(p.merged and p.user == login for p in self.pulls.values()):
            return "CONTRIBUTOR"
        return "NONE"

    def _emit(self, event: str, body: dict[str, Any]) -> None:
        self.sink(event, body)

    def _next(self, kind: str) -> int:
        return next(self._ids[kind])

    def _record(
        self, number: int, actor: str, event: str, *, commit_id: str | None = None, state_reason: str | None = None
    ) -> None:
        """One entry of the issue events list of `number` (a pull request's or an issue's)."""
        entry = IssueEvent(self._next("event"), number, actor, event, self.clock(), commit_id, state_reason)
        self.issue_events[entry.id] = entry

    # refs -----------------------------------------------------------------------------------

    def refs(self) -> dict[str, str]:
        with self.lock:
            return self.repo.refs()

    def create_ref(self, ref: str, sha: str, actor: str) -> None:
        with self.lock:
            if not ref.startswith("refs/") or ref.count("/") < 2:
                raise unprocessable("Reference name must start with 'refs/' and have at least two slashes.")
            self._require_target(ref, sha)
            if ref in self.repo.refs():
                raise unprocessable("Reference already exists")
            self.repo.set_ref(ref, sha, ZERO)
            self._refs_changed([(ref, ZERO, sha)], actor)

    def update_ref(self, ref: str, sha: str, force: bool, actor: str) -> None:
        with self.lock:
            old = self.repo.refs().get(ref)
            if old is None:
                raise unprocessable("Reference does not exist")
            self._require_target(ref, sha)
            if not force and not self.repo.is_ancestor(old, sha):
                raise unprocessable("Update is not a fast forward")
            if sha == old:
                return  # nothing moved, nothing to announce
            self.repo.set_ref(ref, sha, old)
            self._refs_changed([(ref, old, sha)], actor)

    def delete_ref(self, ref: str, actor: str) -> None:
        with self.lock:
            old = self.repo.refs().get(ref)
            if old is None:
                raise unprocessable("Reference does not exist")
            self.repo.delete_ref(ref, old)
            self._refs_changed([(ref, old, ZERO)], actor)

    def put_file(
        self,
        branch: str,
        path: str,
        data: bytes,
        sha: str | None,
        message: str,
        author: Person,
        committer: Person,
        actor: str,
    ) -> tuple[str, str, bool]:
        """PUT contents: one commit on `branch` writing `path`, the branch moved to it; (commit sha,
        blob sha, created). GitHub's order, as measured: a missing branch is 404 before anything
        else; an existing file needs `sha`, its current blob (absent: 422, another: 409); for a new
        file `sha` is ignored. The mode of an existing file is kept."""
        with self.lock:
            ref = f"refs/heads/{branch}"
            refs = self.repo.refs()
            head = refs.get(ref)
            if head is None and (refs or branch != self.default_branch):
                raise ApiError(404, f"Branch {branch} not found")
            entry = self.repo.entry(head, path) if head else None
            if entry is not None and entry.type != "blob":
                raise unprocessable(f"{path} is a directory")  # GitHub: no file at a directory's path
            if entry is not None and not sha:
                raise ApiError(422, 'Invalid request.\n\n"sha" wasn\'t supplied.')
            if entry is not None and sha != entry.sha:
                raise ApiError(409, f"{path} does not match {sha}")
            blob = self.repo.write_blob(data)
            base_tree = self.repo.read_commit(head).tree if head else None
            tree = self.repo.write_tree(
                base_tree, [{"path": path, "mode": entry.mode if entry else "100644", "type": "blob", "sha": blob}]
            )
            commit = self.repo.commit(tree, [head] if head else [], message, author, committer)
            self.repo.set_ref(ref, commit, head or ZERO)  # compare-and-swap: under the lock, nobody moved it
            self._refs_changed([(ref, head or ZERO, commit)], actor)
            return commit, blob, entry is None

    def _require_target(self, ref: str, sha: str) -> None:
        kind = self.repo.object_type(sha) if len(sha) == 40 else None
        if kind is None:
            raise unprocessable("Object does not exist")
        if ref.startswith("refs/heads/") and kind != "commit":
            raise unprocessable("Object is not a commit")

    def pushed(self, before: dict[str, str], actor: str) -> None:
        """Refs moved by `git push` (git-http-backend already wrote them): announce like the API."""
        with self.lock:
            after = self.repo.refs()
            changes = [
                (r, before.get(r, ZERO), after.get(r, ZERO))
                for r in sorted(set(before) | set(after))
                if before.get(r) != after.get(r)
            ]
            self._refs_changed(changes, actor)

    def _refs_changed(self, changes: list[tuple[str, str, str]], actor: str) -> None:
        """After refs moved: a push event per ref, then for each open pull request a deleted head
        closes it, a moved head synchronizes it, and a head reachable from its base branch (the
        base fast-forwarded, or the head moved onto it) marks it merged by whoever moved the ref."""
        now = self.clock()
        self.pushed_at = now
        moved = {}
        for ref, old, new in changes:
            self._emit("push", events.push(self, ref, old, new, actor))
            if ref.startswith("refs/heads/"):
                moved[ref.removeprefix("refs/heads/")] = new
        tips = {name.removeprefix("refs/heads/"): sha for name, sha in self.repo.refs().items()}
        for pull in [p for p in self.pulls.values() if p.state == "open"]:
            if pull.head not in moved and pull.base not in moved:
                continue
            if moved.get(pull.head) == ZERO:
                pull.state, pull.closed_at, pull.updated_at, pull.closed_by = "closed", now, now, actor
                self._record(pull.number, actor, "closed")
                self._emit("pull_request", events.pull_request(self, "closed", pull, actor))
                continue
            if pull.head in moved:
                before, pull.head_sha, pull.updated_at = pull.head_sha, moved[pull.head], now
                self._emit(
                    "pull_request",
                    events.pull_request(self, "synchronize", pull, actor, before=before, after=pull.head_sha),
                )
            base_tip = tips.get(pull.base)
            if base_tip and self.repo.is_ancestor(pull.head_sha, base_tip):
                pull.state, pull.merged, pull.merged_by, pull.closed_by = "closed", True, actor, actor
                pull.merged_at = pull.closed_at = pull.updated_at = now
                pull.merge_commit_sha = pull.head_sha
                self._record(pull.number, actor, "merged", commit_id=pull.head_sha)
                self._record(pull.number, actor, "closed", commit_id=pull.head_sha)
                self._emit("pull_request", events.pull_request(self, "closed", pull, actor))
            elif base_tip:
                pull.base_sha = base_tip

    # pull requests --------------------------------------------------------------------------

    def pull(self, number: int) -> Pull:
        if number not in self.pulls:
            raise not_found()
        return self.pulls[number]

    def open_pull(self, actor: str, title: str, head: str, base: str, body: str | None, draft: bool) -> Pull:
        with self.lock:
            owner, _, branch = head.rpartition(":")
            refs = self.repo.refs()
            head_sha, base_sha = refs.get(f"refs/heads/{branch}"), refs.get(f"refs/heads/{base}")
            if owner not in ("", self.owner) or head_sha is None:
                raise invalid("PullRequest", "head")
            if base_sha is None:
                raise invalid("PullRequest", "base")
            if not self.repo.rev_list(f"{base_sha}..{head_sha}"):
                raise invalid("PullRequest", "head", "custom", f"No commits between {base} and {branch}")
            if any(p.state == "open" and p.head == branch and p.base == base for p in self.pulls.values()):
                raise invalid(
                    "PullRequest", "head", "custom", f"A pull request already exists for {self.owner}:{branch}."
                )
            now = self.clock()
            pull = Pull(
                next(self._numbers),
                self._next("pull"),
                actor,
                title,
                body,
                branch,
                base,
                head_sha,
                base_sha,
                now,
                now,
                draft,
            )
            self.pulls[pull.number] = pull
            self._emit("pull_request", events.pull_request(self, "opened", pull, actor))
            return pull

    def edit_pull(self, number: int, actor: str, changes: dict[str, Any]) -> Pull:
        with self.lock:
            pull = self.pull(number)
            new_base = changes.get("base", pull.base)
            base_sha = self.repo.refs().get(f"refs/heads/{new_base}")
            if base_sha is None:
                raise invalid("PullRequest", "base")
            edited = {
                k: {"from": getattr(pull, k)}
                for k in ("title", "body")
                if k in changes and changes[k] != getattr(pull, k)
            }
            for key in edited:
                setattr(pull, key, changes[key])
            if new_base != pull.base:
                edited["base"] = {"ref": {"from": pull.base}, "sha": {"from": pull.base_sha}}
                pull.base, pull.base_sha = new_base, base_sha
            if edited:
                pull.updated_at = self.clock()
                self._emit("pull_request", events.pull_request(self, "edited", pull, actor, changes=edited))
            if changes.get("state") == "closed" and pull.state == "open":
                self.close_pull(number, actor)
            elif changes.get("state") == "open" and pull.state == "closed":
                self.reopen_pull(number, actor)
            return pull

    def close_pull(self, number: int, actor: str) -> None:
        with self.lock:
            pull = self.pull(number)
            if pull.state == "closed":
                return
            pull.state, pull.closed_at, pull.updated_at = "closed", self.clock(), self.clock()
            pull.closed_by = actor
            self._record(number, actor, "closed")
            self._emit("pull_request", events.pull_request(self, "closed", pull, actor))

    def reopen_pull(self, number: int, actor: str) -> None:
        with self.lock:
            pull = self.pull(number)
            head = self.repo.refs().get(f"refs/heads/{pull.head}")
            if pull.state == "open":
                return
            if pull.merged:
                raise unprocessable("state cannot be changed. The pull request has already been merged.")
            if head is None:
                raise unprocessable(f"state cannot be changed. The {pull.head} branch has been deleted.")
            pull.state, pull.closed_at, pull.updated_at, pull.head_sha = "open", None, self.clock(), head
            pull.closed_by = None
            self._record(number, actor, "reopened")
            self._emit("pull_request", events.pull_request(self, "reopened", pull, actor))

    # issues ---------------------------------------------------------------------------------

    def issue(self, number: int) -> Issue:
        """An issue that is not a pull request (404 for a pull request's number or an unknown one,
        410 for a deleted one)."""
        if number in self.deleted_issues:
            raise ApiError(410, "This issue was deleted")
        if number not in self.issues:
            raise not_found()
        return self.issues[number]

    def open_issue(self, actor: str, title: str, body: str | None, labels: list[str], via_app: bool = False) -> Issue:
        """GitHub sets labels only for callers with push access (an App with issues: write has it)
        and silently drops them for others; a label that does not exist yet is created."""
        with self.lock:
            if not title.strip():
                raise invalid("Issue", "title", "missing_field")
            _check_issue_body(body)
            now = self.clock()
            issue = Issue(next(self._numbers), self._next("issue"), actor, title, body, now, now, via_app=via_app)
            if self._can_push(actor):
                issue.labels = self._label_names(labels)
            self.issues[issue.number] = issue
            return issue

    def edit_issue(self, number: int, actor: str, changes: dict[str, Any]) -> Issue:
        """PATCH an issue: title, body, labels (replacing them), state and state_reason."""
        with self.lock:
            issue = self.issue(number)
            if "body" in changes:
                _check_issue_body(changes["body"])
            for key in ("title", "body"):
                if key in changes and changes[key] is not None:
                    setattr(issue, key, str(changes[key]) if key == "title" else changes[key])
            if "labels" in changes and self._can_push(actor):
                issue.labels = self._label_names([x if isinstance(x, str) else x["name"] for x in changes["labels"]])
            reason = changes.get("state_reason")
            if changes.get("state") == "closed" and issue.state == "open":
                self.close_issue(
                    number, actor, reason if reason in ("completed", "not_planned", "duplicate") else "completed"
                )
            elif changes.get("state") == "open" and issue.state == "closed":
                self.reopen_issue(number, actor)
            issue.updated_at = self.clock()
            return issue

    def close_issue(self, number: int, actor: str, reason: str = "completed") -> None:
        with self.lock:
            issue = self.issue(number)
            if issue.state == "closed":
                return
            now = self.clock()
            issue.state, issue.state_reason, issue.closed_at, issue.closed_by, issue.updated_at = (
                "closed",
                reason,
                now,
                actor,
                now,
            )
            self._record(number, actor, "closed", state_reason=reason)

    def reopen_issue(self, number: int, actor: str) -> None:
        with self.lock:
            issue = self.issue(number)
            if issue.state == "open":
                return
            issue.state, issue.state_reason, issue.closed_at, issue.closed_by = "open", "reopened", None, None
            issue.updated_at = self.clock()
            self._record(number, actor, "reopened", state_reason="reopened")

    def delete_issue(self, number: int) -> None:
        """An admin deletes an issue (github.com or GraphQL only: REST has no DELETE for issues)."""
        with self.lock:
            self.issue(number)
            del self.issues[number]
            self.deleted_issues.add(number)

    def _can_push(self, login: str) -> bool:
        return login.endswith("[bot]") or self.permission(login) in PUSH_ROLES

    def _label_names(self, names: list[str]) -> list[str]:
        out: list[str] = []
        for name in names:
            label = self.labels.get(name.lower()) or self.create_label(name, "ededed", None)
            if label.name not in out:
                out.append(label.name)
        return out

    def add_review(self, number: int, user: str, body: str, state: str) -> Review:
        with self.lock:
            pull = self.pull(number)
            if state.upper() not in REVIEW_STATES:
                raise ValueError(f"a review is one of {', '.join(s.lower() for s in REVIEW_STATES)}, not {state!r}")
            review = Review(self._next("review"), number, user, body, state.upper(), pull.head_sha, self.clock())
            self.reviews[review.id] = review
            self._emit("pull_request_review", events.review(self, review, pull))
            return review

    # comments, reactions, labels ------------------------------------------------------------

    def comment(self, comment_id: int) -> Comment:
        if comment_id not in self.comments:
            raise not_found()
        return self.comments[comment_id]

    def commented(self, number: int) -> Pull | Issue:
        """What a comment's number names: a pull request, or an issue that is not one (404, 410 as
        `issue` says)."""
        return self.pulls[number] if number in self.pulls else self.issue(number)

    def add_comment(self, number: int, user: str, body: str, via_app: bool = False) -> Comment:
        with self.lock:
            item = self.commented(number)
            _check_comment(body)
            now = self.clock()
            comment = Comment(self._next("comment"), number, user, body, now, now, via_app)
            self.comments[comment.id] = comment
            self._emit("issue_comment", events.issue_comment(self, "created", comment, item, user))
            return comment

    def edit_comment(self, comment_id: int, body: str, actor: str) -> Comment:
        with self.lock:
            comment = self.comment(comment_id)
            _check_comment(body)
            before, comment.body, comment.updated_at = comment.body, body, self.clock()
            self._emit(
                "issue_comment",
                events.issue_comment(
                    self, "edited", comment, self.commented(comment.number), actor, changes={"body": {"from": before}}
                ),
            )
            return comment

    def delete_comment(self, comment_id: int, actor: str) -> None:
        with self.lock:
            comment = self.comment(comment_id)
            del self.comments[comment_id]
            item = self.commented(comment.number)
            self._emit("issue_comment", events.issue_comment(self, "deleted", comment, item, actor))

    def react(self, comment_id: int, user: str, content: str) -> tuple[Reaction, bool]:
        """The reaction and whether it is new (GitHub answers 201 then, 200 for a repeat)."""
        with self.lock:
            self.comment(comment_id)
            for r in self.reactions.values():
                if (r.comment_id, r.user, r.content) == (comment_id, user, content):
                    return r, False
            reaction = Reaction(self._next("reaction"), comment_id, user, content, self.clock())
            self.reactions[reaction.id] = reaction
            return reaction, True

    def create_label(self, name: str, color: str, description: str | None) -> Label:
        with self.lock:
            if name.lower() in self.labels:
                raise invalid("Label", "name", "already_exists")
            label = Label(self._next("label"), name, color.lstrip("#").lower(), description)
            self.labels[name.lower()] = label
            return label

    def label(self, name: str) -> Label:
        if name.lower() not in self.labels:
            raise not_found()
        return self.labels[name.lower()]

    def add_labels(self, number: int, names: list[str], actor: str) -> None:
        with self.lock:
            pull = self.pull(number)
            for name in names:
                label = self.labels.get(name.lower()) or self.create_label(name, "ededed", None)
                if label.name not in pull.labels:
                    pull.labels.append(label.name)
                    pull.updated_at = self.clock()
                    self._emit("pull_request", events.pull_request(self, "labeled", pull, actor, label=label))

    def remove_label(self, number: int, name: str, actor: str) -> None:
        with self.lock:
            pull = self.pull(number)
            match = [n for n in pull.labels if n.lower() == name.lower()]
            if not match:
                raise ApiError(404, "Label does not exist")
            pull.labels.remove(match[0])
            pull.updated_at = self.clock()
            self._emit("pull_request", events.pull_request(self, "unlabeled", pull, actor, label=self.label(match[0])))

    # checks and statuses --------------------------------------------------------------------

    def check_run(self, run_id: int) -> CheckRun:
        if run_id not in self.check_runs:
            raise not_found()
        return self.check_runs[run_id]

    def create_check_run(self, actor: str, fields: dict[str, Any]) -> CheckRun:
        with self.lock:
            sha = fields["head_sha"]
            if len(sha) != 40 or self.repo.object_type(sha) != "commit":
                raise unprocessable(f"No commit found for SHA: {sha}")
            now = self.clock()
            run = CheckRun(
                self._next("check"),
                self.suites.setdefault(sha, self._next("suite")),
                fields["name"],
                sha,
                "queued",
                None,
                now,
                None,
                "",
                None,
                {},
                [],
                actor,
            )
            checks.apply(run, fields, self.clock())
            self.check_runs[run.id] = run
            self._emit("check_run", events.check_run(self, "created", run, actor))
            if run.status == "completed":
                self._emit("check_run", events.check_run(self, "completed", run, actor))
            return run

    def update_check_run(self, run_id: int, actor: str, fields: dict[str, Any]) -> CheckRun:
        with self.lock:
            run = self.check_run(run_id)
            if run.creator != actor:
                raise ApiError(403, "Resource not accessible by integration")
            was = (run.status, run.conclusion)
            checks.apply(run, fields, self.clock())
            if run.status == "completed" and (run.status, run.conclusion) != was:
                self._emit("check_run", events.check_run(self, "completed", run, actor))
            return run

    def rerequest_check(self, run_id: int, user: str) -> None:
        with self.lock:
            self._emit("check_run", events.check_run(self, "rerequested", self.check_run(run_id), user))

    def request_action(self, run_id: int, identifier: str, user: str) -> None:
        with self.lock:
            run = self.check_run(run_id)
            if identifier not in [a["identifier"] for a in run.actions]:
                raise ValueError(f"check run {run_id} offers no action {identifier!r}")
            self._emit(
                "check_run",
                events.check_run(self, "requested_action", run, user, requested_action={"identifier": identifier}),
            )

    def create_status(self, sha: str, actor: str, fields: dict[str, Any]) -> Status:
        with self.lock:
            if len(sha) != 40 or self.repo.object_type(sha) != "commit":
                raise unprocessable(f"No commit found for SHA: {sha}")
            description = fields.get("description")
            if description and len(description) > STATUS_DESCRIPTION_LIMIT:
                raise invalid(
                    "Status",
                    "description",
                    "custom",
                    f"description is too long (maximum is {STATUS_DESCRIPTION_LIMIT} characters)",
                )
            status = Status(
                self._next("status"),
                sha,
                fields["state"],
                fields.get("target_url"),
                description,
                fields.get("context") or "default",
                actor,
                self.clock(),
            )
            self.statuses.append(status)
            return status


def _check_issue_body(body: str | None) -> None:
    if body is not None and len(body) > ISSUE_BODY_LIMIT:
        raise invalid("Issue", "body", "custom", f"body is too long (maximum is {ISSUE_BODY_LIMIT} characters)")


def _check_comment(body: str) -> None:
    if len(body) > COMMENT_LIMIT:
        raise invalid("IssueComment", "data", "custom", f"Body is too long (maximum is {COMMENT_LIMIT} characters)")
