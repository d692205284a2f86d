"""GitHub's JSON for the stand-in's records: users, the repository, pull requests and their issue
side, issues, comments, reactions, labels, reviews, check runs, statuses and the App (git data is
in payloads_git.py).

The same objects serve REST answers and webhook bodies, as on GitHub. Every URL points back at the
stand-in (PyGithub follows `url` fields), and the shapes satisfy the vendored OpenAPI schemas,
which check them on the way out.
"""

from __future__ import annotations

import base64
import re
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

if TYPE_CHECKING:
    from .model import CheckRun, Comment, Issue, IssueEvent, Label, Pull, Reaction, Review, Status
    from .state import State

REACTIONS = ["+1", "-1", "laugh", "confused", "heart", "hooray", "eyes", "rocket"]
_REPO_URLS = {  # GitHub's hypermedia templates, relative to the repository's API url
    "archive": "/{archive_format}{/ref}",
    "assignees": "/assignees{/user}",
    "blobs": "/git/blobs{/sha}",
    "branches": "/branches{/branch}",
    "collaborators": "/collaborators{/collaborator}",
    "comments": "/comments{/number}",
    "commits": "/commits{/sha}",
    "compare": "/compare/{base}...{head}",
    "contents": "/contents/{+path}",
    "contributors": "/contributors",
    "deployments": "/deployments",
    "downloads": "/downloads",
    "events": "/events",
    "forks": "/forks",
    "git_commits": "/git/commits{/sha}",
    "git_refs": "/git/refs{/sha}",
    "git_tags": "/git/tags{/sha}",
    "hooks": "/hooks",
    "issue_comment": "/issues/comments{/number}",
    "issue_events": "/issues/events{/number}",
    "issues": "/issues{/number}",
    "keys": "/keys{/key_id}",
    "labels": "/labels{/name}",
    "languages": "/languages",
    "merges": "/merges",
    "milestones": "/milestones{/number}",
    "notifications": "/notifications{?since,all,participating}",
    "pulls": "/pulls{/number}",
    "releases": "/releases{/id}",
    "stargazers": "/stargazers",
    "statuses": "/statuses/{sha}",
    "subscribers": "/subscribers",
    "subscription": "/subscription",
    "tags": "/tags",
    "teams": "/teams",
    "trees": "/git/trees{/sha}",
}
_NOREPLY = re.compile(r"^(?:\d+\+)?(?P<login>[^@]+)@users\.noreply\.github\.com$")


def iso(ts: float | None) -> str | None:
    return None if ts is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def node(prefix: str, key: int | str) -> str:
    return base64.b64encode(f"{prefix}:{key}".encode()).decode().rstrip("=")


def repo_url(st: State, path: str = "") -> str:
    return f"{st.base_url}/repos/{st.owner}/{st.name}{path}"


def html_url(st: State, path: str = "") -> str:
    return f"{st.base_url}/{st.owner}/{st.name}{path}"


def b64(data: bytes) -> str:
    """Base64 in 60-character lines, as GitHub sends file and blob content."""
    text = base64.b64encode(data).decode()
    return "".join(text[i : i + 60] + "\n" for i in range(0, len(text), 60))


# people and the App ------------------------------------------------------------------------


def user(st: State, login: str) -> dict[str, Any]:
    url = f"{st.base_url}/users/{login}"
    uid = st.user_id(login)
    return {
        "login": login,
        "id": uid,
        "node_id": node("U", uid),
        "avatar_url": f"{st.base_url}/_avatars/{uid}",
        "gravatar_id": "",
        "url": url,
        "html_url": f"{st.base_url}/{login}",
        "followers_url": f"{url}/followers",
        "following_url": f"{url}/following{{/other_user}}",
        "gists_url": f"{url}/gists{{/gist_id}}",
        "starred_url": f"{url}/starred{{/owner}}{{/repo}}",
        "subscriptions_url": f"{url}/subscriptions",
        "organizations_url": f"{url}/orgs",
        "repos_url": f"{url}/repos",
        "events_url": f"{url}/events{{/privacy}}",
        "received_events_url": f"{url}/received_events",
        "type": st.user_type(login),
        "user_view_type": "public",
        "site_admin": False,
    }


