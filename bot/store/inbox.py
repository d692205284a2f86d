"""The inbox and the replies tables: what came in from outside, and the answers the bot owes for it.

Every external input (a webhook delivery, a poll's find, a CLI command) is written to the inbox by
whichever process received it, under the sender's idempotency key, so it is stored once however
often it is sent; the conductor applies each entry once and marks it processed (bot.loop.inbox).
A reply to a person's /command is queued under the comment's id and posted by the publisher.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

from bot.store.db import Database


@dataclass
class InboxEntry:
    id: int
    key: str
    kind: str
    payload: dict[str, Any]
    author: str
    received_at: float
    processed_at: float | None
    outcome: str | None


def _entry(row: sqlite3.Row) -> InboxEntry:
    data = dict(row)
    data["payload"] = json.loads(data["payload"])
    return InboxEntry(**data)


class Inbox:
    def __init__(self, db: Database) -> None:
        self.db = db

    def add(self, *, key: str, kind: str, payload: dict[str, Any], author: str) -> bool:
        """Record an external input once; False if an entry with this key is already there."""
        cursor = self.db.execute(
            "INSERT OR IGNORE INTO inbox(key, kind, payload, author, received_at) VALUES (?, ?, ?, ?, ?)",
            (key, kind, json.dumps(payload), author, time.time()),
        )
        return cursor.rowcount == 1

    def add_many(self, entries: list[dict[str, Any]], *, poll_s: float = 0.001, patience_s: float = 30.0) -> list[bool]:
        """Record several inputs (add's keyword arguments each) in one transaction, so one fsync for
        all; for each, False if its key was already there (a key twice in `entries`: the second is
        False). All or none are stored: an error rolls every one back and propagates.

        The write lock is waited for by polling (Database.transaction_polling: every `poll_s`, up to
        `patience_s`), not in SQLite's busy handler: the webhook server answers GitHub after this returns."""
        with self.db.transaction_polling(poll_s=poll_s, patience_s=patience_s):
            return [self.add(**entry) for entry in entries]

    def pending(self) -> list[InboxEntry]:
        """The entries not processed yet, oldest first."""
        return [_entry(r) for r in self.db.execute("SELECT * FROM inbox WHERE processed_at IS NULL ORDER BY id")]

    def mark_processed(self, entry_id: int, outcome: str) -> None:
        self.db.execute("UPDATE inbox SET processed_at = ?, outcome = ? WHERE id = ?", (time.time(), outcome, entry_id))

    def all(self) -> list[InboxEntry]:
        return [_entry(r) for r in self.db.execute("SELECT * FROM inbox ORDER BY id")]

    def last_id(self) -> int:
        return self.db.execute("SELECT COALESCE(MAX(id), 0) FROM inbox").fetchone()[0]


class Replies:
    def __init__(self, db: Database) -> None:
        self.db = db

    def add(self, comment_id: int, number: int, body: str) -> None:
        """Queue the answer to a person's command (once per comment)."""
        self.db.execute(
            "INSERT OR IGNORE INTO replies(comment_id, number, body, created_at) VALUES (?, ?, ?, ?)",
            (comment_id, number, body, time.time()),
        )

    def pending(self) -> list[tuple[int, int, str]]:
        """(comment_id, number, body) of each reply not posted yet, oldest first."""
        rows = self.db.execute(
            "SELECT comment_id, number, body FROM replies WHERE posted_at IS NULL ORDER BY created_at"
        )
        return [(r[0], r[1], r[2]) for r in rows]

    def mark_posted(self, comment_id: int) -> None:
        self.db.execute("UPDATE replies SET posted_at = ? WHERE comment_id = ?", (time.time(), comment_id))
