"""The feedback table: what people asked the agent to try (a steer, a comment on a pull request), which
the agent reads with its next proposal."""

from __future__ import annotations

import time

from bot.store.db import Database


class Feedback:
    def __init__(self, db: Database) -> None:
        self.db = db

    def add(self, author: str, text: str) -> None:
        self.db.execute("INSERT INTO feedback(at, author, text) VALUES (?, ?, ?)", (time.time(), author, text))

    def recent(self, limit: int = 10) -> list[str]:
        """The latest `limit` texts, oldest first."""
        rows = self.db.execute("SELECT text FROM feedback ORDER BY id DESC LIMIT ?", (limit,)).fetchall()
        return [r["text"] for r in reversed(rows)]