def private_user(st: State, login: str) -> dict[str, Any]:
    """GET /user: the authenticated person's own profile."""
    return {
        **user(st, login),
        "name": login,
        "company": None,
        "blog": "",
        "location": None,
        "email": None,
        "hireable": None,
        "bio": None,
        "twitter_username": None,
        "public_repos": 1,
        "public_gists": 0,
        "followers": 0,
        "following": 0,
        "created_at": iso(st.created_at),
        "updated_at": iso(st.created_at),
        "private_gists": 0,
        "total_private_repos": 0,
        "owned_private_repos": 0,
        "disk_usage": 0,
        "collaborators": 0,
        "two_factor_authentication": True,
    }


def login_for_email(email: str) -> str | None:
    match = _NOREPLY.match(email or "")
    return match.group("login") if match else None


def integration(st: State) -> dict[str, Any]:
    app = st.app or {}
    return {
        "id": app["id"],
        "slug": app["slug"],
        "node_id": node("A", app["id"]),
        "client_id": f"Iv1.{app['id']:016x}",
        "owner": user(st, st.owner),
        "name": app["slug"],
        "description": "",
        "external_url": st.base_url,
        "html_url": f"{st.base_url}/apps/{app['slug']}",
        "created_at": iso(st.created_at),
        "updated_at": iso(st.created_at),
        "permissions": dict(app["permissions"]),
        "events": list(app["events"]),
    }


def installation(st: State) -> dict[str, Any]:
    app = st.app or {}
    iid = app["installation_id"]
    return {
        "id": iid,
        "client_id": f"Iv1.{app['id']:016x}",
        "account": user(st, st.owner),
        "repository_selection": "selected",
        "access_tokens_url": f"{st.base_url}/app/installations/{iid}/access_tokens",
        "repositories_url": f"{st.base_url}/installation/repositories",
        "html_url": f"{st.base_url}/organizations/{st.owner}/settings/installations/{iid}",
        "app_id": app["id"],
        "app_slug": app["slug"],
        "target_id": st.user_id(st.owner),
        "target_type": st.user_type(st.owner),
        "permissions": dict(app["permissions"]),
        "events": list(app["events"]),
        "created_at": iso(st.created_at),
        "updated_at": iso(st.created_at),
        "single_file_name": None,
        "has_multiple_single_files": False,
        "single_file_paths": [],
        "suspended_by": None,
        "suspended_at": None,
    }


# the repository ----------------------------------------------------------------------------


def repository(st: State, push_event: bool = False) -> dict[str, Any]:
    """The full repository. In push events GitHub writes created_at and pushed_at as unix
    seconds; everywhere else as ISO 8601 strings."""
    rid = st.repo_id
    url = repo_url(st)
    stamp = (lambda t: int(t)) if push_event else iso
    out = {
        "id": rid,
        "node_id": node("R", rid),
        "name": st.name,
        "full_name": f"{st.owner}/{st.name}",
        "private": st.private,
        "owner": user(st, st.owner),
        "html_url": html_url(st),
        "description": None,
        "fork": False,
        "url": url,
        "created_at": stamp(st.created_at),
        "updated_at": iso(st.pushed_at),
        "pushed_at": stamp(st.pushed_at),
        "git_url": f"git://{st.base_url.split('//')[-1]}/{st.owner}/{st.name}.git",
        "ssh_url": f"git@{st.base_url.split('//')[-1]}:{st.owner}/{st.name}.git",
        "clone_url": f"{st.base_url}/_git/{st.owner}/{st.name}.git",
        "svn_url": html_url(st),
        "homepage": None,
        "size": 1,
        "stargazers_count": 0,
        "watchers_count": 0,
        "language": "Python",
        "has_issues": True,
        "has_projects": False,
        "has_downloads": True,
        "has_wiki": False,
        "has_pages": False,
        "has_discussions": False,
        "forks_count": 0,
        "mirror_url": None,
        "archived": False,
        "disabled": False,
        "open_issues_count": sum(i.state == "open" for i in [*st.pulls.values(), *st.issues.values()]),
        "license": None,
        "allow_forking": True,
        "is_template": False,
        "web_commit_signoff_required": False,
        "topics": [],
        "visibility": "private" if st.private else "public",
        "forks": 0,
        "watchers": 0,
        "default_branch": st.default_branch,
        "network_count": 0,
        "subscribers_count": 0,
        "allow_merge_commit": True,
        "allow_squash_merge": True,
        "allow_rebase_merge": True,
        "allow_auto_merge": False,
        "delete_branch_on_merge": False,
    }
    out["open_issues"] = out["open_issues_count"]
    if push_event:
        out.update(stargazers=0, master_branch=st.default_branch)
    out.update({f"{name}_url": url + path for name, path in _REPO_URLS.items()})
    return out


