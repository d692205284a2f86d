"""GitHubStandIn: a GitHub for one repository, on loopback, for end-to-end tests.

It owns the lifecycle (uvicorn in a background thread on a free port: loopback.py), the knobs a
test turns (webhook target, faults, the clock), what a test reads back (requests, deliveries, OpenAPI
violations, the state as GitHub's JSON), and the things people do on github.com (comment, review,
close, reopen, open and close an issue, push a file with git, re-run a check, press a check-run
button).

    with GitHubStandIn(tmp_path, files={"train.py": "..."}) as gh:
        g = github.Github(auth=github.Auth.Token("tok-bot"), base_url=gh.api_url)
        ...
        assert gh.violations == []
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from loopback import LoopbackServer

from . import api, openapi
from . import payloads as P
from .actions import Actions
from .auth import Auth
from .faults import Faults
from .gateway import Gateway, RequestRecord
from .gitrepo import hermetic_env
from .state import State
from .webhooks import Delivery, Hookshot

APP_PERMISSIONS = {
    "checks": "write",
    "contents": "write",
    "issues": "write",
    "metadata": "read",
    "pull_requests": "write",
    "statuses": "write",
}
APP_EVENTS = ["check_run", "issue_comment", "pull_request", "pull_request_review", "push"]


class GitHubStandIn:
    def __init__(
        self,
        root: Path | str,
        owner: str = "octo-org",
        repo: str = "research",
        *,
        files: dict[str, str | bytes] | None = None,
        token_users: dict[str, str] | None = None,
        collaborators: dict[str, str] | None = None,
        members: set[str] | frozenset[str] = frozenset(),
        private: bool = False,
        owner_type: str = "Organization",
        app_id: int = 1,
        app_slug: str = "autoresearch-bot",
        app_public_key: Any = None,
        installation_id: int = 1001,
        token_lifetime: float = 3600.0,
        rate_limit: int = 5000,
        actions_runners: int = 1,
    ):
        """`token_users` maps tokens to logins (a login ending in [bot] is an App installation);
        `collaborators` maps logins to a role (admin, maintain, write, triage, read); `members`
        are organization members; `app_public_key` (PEM or key object) verifies App JWTs;
        `actions_runners` emulated self-hosted runners execute dispatched workflow runs (`actions`)."""
        self.root = Path(root)
        self.state = State(
            self.root,
            owner,
            repo,
            files or {},
            collaborators=dict(collaborators or {}),
            members=set(members),
            private=private,
            owner_type=owner_type,
        )
        self.state.app = {
            "id": app_id,
            "slug": app_slug,
            "installation_id": installation_id,
            "public_key": app_public_key,
            "client_id": f"Iv1.{app_id:016x}",
            "permissions": APP_PERMISSIONS,
            "events": APP_EVENTS,
        }
        users = {"tok-bot": f"{app_slug}[bot]"} if token_users is None else token_users
        self.auth = Auth(self.state.clock, users, self.state.app, token_lifetime, rate_limit)
        self.spec = openapi.load()
        self.faults = Faults()
        self.gateway = Gateway(self.auth, self.spec, self.faults, owner, repo)
        self.hookshot = Hookshot(self._check_webhook, ("integration", app_id))
        self.state.sink = self.hookshot.emit
        self.actions = Actions(self.state, self.root, runners=actions_runners)
        self._server: LoopbackServer | None = None

    # lifecycle ------------------------------------------------------------------------------

    def start(self) -> GitHubStandIn:
        self._server = LoopbackServer(name="standin-uvicorn")
        self.state.base_url = self._server.base_url
        self._server.start(api.build(self.state, self.auth, self.gateway, self.actions))
        return self

    def stop(self) -> None:
        self.gateway.stopping.set()
        self.actions.stop()
        if self._server is not None:
            self._server.stop()
        self.hookshot.close()

    def __enter__(self) -> GitHubStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def api_url(self) -> str:
        """The base_url for PyGithub: the REST API is served at the root, like api.github.com."""
        return self.state.base_url

    @property
    def git_url(self) -> str:
        return f"{self.state.base_url}/_git/{self.state.owner}/{self.state.name}.git"

    # knobs and logs -------------------------------------------------------------------------

    def hook(self, url: str, secret: str, events: set[str] | None = None) -> None:
        """Deliver webhooks to `url`, signed with `secret` (all events, or only `events`)."""
        self.hookshot.configure(url, secret, events)

    @property
    def deliveries(self) -> list[Delivery]:
        return list(self.hookshot.deliveries)

    def redeliver(self, delivery_id: str) -> Delivery:
        return self.hookshot.redeliver(delivery_id)

    def wait_deliveries(self, timeout: float = 10.0) -> None:
        self.hookshot.wait(timeout)

    def inject(
        self, method: str, path_regex: str, kind: str, times: int = 1, apply_first: bool = False, seconds: float = 2.0
    ) -> None:
        """Answer the next `times` matching requests with a fault (see faults.py for the kinds)."""
        self.faults.inject(method, path_regex, kind, times, apply_first, seconds)

    @property
    def requests(self) -> list[RequestRecord]:
        return list(self.gateway.requests)

    def calls(self, method: str | None = None, pattern: str | None = None) -> list[RequestRecord]:
        return [
            r
            for r in self.gateway.requests
            if method in (None, r.method) and (pattern is None or re.search(pattern, r.path))
        ]

    @property
    def violations(self) -> list[str]:
        return list(self.gateway.violations)

    def take_violations(self) -> list[str]:
        """The violations so far, forgetting them (for tests that provoke one on purpose)."""
        taken = list(self.gateway.violations)
        self.gateway.violations.clear()
        return taken

    def advance(self, seconds: float) -> None:
        """Move the stand-in's clock on (installation tokens expire, rate-limit windows reset)."""
        self.state.clock.offset += seconds

    def token_for(self, login: str) -> str:
        """A personal access token of `login`, made on first use."""
        return self.auth.token_for(login)

    def _check_webhook(self, event: str, body: dict[str, Any]) -> None:
        for error in self.spec.webhook_errors(event, body):
            self.gateway.violation(error)

    # what people do on github.com -----------------------------------------------------------

    def comment(self, number: int, user: str, body: str) -> int:
        return self.state.add_comment(number, user, body).id

    def review(self, number: int, user: str, body: str, state: str = "commented") -> int:
        return self.state.add_review(number, user, body, state).id

    def close_pr(self, number: int, user: str) -> None:
        self.state.close_pull(number, user)

    def reopen_pr(self, number: int, user: str) -> None:
        self.state.reopen_pull(number, user)

    def open_issue(self, user: str, title: str, body: str | None = None, labels: list[str] | None = None) -> int:
        """A person opens an issue (labels only stick with push access, as on GitHub); its number."""
        return self.state.open_issue(user, title, body, list(labels or [])).number

    def close_issue(self, number: int, user: str, reason: str = "completed") -> None:
        self.state.close_issue(number, user, reason)

    def reopen_issue(self, number: int, user: str) -> None:
        self.state.reopen_issue(number, user)

    def delete_issue(self, number: int) -> None:
        """An admin deletes the issue: GitHub answers 410 Gone for it from then on."""
        self.state.delete_issue(number)

    def rerequest_check(self, check_run_id: int, user: str) -> None:
        self.state.rerequest_check(check_run_id, user)

    def request_action(self, check_run_id: int, identifier: str, user: str) -> None:
        self.state.request_action(check_run_id, identifier, user)

    def push_file(self, path: str, text: str, user: str, message: str, branch: str = "main") -> str:
        """Clone over smart HTTP with the git CLI, commit `text` at `path` as `user`, push to
        `branch`; the new commit's sha. Exercises git-http-backend and the push webhook."""
        scratch = self.root / "clones"
        scratch.mkdir(exist_ok=True)
        work = Path(tempfile.mkdtemp(dir=scratch)) / "repo"
        remote = self.git_url.replace("://", f"://{user}:{self.auth.token_for(user)}@")
        email = f"{user}@users.noreply.github.com"
        env = hermetic_env(
            GIT_TERMINAL_PROMPT="0",
            GIT_AUTHOR_NAME=user,
            GIT_COMMITTER_NAME=user,
            GIT_AUTHOR_EMAIL=email,
            GIT_COMMITTER_EMAIL=email,
        )

        def git(*args: str, cwd: Path = work) -> str:
            done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"git {args[0]} failed: {done.stderr.strip()}")
            return done.stdout.strip()

        git("clone", "-q", remote, str(work), cwd=scratch)
        if self.ref(f"heads/{branch}"):
            git("checkout", "-q", "-B", branch, f"origin/{branch}")
        else:
            git("checkout", "-q", "-b", branch)
        target = work / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        git("add", "--", path)
        git("commit", "-q", "-m", message)
        git("push", "-q", "origin", f"HEAD:refs/heads/{branch}")
        return git("rev-parse", "HEAD")

    # what a test reads back (GitHub's JSON) --------------------------------------------------

    def pulls(self) -> list[dict[str, Any]]:
        with self.state.lock:
            return [P.pull_request(self.state, p) for p in self.state.pulls.values()]

    def issues(self) -> list[dict[str, Any]]:
        """The issues that are not pull requests, oldest first."""
        with self.state.lock:
            return [P.plain_issue(self.state, i) for i in self.state.issues.values()]

    def comments(self, number: int) -> list[dict[str, Any]]:
        with self.state.lock:
            return [P.comment(self.state, c) for c in self.state.comments.values() if c.number == number]

    def check_runs(self, sha: str | None = None) -> list[dict[str, Any]]:
        with self.state.lock:
            return [P.check_run(self.state, r) for r in self.state.check_runs.values() if sha in (None, r.head_sha)]

    def statuses(self, sha: str) -> list[dict[str, Any]]:
        with self.state.lock:
            return [P.status(self.state, s) for s in self.state.statuses if s.sha == sha]

    def labels(self, number: int) -> list[str]:
        """The label names of a pull request or an issue."""
        with self.state.lock:
            item = self.state.issues.get(number) or self.state.pull(number)
            return list(item.labels)

    def reactions(self, comment_id: int) -> list[dict[str, Any]]:
        with self.state.lock:
            return [P.reaction(self.state, r) for r in self.state.reactions.values() if r.comment_id == comment_id]

    def ref(self, name: str) -> str | None:
        """The sha a ref points at ("heads/main", "refs/heads/main" or "main"), or None."""
        refs = self.state.refs()
        for candidate in (name, f"refs/{name}", f"refs/heads/{name}"):
            if candidate in refs:
                return refs[candidate]
        return None

    def read(self, ref: str, path: str) -> str | None:
        """A file's text at a branch or commit, or None when it is not there."""
        with self.state.lock:
            sha = self.state.repo.resolve(ref)
            entry = self.state.repo.entry(sha, path) if sha else None
            return self.state.repo.read_blob(entry.sha).decode() if entry and entry.type == "blob" else None
