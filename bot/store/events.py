"""The events table: what happened, in order, for people (the dashboard, the status, the research log).

Each component writes its events inside its own transaction, so an event is never recorded without
the change it tells of, nor the change without it.
"""

from __future__ import annotations

import sqlite3
import time

from bot.store.db import Database


class Events:
    def __init__(self, db: Database) -> None:
        self.db = db

    def add(self, experiment_id: int | None, kind: str, message: str) -> None:
        """Record an event (inside the caller's transaction, if one is open)."""
        with self.db.transaction() as conn:
            conn.execute(
                "INSERT INTO events(at, experiment_id, kind, message) VALUES (?, ?, ?, ?)",
                (time.time(), experiment_id, kind, message),
            )

    def all(self, experiment_id: int | None = None, *, after: int = 0) -> list[sqlite3.Row]:
        """Every event after id `after`, or those of one experiment, oldest first."""
        if experiment_id is None:
            return list(self.db.execute("SELECT * FROM events WHERE id > ? ORDER BY id", (after,)))
        return list(
            self.db.execute(
                "SELECT * FROM events WHERE experiment_id = ? AND id > ? ORDER BY id", (experiment_id, after)
            )
        )

    def last_id(self) -> int:
        """The id of the latest event (0 before any)."""
        return self.db.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()[0]
