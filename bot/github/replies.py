"""The answers the bot owes to people's /commands (the store's replies): a +1 reaction on the command's
comment and a reply (its key: the hidden ack marker, looked for among the bot's own comments, so
none is posted twice). Each answer goes on its own: one that GitHub refuses (4xx) is given up with a
log line and an event, one that keeps failing on GitHub's side (5xx, no answer) after REPLY_TRIES
passes; no answer holds up the others. Posted by the publisher at the start of each pass, each
write waiting for room in the write budget (`pace_write`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import requests
from github import GithubException, RateLimitExceededException
from github.Repository import Repository

from bot.github import render
from bot.store import Store

__all__ = ["REPLY_TRIES", "Replies"]

log = logging.getLogger(__name__)

REPLY_TRIES = 5  # passes a reply is tried when GitHub fails (5xx, no answer) before it is given up


class Replies:
    def __init__(self, store: Store, repo: Repository, *, pace_write: Callable[[str], object]) -> None:
        self.store = store
        self.repo = repo
        self.pace_write = pace_write
        self._reply_failures: dict[int, int] = {}  # command comment id -> passes its reply failed (this process)

    def post(self) -> None:
        """Each queued answer on its own: one that GitHub refuses (a 4xx other than a rate limit: the
        issue is gone, locked, or not this repository's) is given up with a log line; one that fails
        on GitHub's side (5xx, no answer) is tried again at the next ticks, REPLY_TRIES in all. The
        rest go on either way; a rate limit stops them all until the next tick."""
        failed: list[str] = []
        for comment_id, number, body in self.store.replies.pending():
            try:
                self._post_reply(comment_id, number, body)
            except RateLimitExceededException:
                raise
            except GithubException as error:
                if 400 <= error.status < 500 and error.status != 429:
                    self._give_up_reply(comment_id, number, f"GitHub refused it (HTTP {error.status})")
                    continue
                failed.append(self._reply_failed(comment_id, number, f"HTTP {error.status}"))
            except (requests.RequestException, OSError) as error:
                failed.append(self._reply_failed(comment_id, number, type(error).__name__))
        if failed:
            raise RuntimeError("; ".join(failed))

    def _post_reply(self, comment_id: int, number: int, body: str) -> None:
        """The reaction and the reply to one command, on the issue `number` it was written in: a pull
        request's, or a plain issue's (`/pause` in a tracking issue). Its key: the ack marker, in the
        bot's own comments."""
        issue = self.repo.get_issue(number)
        try:
            comment = issue.get_comment(comment_id)
        except GithubException as error:
            if error.status != 404:
                raise
            log.info("command comment %s on #%s is gone: no reply", comment_id, number)
            self.store.replies.mark_posted(comment_id)
            return
        self.pace_write("reaction")
        comment.create_reaction("+1")  # GitHub answers 200 with the same reaction when it exists
        wanted = render.find_marker(body)
        if not any(
            render.authored_by(getattr(c.user, "login", None), self.store.state.bot_login)
            and render.find_marker(c.body) == wanted
            for c in issue.get_comments()
        ):
            self.pace_write("reply")
            issue.create_comment(body)
        self.store.replies.mark_posted(comment_id)
        self._reply_failures.pop(comment_id, None)

    def _reply_failed(self, comment_id: int, number: int, why: str) -> str:
        tries = self._reply_failures[comment_id] = self._reply_failures.get(comment_id, 0) + 1
        if tries >= REPLY_TRIES:
            self._give_up_reply(comment_id, number, f"GitHub failed {tries} times ({why})")
        return f"reply to comment {comment_id} on #{number}: {why} (try {tries} of {REPLY_TRIES})"

    def _give_up_reply(self, comment_id: int, number: int, why: str) -> None:
        log.warning("the reply to the command in comment %s on #%s is given up: %s", comment_id, number, why)
        self.store.events.add(None, "github", f"reply to comment {comment_id} on #{number} given up: {why}")
        self.store.replies.mark_posted(comment_id)
        self._reply_failures.pop(comment_id, None)
