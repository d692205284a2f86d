"""`autoresearch serve --poll`: for a bot that GitHub cannot reach (behind NAT, no public URL), read
through the REST API what webhooks would have said, and store the same GitHubEvent entries in the
inbox, so the same handlers (bot.github.handlers) act on them.

Each poll asks, in this order (the pull requests first: the other two read what they learn):

1. `GET /repos/{o}/{r}/pulls?state=all&sort=updated&direction=desc&per_page=100` (one page). Each
   pull request from an `autoresearch/` branch of this repository is compared with the state seen
   last (store.state.poller_pulls): open -> closed is pr_closed (`merged` from
   `merged_at`), closed -> open is pr_reopened. The list does not say who closed or reopened a pull
   request, so for each such change (and only then) the poller asks the issue's events,
   `GET /repos/{o}/{r}/issues/{n}/events?per_page=100`, and the sender is the `actor` of the newest
   `closed` (or `reopened`) event, as a webhook's `sender` would be; the handler then checks that
   person's write access as it does in webhook mode. The list runs oldest first: when it has more
   than one page (its Link header names a last page) the last page is read too (one more request;
   a change followed inside one interval by so many events that it falls before the last page names
   nobody).
   A merge needs no sender (the handler acts on no merged close, whoever merged), so it costs no
   request. No such event found (a deleted account's actor is null): sender None, and the handler
   obeys nobody. Delivery `poll-pr-<number>-<state>-<updated_at>`. A close and a reopen inside one
   interval cancel out and are not seen; more than 100 pull requests updated inside one interval are
   not all seen.
2. `GET /repos/{o}/{r}/issues/comments?since=<cursor>&sort=updated&direction=asc&per_page=100`:
   each comment becomes command (when parse_command finds one) or feedback, delivery
   `poll-comment-<id>`, so a comment read again is stored once. An edit shows the comment again
   with the same id: not stored again, as in webhook mode. The comment is on a pull request when its
   `html_url` says `/pull/` or its number is a pull request seen in (1); on a plain issue it is a
   command or nothing (as webhooks.normalize decides for `issue_comment` without `pull_request`),
   answered on that issue (`/pause` in a tracking issue). This one list covers comments on plain
   issues and pull requests alike, so plain issues cost no request of their own.
3. `GET /repos/{o}/{r}/pulls/{n}/reviews?per_page=100` for each open autoresearch pull request
   (its first 100 reviews): each submitted review with a body becomes feedback or a command,
   delivery `poll-review-<id>`.

The payloads go through webhooks.normalize as the matching webhook deliveries would (issue_comment
created, pull_request_review submitted, pull_request closed/reopened, the head's repository
included): one place decides what a comment means, and the same handler decides who may steer, on
which repository and pull request, so both paths give the same verdicts. Nothing from before the poller first ran is replayed: the store keeps that moment
(`poller.horizon`), and comments created, reviews submitted and pull requests closed before it are
skipped (a fresh bot does not act on a repository's old chatter).

Not polled, because only webhooks carry them: a check run's "Re-run" (check_run.rerequested) and its
buttons (check_run.requested_action). In poll mode people use the `/rerun`, `/keep` and `/discard`
comments instead. Inline review comments (pull_request_review_comment) are not read either. Pushes
need no event: the conductor reads main's head every tick.

Conditional requests. Every GET sends `If-None-Match` with the ETag of the last answer to the same
URL; GitHub answers 304 without a body, and a 304 does not count against the rate limit. So the
comment cursor stays where it is while the answer fits on one page (the URL stays the same, and
"nothing new" is a free 304); it moves to the newest comment read only when a poll had to read
more than one page. An ETag is remembered only after its answer was fully stored: an answer that
failed half-way is read again in full. ETags live in memory (a restart reads everything once);
the cursors live in the store. An issue's events are asked only after a change, so their answer is
nearly always new; the poller still sends the ETag it holds and keeps what it read beside it, so a
poll that has to ask again (the last one failed before its entries were stored) gets a free 304.
Not for a list of more than one page: its first page stays the same while new events are added.

Budget. A poll costs 2 requests plus 1 per open autoresearch pull request, plus 1 per close or
reopen of an experiment's pull request that is not a merge (2 when its events run over a page):
with one open pull request and the default 60 s interval, 3 requests a minute, about 180 an hour
of the 5,000 an hour a token gets (an App installation gets at least as many), and 304s are free.
Each poll logs how many requests it made and how many were 304s.

Failures. The client (bot.github.client) already retries a GET on a 5xx or a lost answer. What is
left (GitHub down for longer, a timeout, a full disk) fails only that part of the poll: it is
logged, the cursors never move past what was stored, and the next poll tries again. `run()` never
raises.

Requests go through the client's PyGithub Requester (`gh.requester.requestJson`), so sign-in, the
retry policy, the base URL and health are the client's; there is no second HTTP client.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import requests
from github import GithubException

from bot.github.client import GitHubClient
from bot.github.handlers import BRANCH_PREFIX
from bot.github.webhooks import GitHubEvent, MalformedPayload, normalize
from bot.store import Store

log = logging.getLogger(__name__)

PER_PAGE = 100  # GitHub's largest page
MAX_PAGES = 10  # pages of comments read in one poll
STATE_CHANGES = ("closed", "reopened")  # the issue events that name who closed or reopened a pull request


class PollError(RuntimeError):
    """GitHub answered a poll's request with an error (after the client's own retries)."""


# what a poll can meet on a bad day (GitHub down, a timeout, a locked or full store): logged in a line
EXPECTED = (PollError, GithubException, requests.RequestException, OSError, sqlite3.Error)


@dataclass
class PollReport:
    """What one poll did; the last one is `Poller.last_report`."""

    requests: int = 0
    not_modified: int = 0  # answered 304: free
    stored: int = 0  # new inbox entries
    errors: list[str] = field(default_factory=list)


@dataclass
class _Answer:
    status: int
    data: Any  # the JSON body; None for a 304
    key: str  # the URL with its query: what the ETag belongs to
    etag: str | None
    link: str = ""  # the Link header (pages)


class Poller:
    """Reads GitHub every `interval_s` and stores what webhooks would have delivered.

    `store` is the poller's own connection (open one for the thread that runs it); `wake()` is called
    after a poll stored anything, so the conductor looks at the inbox now. `now` gives the time the
    horizon is taken from (UTC)."""

    def __init__(
        self,
        client: GitHubClient,
        store: Store,
        *,
        interval_s: float,
        wake: Callable[[], None] = lambda: None,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.client = client
        self.store = store
        self.wake = wake
        self.interval_s = interval_s
        self.repository = client.settings.repository
        self.last_report: PollReport | None = None
        self._now = now
        self._etags: dict[str, str] = {}
        self._state_changes: dict[str, list[dict[str, Any]]] = {}  # an events URL -> its closed/reopened events
        self._asked: set[str] = set()  # URLs asked in this poll: the ETags worth keeping
        self._report = PollReport()

    # --- the loop ---------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Poll until `stop` is set, one poll every `interval_s` (start to start). Never raises."""
        log.info("polling GitHub for %s every %.0f s (no webhooks)", self.repository, self.interval_s)
        while not stop.is_set():
            started = time.monotonic()
            try:
                self.poll_once()
            except Exception:  # noqa: BLE001 - a bug in one poll must not end polling
                log.exception("a poll of GitHub failed unexpectedly; the next one tries again")
            stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def poll_once(self) -> int:
        """One poll of every source; the number of new inbox entries. A source that fails is logged
        and left for the next poll (see `last_report.errors`); the others still run."""
        self._report, self._asked = PollReport(), set()
        horizon = self._horizon()
        pulls = self._source("pull requests", lambda: self._poll_pulls(horizon))
        self._source("comments", lambda: self._poll_comments(horizon, pulls or self._known_pulls()))
        self._source("reviews", lambda: self._poll_reviews(horizon, pulls or self._known_pulls()))
        self._etags = {key: tag for key, tag in self._etags.items() if key in self._asked}
        self._state_changes = {key: seen for key, seen in self._state_changes.items() if key in self._etags}
        report = self.last_report = self._report
        log.info(
            "polled GitHub: %d requests, %d answered 304 (free), %d new events%s",
            report.requests,
            report.not_modified,
            report.stored,
            f", {len(report.errors)} failed" if report.errors else "",
        )
        if report.stored:
            try:
                self.wake()
            except Exception:  # noqa: BLE001 - the entries are stored: the conductor finds them on its timer
                log.exception("events stored, but waking the conductor failed")
        return report.stored

    def _source(self, name: str, poll: Callable[[], Any]) -> Any:
        try:
            return poll()
        except Exception as error:  # noqa: BLE001 - one failed source must not stop the others
            what = f"{name}: {type(error).__name__}: {error}"
            self._report.errors.append(what)
            if isinstance(error, EXPECTED):
                log.warning("polling GitHub's %s failed (%s); the next poll tries again", name, what)
            else:  # a bug: with its traceback
                log.exception("polling GitHub's %s failed; the next poll tries again", name)
            return None

    # --- (1) pull requests closed or reopened -----------------------------------------------------

    def _poll_pulls(self, horizon: datetime) -> dict[int, dict[str, Any]]:
        answer = self._get(
            f"{self._repo_path()}/pulls", {"state": "all", "sort": "updated", "direction": "desc", "per_page": PER_PAGE}
        )
        known = self._known_pulls()
        if answer.data is None:  # 304: nothing changed since the last answer
            return known
        for pull in _objects(answer.data, "pull requests"):
            seen = self._experiment_pull(pull)
            if seen is None:
                continue
            number, state = pull["number"], seen["state"]
            before = known.get(number)
            if before is None:
                changed = state == "closed" and _after(pull.get("closed_at"), horizon)
            else:
                changed = before["state"] != state
            if changed:
                self._store(self._pull_event(pull, seen))
            known[number] = seen
        self.store.state.poller_pulls = {str(n): v for n, v in sorted(known.items())}
        self._remember(answer)
        return known

    def _experiment_pull(self, pull: Any) -> dict[str, Any] | None:
        """{state, branch, sha} of a pull request from an autoresearch/ branch of this repository."""
        head = pull.get("head") if isinstance(pull, dict) else None
        if not isinstance(head, dict) or not isinstance(pull.get("number"), int):
            return None
        branch, repo = head.get("ref"), head.get("repo")
        if not isinstance(branch, str) or not branch.startswith(BRANCH_PREFIX):
            return None
        if not isinstance(repo, dict) or str(repo.get("full_name", "")).lower() != self.repository.lower():
            return None  # a fork's branch of the same name (or a deleted fork's: no repo) is not the bot's experiment
        return {"state": pull.get("state"), "branch": branch, "sha": head.get("sha")}

    def _pull_event(self, pull: dict[str, Any], seen: dict[str, Any]) -> GitHubEvent | None:
        number, action = pull["number"], "closed" if seen["state"] == "closed" else "reopened"
        merged = pull.get("merged_at") is not None
        sender = None if merged else self._changed_by(number, action)
        payload = {
            "action": action,
            "pull_request": {"number": number, "merged": merged, "head": self._head(seen)},
            "sender": sender,
            **self._repository(),
        }
        delivery = f"poll-pr-{number}-{seen['state']}-{pull.get('updated_at')}"
        return _normalize("pull_request", delivery, payload)

    def _changed_by(self, number: int, action: str) -> dict[str, Any] | None:
        """The `actor` (a user object, as a webhook's `sender`) of the newest `action` event
        (closed, reopened) of issue `number`, from its events list; None when there is none."""
        path, params = f"{self._repo_path()}/issues/{number}/events", {"per_page": PER_PAGE}
        first = self._get(path, params)
        if first.data is None:  # 304: the same list as when it was last read
            changes = self._state_changes.get(first.key, [])
        else:
            page = first
            last = _last_page(first.link)
            if last is not None and last > 1:  # oldest first: the newest events are on the last page
                page = self._get(path, {**params, "page": last}, conditional=False)
            changes = [e for e in _objects(page.data, "issue events") if e.get("event") in STATE_CHANGES]
            if page is first:  # a first page that is not the only one stays the same as events are added
                self._state_changes[first.key] = changes
                self._remember(first)
        actor = next((e.get("actor") for e in reversed(changes) if e.get("event") == action), None)
        if not isinstance(actor, dict):
            log.warning(
                "GitHub's events of #%s name nobody who %s it: no one's %s is obeyed",
                number,
                action,
                "close" if action == "closed" else "reopen",
            )
            return None
        return actor

    def _known_pulls(self) -> dict[int, dict[str, Any]]:
        return {int(number): seen for number, seen in self.store.state.poller_pulls.items()}

    # --- (2) comments -----------------------------------------------------------------------------

    def _poll_comments(self, horizon: datetime, pulls: dict[int, dict[str, Any]]) -> None:
        since = self.store.state.poller_comments_since or _iso(horizon)
        for _ in range(MAX_PAGES):
            answer = self._get(
                f"{self._repo_path()}/issues/comments",
                {"since": since, "sort": "updated", "direction": "asc", "per_page": PER_PAGE},
            )
            if answer.data is None:
                return
            comments = _objects(answer.data, "comments")
            for comment in comments:
                if _after(comment.get("created_at"), horizon):
                    self._store(self._comment_event(comment, pulls))
            self._remember(answer)
            if len(comments) < PER_PAGE:
                return
            # A full page: read on from the newest comment read. A cursor rather than page numbers, so
            # a comment edited meanwhile cannot shift another out of sight, and it is saved as it moves,
            # so the URL asked last (whose ETag is kept) is the one the next poll asks.
            newest = comments[-1].get("updated_at")
            if not isinstance(newest, str) or newest == since:
                log.warning("over %d comments updated at %s: some of them are not read", PER_PAGE, since)
                return
            since = newest
            self.store.state.poller_comments_since = since

    def _comment_event(self, comment: dict[str, Any], pulls: dict[int, dict[str, Any]]) -> GitHubEvent | None:
        number = _number_of(comment.get("issue_url"))
        if number is None:
            log.warning(
                "comment %s names no issue (issue_url %r); skipped", comment.get("id"), comment.get("issue_url")
            )
            return None
        issue: dict[str, Any] = {"number": number}
        if "/pull/" in str(comment.get("html_url", "")) or number in pulls:
            issue["pull_request"] = {"number": number}  # webhooks.normalize asks only whether it is there
        payload = {
            "action": "created",
            "issue": issue,
            "comment": comment,
            "sender": comment.get("user"),
            **self._repository(),
        }
        return _normalize("issue_comment", f"poll-comment-{comment.get('id')}", payload)

    # --- (3) reviews ------------------------------------------------------------------------------

    def _poll_reviews(self, horizon: datetime, pulls: dict[int, dict[str, Any]]) -> None:
        # The first page only: an experiment's pull request with over 100 reviews is not expected.
        for number, seen in sorted(pulls.items()):
            if seen.get("state") != "open":
                continue
            answer = self._get(f"{self._repo_path()}/pulls/{number}/reviews", {"per_page": PER_PAGE})
            if answer.data is None:
                continue
            for review in _objects(answer.data, "reviews"):
                if review.get("state") != "PENDING" and _after(review.get("submitted_at"), horizon):
                    self._store(self._review_event(review, number, seen))
            self._remember(answer)

    def _review_event(self, review: dict[str, Any], number: int, seen: dict[str, Any]) -> GitHubEvent | None:
        payload = {
            "action": "submitted",
            "review": review,
            "sender": review.get("user"),
            "pull_request": {"number": number, "head": self._head(seen)},
            **self._repository(),
        }
        return _normalize("pull_request_review", f"poll-review-{review.get('id')}", payload)

    # --- the inbox ------------------------------------------------------------------------------

    def _store(self, event: GitHubEvent | None) -> None:
        """Store one event under `github:<delivery>` (the delivery id is its idempotency key: the same
        comment, review or state change read again is stored once); ignored kinds are not stored."""
        if event is None or event.kind == "ignored":
            return
        if self.store.inbox.add(
            key=f"github:{event.delivery}", kind="github", payload=event.to_payload(), author=event.sender or "github"
        ):
            self._report.stored += 1
            log.info("stored %s.%s (%s) as %s", event.event, event.action or "-", event.delivery, event.kind)

    # --- requests -------------------------------------------------------------------------------

    def _get(self, path: str, params: dict[str, Any], *, conditional: bool = True) -> _Answer:
        """GET through the client's Requester, with If-None-Match when this URL was answered before."""
        key = path + ("?" + "&".join(f"{k}={params[k]}" for k in sorted(params)) if params else "")
        headers: dict[str, str] = {"Accept": "application/vnd.github+json"}
        if conditional:
            self._asked.add(key)
            if key in self._etags:
                headers["If-None-Match"] = self._etags[key]
        self._report.requests += 1
        status, answer_headers, body = self.client.gh.requester.requestJson("GET", path, params, headers)
        if status == 304:
            self._report.not_modified += 1
            return _Answer(304, None, key, self._etags.get(key))
        if status >= 400 or status < 200:
            raise PollError(f"GET {path} answered HTTP {status}")
        try:
            data = json.loads(body) if body else None
        except ValueError:
            raise PollError(f"GET {path} answered HTTP {status} with a body that is not JSON") from None
        if data is None:
            raise PollError(f"GET {path} answered HTTP {status} without a body")
        return _Answer(
            status, data, key, answer_headers.get("etag") if conditional else None, answer_headers.get("link") or ""
        )

    def _remember(self, answer: _Answer) -> None:
        """Keep the answer's ETag: called once everything in the answer is stored."""
        if answer.etag:
            self._etags[answer.key] = answer.etag

    # --- small things -----------------------------------------------------------------------------

    def _horizon(self) -> datetime:
        stored = self.store.state.poller_horizon
        if stored:
            return _parse(stored) or self._now()
        now = self._now().astimezone(UTC).replace(microsecond=0)
        self.store.state.poller_horizon = _iso(now)
        log.info("polling starts at %s: nothing from before it is replayed", _iso(now))
        return now

    def _repo_path(self) -> str:
        return f"/repos/{self.repository}"

    def _repository(self) -> dict[str, Any]:
        return {"repository": {"full_name": self.repository}}

    def _head(self, seen: dict[str, Any]) -> dict[str, Any]:
        """A pull request's head as a webhook carries it: only pull requests whose head is on this
        repository are polled (`_experiment_pull`), so its repository is this one."""
        return {"ref": seen["branch"], "sha": seen["sha"], "repo": {"full_name": self.repository}}


