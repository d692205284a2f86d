"""Webhook bodies, shaped like GitHub's (modelled on `@octokit/webhooks-examples` and checked
against the `x-webhooks` schemas of the vendored OpenAPI description when they are sent).

Each function takes the state (under its lock) and returns the body for one event; `state.py`
decides when an event happens, `webhooks.py` signs and delivers it.
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from . import payloads as P
from .gitrepo import ZERO
from .model import Issue

if TYPE_CHECKING:
    from .model import CheckRun, Comment, Pull, Review
    from .state import State

PUSH_COMMITS_LIMIT = 2048


def parse_time(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _envelope(st: State, sender: str) -> dict[str, Any]:
    out: dict[str, Any] = {"repository": P.repository(st), "sender": P.user(st, sender)}
    if st.owner_type == "Organization":
        out["organization"] = P.organization(st)
    if st.app:
        iid = st.app["installation_id"]
        out["installation"] = {"id": iid, "node_id": P.node("MDIz", iid)}
    return out


def push(st: State, ref: str, old: str, new: str, actor: str) -> dict[str, Any]:
    repo = st.repo
    if new == ZERO:
        shas: list[str] = []
    elif old == ZERO:
        others = [sha for name, sha in repo.refs().items() if name != ref]
        shas = repo.rev_list(new, "--not", *others) if others else repo.rev_list(new)
    else:
        shas = repo.rev_list(f"{old}..{new}")
    commits = [_push_commit(st, sha) for sha in shas[-PUSH_COMMITS_LIMIT:]]
    head = commits[-1] if commits else (_push_commit(st, new, distinct=False) if new != ZERO else None)
    body = {
        "ref": ref,
        "before": old,
        "after": new,
        "created": old == ZERO,
        "deleted": new == ZERO,
        "forced": old != ZERO and new != ZERO and not repo.is_ancestor(old, new),
        "base_ref": None,
        "compare": P.html_url(st, f"/compare/{old[:12]}...{new[:12]}"),
        "commits": commits,
        "head_commit": head,
        "pusher": {"name": actor, "email": f"{actor}@users.noreply.github.com"},
    }
    return {**body, **_envelope(st, actor), "repository": P.repository(st, push_event=True)}


def _push_commit(st: State, sha: str, distinct: bool = True) -> dict[str, Any]:
    c = st.repo.read_commit(sha)
    files = st.repo.changes(c.parents[0] if c.parents else None, sha)

    def person(p: Any) -> dict[str, Any]:
        login = P.login_for_email(p.email)
        return {"name": p.name, "email": p.email, "date": P.iso(p.when), **({"username": login} if login else {})}

    return {
        "id": sha,
        "tree_id": c.tree,
        "distinct": distinct,
        "message": c.message,
        "timestamp": P.iso(c.committer.when),
        "url": P.html_url(st, f"/commit/{sha}"),
        "author": person(c.author),
        "committer": person(c.committer),
        "added": [f.filename for f in files if f.status in ("added", "copied")],
        "removed": [f.filename for f in files if f.status == "removed"],
        "modified": [f.filename for f in files if f.status in ("modified", "renamed", "changed")],
    }


def pull_request(st: State, action: str, pull: Pull, actor: str, **extra: Any) -> dict[str, Any]:
    """opened, closed (merged or not), reopened, synchronize (before/after), edited (changes),
    labeled/unlabeled (label)."""
    if "label" in extra:
        extra["label"] = P.label(st, extra["label"])
    return {
        "action": action,
        "number": pull.number,
        **extra,
        "pull_request": P.pull_request(st, pull),
        **_envelope(st, actor),
    }


def issue_comment(
    st: State, action: str, comment: Comment, item: Pull | Issue, actor: str, changes: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A comment on a pull request (`issue.pull_request` set) or on a plain issue (no such key)."""
    shown = P.plain_issue(st, item) if isinstance(item, Issue) else P.issue(st, item)
    body = {"action": action, "issue": shown, "comment": P.comment(st, comment)}
    if changes:
        body["changes"] = changes
    return {**body, **_envelope(st, actor)}


def review(st: State, r: Review, pull: Pull) -> dict[str, Any]:
    shown = {**P.review(st, r), "state": r.state.lower()}
    return {
        "action": "submitted",
        "review": shown,
        "pull_request": P.pull_request(st, pull, detail=False),
        **_envelope(st, r.user),
    }


def check_run(st: State, action: str, run: CheckRun, actor: str, **extra: Any) -> dict[str, Any]:
    shown = P.check_run(st, run)
    shown["check_suite"] = {
        "id": run.suite_id,
        "node_id": P.node("CS", run.suite_id),
        "head_sha": run.head_sha,
        "head_branch": next(
            (
                name.removeprefix("refs/heads/")
                for name, sha in st.repo.refs().items()
                if sha == run.head_sha and name.startswith("refs/heads/")
            ),
            None,
        ),
        "status": run.status,
        "conclusion": run.conclusion,
        "url": P.repo_url(st, f"/check-suites/{run.suite_id}"),
        "before": None,
        "after": run.head_sha,
        "app": shown["app"],
        "pull_requests": shown["pull_requests"],
        "created_at": shown["started_at"],
        "updated_at": shown["completed_at"] or shown["started_at"],
    }
    return {"action": action, "check_run": shown, **extra, **_envelope(st, actor)}