def organization(st: State) -> dict[str, Any]:
    url = f"{st.base_url}/orgs/{st.owner}"
    oid = st.user_id(st.owner)
    return {
        "login": st.owner,
        "id": oid,
        "node_id": node("O", oid),
        "url": url,
        "repos_url": f"{url}/repos",
        "events_url": f"{url}/events",
        "hooks_url": f"{url}/hooks",
        "issues_url": f"{url}/issues",
        "members_url": f"{url}/members{{/member}}",
        "public_members_url": f"{url}/public_members{{/member}}",
        "avatar_url": f"{st.base_url}/_avatars/{oid}",
        "description": None,
    }


# pull requests and their issue side --------------------------------------------------------


def label(st: State, lbl: Label) -> dict[str, Any]:
    return {
        "id": lbl.id,
        "node_id": node("LA", lbl.id),
        "url": repo_url(st, f"/labels/{quote(lbl.name)}"),
        "name": lbl.name,
        "color": lbl.color,
        "default": lbl.default,
        "description": lbl.description,
    }


def _labels(st: State, item: Pull | Issue) -> list[dict[str, Any]]:
    return [label(st, st.label(name)) for name in item.labels]


def reactions(st: State, comment_id: int) -> dict[str, Any]:
    counts = {kind: 0 for kind in REACTIONS}
    for r in st.reactions.values():
        if r.comment_id == comment_id:
            counts[r.content] += 1
    return {
        "url": repo_url(st, f"/issues/comments/{comment_id}/reactions"),
        "total_count": sum(counts.values()),
        **counts,
    }


def reaction(st: State, r: Reaction) -> dict[str, Any]:
    return {
        "id": r.id,
        "node_id": node("REA", r.id),
        "user": user(st, r.user),
        "content": r.content,
        "created_at": iso(r.created_at),
    }


def comment(st: State, c: Comment) -> dict[str, Any]:
    return {
        "id": c.id,
        "node_id": node("IC", c.id),
        "url": repo_url(st, f"/issues/comments/{c.id}"),
        "html_url": html_url(st, f"/{'pull' if c.number in st.pulls else 'issues'}/{c.number}#issuecomment-{c.id}"),
        "body": c.body,
        "user": user(st, c.user),
        "created_at": iso(c.created_at),
        "updated_at": iso(c.updated_at),
        "issue_url": repo_url(st, f"/issues/{c.number}"),
        "author_association": st.association(c.user),
        "performed_via_github_app": integration(st) if c.via_app else None,
        "reactions": reactions(st, c.id),
    }


def _issue_links(st: State, n: int, page: str = "pull") -> dict[str, str]:
    return {
        "url": repo_url(st, f"/issues/{n}"),
        "repository_url": repo_url(st),
        "labels_url": repo_url(st, f"/issues/{n}/labels{{/name}}"),
        "comments_url": repo_url(st, f"/issues/{n}/comments"),
        "events_url": repo_url(st, f"/issues/{n}/events"),
        "html_url": html_url(st, f"/{page}/{n}"),
        "timeline_url": repo_url(st, f"/issues/{n}/timeline"),
    }


def plain_issue(st: State, issue: Issue) -> dict[str, Any]:
    """An issue that is not a pull request: no `pull_request` key, its page under /issues/."""
    n = issue.number
    return {
        **_issue_links(st, n, "issues"),
        "id": issue.id,
        "node_id": node("I", issue.id),
        "number": n,
        "title": issue.title,
        "user": user(st, issue.user),
        "labels": _labels(st, issue),
        "state": issue.state,
        "state_reason": issue.state_reason,
        "locked": False,
        "assignee": None,
        "assignees": [],
        "milestone": None,
        "comments": sum(c.number == n for c in st.comments.values()),
        "created_at": iso(issue.created_at),
        "updated_at": iso(issue.updated_at),
        "closed_at": iso(issue.closed_at),
        "closed_by": user(st, issue.closed_by) if issue.closed_by else None,
        "author_association": st.association(issue.user),
        "active_lock_reason": None,
        "body": issue.body,
        "performed_via_github_app": integration(st) if issue.via_app else None,
        "reactions": {**reactions(st, 0), "url": repo_url(st, f"/issues/{n}/reactions")},
    }