def _normalize(event: str, delivery: str, payload: dict[str, Any]) -> GitHubEvent | None:
    """The event webhooks.normalize makes of the delivery this payload stands for; None (logged) when
    GitHub's answer lacks a field it needs, so one odd item does not hold up the rest."""
    try:
        return normalize(event, delivery, payload)
    except MalformedPayload as error:
        log.warning("skipped %s: %s", delivery, error)
        return None


def _objects(data: Any, what: str) -> list[dict[str, Any]]:
    if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
        raise PollError(f"GitHub's list of {what} is not a list of objects")
    return data


def _last_page(link: str) -> int | None:
    """The page number of `rel="last"` in a Link header, None when it names none."""
    for part in link.split(","):
        if 'rel="last"' in part:
            query = part.split(">", 1)[0].split("?", 1)[-1]
            for pair in query.split("&"):
                name, _, value = pair.partition("=")
                if name == "page" and value.isdigit():
                    return int(value)
    return None


def _number_of(issue_url: Any) -> int | None:
    tail = str(issue_url or "").rstrip("/").rsplit("/", 1)[-1]
    return int(tail) if tail.isdigit() else None


def _parse(text: Any) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _after(text: Any, horizon: datetime) -> bool:
    """True when the ISO time `text` is at or after the horizon (a time GitHub left out counts as new)."""
    when = _parse(text)
    return when is None or when >= horizon


def _iso(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
