"""The research log: one issue per repository whose body the bot keeps as the summary of the research
so far (bot.views.research_log writes its text from the read model), edited in place, never
commented on, so watching it costs nobody a notification per experiment.

Level-triggered like the publisher: each update renders the summary from the store and writes only
when the text differs from what was last written (its digest, kept with the issue's number in the
store as store.state.research_log). The "Updated ..." line at its end is left out of the digest,
or every tick would differ. Writes are paced: at most one edit every `every_s` seconds, unless a
change was kept since (the news the log exists for: a new best, a new row), so neither a busy run
nor a stream of discarded and crashed experiments edits the issue at every tick: their counts wait
at most `every_s`. So the log costs at most 3600 / every_s edits an hour (12 at 300 s) plus one per
kept change, however many experiments finish.

The issue is found again before it is ever created (its idempotency key is the hidden marker
`<!-- autoresearch:log:0 -->` under the label `autoresearch: log`): by the number in the store,
else by one request listing the open and closed issues with that label (only one the bot itself
opened counts: anyone can quote the marker, and a triager can label). So neither a lost answer
to the create (a 502 after GitHub made the issue) nor a lost store makes a second one. A person
who closes the issue is respected: its body is kept up to date, it is never reopened.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from github import GithubException
from github.Repository import Repository

from bot.github import render
from bot.store import Store
from bot.views.read_model import view_of
from bot.views.research_log import Facts, content_digest, facts, log_text

__all__ = ["LABEL", "TITLE", "ResearchLog", "log_body"]

log = logging.getLogger(__name__)

TITLE = "autoresearch: research log"
LABEL = render.Label("autoresearch: log", "1d76db", "The research log: one issue the bot keeps up to date")
MARKER = render.marker("log", 0)
BODY_LIMIT = render.PR_BODY_LIMIT  # an issue body's limit too: 65,536 characters


def log_body(f: Facts, now: float) -> str:
    """The issue body: its marker, then the summary within GitHub's 65,536 characters, with exactly
    one marker (the summary's titles are defanged)."""
    return f"{MARKER}\n" + log_text(f, now, BODY_LIMIT - len(MARKER.encode()) - 1)


# --- the issue on GitHub --------------------------------------------------------------------------


class ResearchLog:
    def __init__(
        self,
        store: Store,
        repo: Repository,
        *,
        pace_write: Callable[[str], object] = lambda what: 0.0,
        clock: Callable[[], float] = time.time,
        every_s: float = 300.0,
    ) -> None:
        self.store = store
        self.repo = repo
        self.pace_write = pace_write
        self.clock = clock
        self.every_s = every_s

    def update(self) -> None:
        """Bring the issue up to date: create it once, else edit its body when the text changed
        (and the last edit is `every_s` old, or a change was kept since); nothing otherwise."""
        saved = self.store.state.research_log
        now = self.clock()
        kept = self.store.experiments.counts_by_status().get("keep", 0)
        number = saved.get("number")
        if number and saved.get("kept") == kept and now - float(saved.get("edited_at", 0.0)) < self.every_s:
            return  # paced: the next edit waits for a kept change or the end of the interval
        body = log_body(facts(view_of(self.store), now), now)
        digest = content_digest(body)
        if number and saved.get("digest") == digest:
            return
        if number and self._edit(int(number), body):
            self._save(int(number), digest, now, kept)
            return
        if number:
            log.info("research log #%s is gone (deleted or moved): looking for it by its marker", number)
        found = self._find()
        if found is None:
            self._create(body, digest, now, kept)
            return
        number, text = found
        if content_digest(text) != digest and not self._edit(number, body):
            raise RuntimeError(
                f"research log #{number} vanished while it was being edited; it is looked for again at the next update"
            )
        self._save(number, digest, now, kept)

    # --- the store ---------------------------------------------------------------------------------
    def _save(self, number: int, digest: str, now: float, kept: int) -> None:
        self.store.state.research_log = {"number": number, "digest": digest, "edited_at": now, "kept": kept}

    # --- GitHub ------------------------------------------------------------------------------------
    def _find(self) -> tuple[int, str] | None:
        """The oldest open or closed issue (not a pull request) with the label and the marker that
        the bot itself opened, in one request: a person can label an issue and quote the marker."""
        _, issues = self.repo.requester.requestJsonAndCheck(
            "GET",
            f"{self.repo.url}/issues",
            parameters={"state": "all", "labels": LABEL.name, "sort": "created", "direction": "asc", "per_page": 100},
        )
        for issue in issues:
            author = (issue.get("user") or {}).get("login")
            if (
                "pull_request" not in issue
                and render.find_marker(issue.get("body")) == ("log", 0, "")
                and render.authored_by(author, self.store.state.bot_login)
            ):
                return int(issue["number"]), issue.get("body") or ""
        return None

    def _create(self, body: str, digest: str, now: float, kept: int) -> None:
        self._ensure_label()
        self.pace_write("log")
        issue = self.repo.create_issue(title=TITLE, body=body, labels=[LABEL.name])
        self._save(issue.number, digest, now, kept)
        log.info("opened the research log as issue #%s", issue.number)

    def _edit(self, number: int, body: str) -> bool:
        """One PATCH of the body (never its state: a closed log stays closed); False when it is gone."""
        self.pace_write("log")
        try:
            self.repo.requester.requestJsonAndCheck("PATCH", f"{self.repo.url}/issues/{number}", input={"body": body})
        except GithubException as error:
            if error.status in (404, 410):
                return False
            raise
        return True

    def _ensure_label(self) -> None:
        try:
            self.repo.get_label(LABEL.name)
        except GithubException as error:
            if error.status != 404:
                raise
            self.pace_write("label")
            try:
                self.repo.create_label(LABEL.name, LABEL.color, LABEL.description)
            except GithubException as again:
                if again.status != 422:  # 422: someone created it meanwhile
                    raise