def issue(st: State, pull: Pull) -> dict[str, Any]:
    """A pull request seen through the Issues API (every pull request is an issue)."""
    n = pull.number
    return {
        **_issue_links(st, n),
        "id": pull.id + 90_000_000,
        "node_id": node("I", pull.id),
        "number": n,
        "title": pull.title,
        "user": user(st, pull.user),
        "labels": _labels(st, pull),
        "state": pull.state,
        "state_reason": None if pull.state == "open" else "completed",
        "locked": False,
        "assignee": None,
        "assignees": [],
        "milestone": None,
        "comments": sum(c.number == n for c in st.comments.values()),
        "created_at": iso(pull.created_at),
        "updated_at": iso(pull.updated_at),
        "closed_at": iso(pull.closed_at),
        "closed_by": user(st, pull.closed_by) if pull.closed_by else None,
        "author_association": st.association(pull.user),
        "active_lock_reason": None,
        "draft": pull.draft,
        "body": pull.body,
        "performed_via_github_app": None,
        "reactions": {**reactions(st, 0), "url": repo_url(st, f"/issues/{n}/reactions")},
        "pull_request": {
            "url": repo_url(st, f"/pulls/{n}"),
            "html_url": html_url(st, f"/pull/{n}"),
            "diff_url": html_url(st, f"/pull/{n}.diff"),
            "patch_url": html_url(st, f"/pull/{n}.patch"),
            "merged_at": iso(pull.merged_at),
        },
    }


def issue_event(st: State, e: IssueEvent) -> dict[str, Any]:
    """One entry of `GET .../issues/{n}/events` (GitHub's state-change issue event: closed,
    reopened, merged); `performed_via_github_app` when an App's installation did it."""
    prefix = {"closed": "CE", "reopened": "REE", "merged": "ME"}.get(e.event, "IE")
    return {
        "id": e.id,
        "node_id": node(prefix, e.id),
        "url": repo_url(st, f"/issues/events/{e.id}"),
        "actor": user(st, e.actor),
        "event": e.event,
        "commit_id": e.commit_id,
        "commit_url": repo_url(st, f"/commits/{e.commit_id}") if e.commit_id else None,
        "created_at": iso(e.created_at),
        "state_reason": e.state_reason,
        "performed_via_github_app": integration(st) if st.app and e.actor.endswith("[bot]") else None,
    }


def _branch(st: State, ref: str, sha: str) -> dict[str, Any]:
    return {"label": f"{st.owner}:{ref}", "ref": ref, "sha": sha, "user": user(st, st.owner), "repo": repository(st)}


def pull_request(st: State, pull: Pull, detail: bool = True) -> dict[str, Any]:
    """pull-request (detail) or pull-request-simple (lists). The counts come from git."""
    n = pull.number
    url = repo_url(st, f"/pulls/{n}")
    out = {
        "url": url,
        "id": pull.id,
        "node_id": node("PR", pull.id),
        "html_url": html_url(st, f"/pull/{n}"),
        "diff_url": html_url(st, f"/pull/{n}.diff"),
        "patch_url": html_url(st, f"/pull/{n}.patch"),
        "issue_url": repo_url(st, f"/issues/{n}"),
        "commits_url": f"{url}/commits",
        "review_comments_url": f"{url}/comments",
        "review_comment_url": repo_url(st, "/pulls/comments{/number}"),
        "comments_url": repo_url(st, f"/issues/{n}/comments"),
        "statuses_url": repo_url(st, f"/statuses/{pull.head_sha}"),
        "number": n,
        "state": pull.state,
        "locked": False,
        "title": pull.title,
        "user": user(st, pull.user),
        "body": pull.body,
        "labels": _labels(st, pull),
        "milestone": None,
        "active_lock_reason": None,
        "created_at": iso(pull.created_at),
        "updated_at": iso(pull.updated_at),
        "closed_at": iso(pull.closed_at),
        "merged_at": iso(pull.merged_at),
        "merge_commit_sha": pull.merge_commit_sha,
        "assignee": None,
        "assignees": [],
        "requested_reviewers": [],
        "requested_teams": [],
        "draft": pull.draft,
        "head": _branch(st, pull.head, pull.head_sha),
        "base": _branch(st, pull.base, pull.base_sha),
        "_links": {
            name: {"href": href}
            for name, href in [
                ("self", url),
                ("html", html_url(st, f"/pull/{n}")),
                ("issue", repo_url(st, f"/issues/{n}")),
                ("comments", repo_url(st, f"/issues/{n}/comments")),
                ("review_comments", f"{url}/comments"),
                ("review_comment", repo_url(st, "/pulls/comments{/number}")),
                ("commits", f"{url}/commits"),
                ("statuses", repo_url(st, f"/statuses/{pull.head_sha}")),
            ]
        },
        "author_association": st.association(pull.user),
        "auto_merge": None,
    }
    if detail:
        base = st.repo.merge_base(pull.base_sha, pull.head_sha) or pull.base_sha
        files = st.repo.changes(base, pull.head_sha)
        open_and_live = pull.state == "open"
        mergeable = st.repo.mergeable(pull.base_sha, pull.head_sha) if open_and_live else None
        out.update(
            {
                "merged": pull.merged,
                "mergeable": mergeable,
                "rebaseable": mergeable,
                "mergeable_state": ("clean" if mergeable else "dirty") if open_and_live else "unknown",
                "merged_by": user(st, pull.merged_by) if pull.merged_by else None,
                "comments": sum(c.number == n for c in st.comments.values()),
                "review_comments": 0,
                "maintainer_can_modify": False,
                "commits": len(st.repo.rev_list(f"{base}..{pull.head_sha}")),
                "additions": sum(f.additions for f in files),
                "deletions": sum(f.deletions for f in files),
                "changed_files": len(files),
            }
        )
    return out


def pull_minimal(st: State, pull: Pull) -> dict[str, Any]:
    slim = {"id": st.repo_id, "url": repo_url(st), "name": st.name}
    return {
        "id": pull.id,
        "number": pull.number,
        "url": repo_url(st, f"/pulls/{pull.number}"),
        "head": {"ref": pull.head, "sha": pull.head_sha, "repo": slim},
        "base": {"ref": pull.base, "sha": pull.base_sha, "repo": slim},
    }


def review(st: State, r: Review) -> dict[str, Any]:
    url = html_url(st, f"/pull/{r.number}")
    return {
        "id": r.id,
        "node_id": node("PRR", r.id),
        "user": user(st, r.user),
        "body": r.body,
        "state": r.state,
        "html_url": f"{url}#pullrequestreview-{r.id}",
        "pull_request_url": repo_url(st, f"/pulls/{r.number}"),
        "_links": {
            "html": {"href": f"{url}#pullrequestreview-{r.id}"},
            "pull_request": {"href": repo_url(st, f"/pulls/{r.number}")},
        },
        "submitted_at": iso(r.submitted_at),
        "commit_id": r.commit_id,
        "author_association": st.association(r.user),
    }


# checks and statuses -----------------------------------------------------------------------


def check_run(st: State, run: CheckRun) -> dict[str, Any]:
    """A check run; without a details_url of its own GitHub shows the App's homepage."""
    url, app = repo_url(st, f"/check-runs/{run.id}"), integration(st)
    return {
        "id": run.id,
        "node_id": node("CR", run.id),
        "head_sha": run.head_sha,
        "external_id": run.external_id,
        "url": url,
        "html_url": html_url(st, f"/runs/{run.id}"),
        "details_url": run.details_url or app["external_url"],
        "status": run.status,
        "conclusion": run.conclusion,
        "started_at": iso(run.started_at),
        "completed_at": iso(run.completed_at),
        "name": run.name,
        "output": {
            "title": run.output.get("title"),
            "summary": run.output.get("summary"),
            "text": run.output.get("text"),
            "annotations_count": 0,
            "annotations_url": f"{url}/annotations",
        },
        "check_suite": {"id": run.suite_id},
        "app": app,
        "pull_requests": [
            pull_minimal(st, p) for p in st.pulls.values() if p.state == "open" and p.head_sha == run.head_sha
        ],
    }


def status(st: State, s: Status) -> dict[str, Any]:
    return {
        "url": repo_url(st, f"/statuses/{s.sha}"),
        "avatar_url": f"{st.base_url}/_avatars/{st.user_id(s.creator)}",
        "id": s.id,
        "node_id": node("SC", s.id),
        "state": s.state,
        "description": s.description,
        "target_url": s.target_url,
        "context": s.context,
        "created_at": iso(s.created_at),
        "updated_at": iso(s.created_at),
        "creator": user(st, s.creator),
    }


def combined_status(st: State, sha: str) -> dict[str, Any]:
    latest: dict[str, Status] = {}
    for s in st.statuses:
        if s.sha == sha:
            latest[s.context] = s
    states = {s.state for s in latest.values()}
    state = (
        "failure" if states & {"error", "failure"} else "pending" if "pending" in states or not states else "success"
    )
    slim = [{k: v for k, v in status(st, s).items() if k != "creator"} for s in latest.values()]
    return {
        "state": state,
        "sha": sha,
        "total_count": len(slim),
        "statuses": slim,
        "repository": repository(st),
        "commit_url": repo_url(st, f"/commits/{sha}"),
        "url": repo_url(st, f"/commits/{sha}/status"),
    }
