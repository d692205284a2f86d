"""The write ledger: every content-creating request the bot sent to GitHub (a POST, PATCH, PUT or
DELETE, a workflow dispatch), when and what for, and whether the research needed it; and the write
budget's mode (full or degraded, since when, why, under which limits) as bot.github.budget last
decided it. Rows are kept for the longest window GitHub counts (an hour) and pruned as new ones come.

It lives in the store so that the budget survives a restart, and so that the processes that only
look (`autoresearch status`, the dashboard) show the same figures: `summary()` reads them over the
store's connection or a read-only one.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field

from bot.store.db import Database

KEPT_S = 3600.0  # the longest window GitHub counts writes in
DEFAULT_LIMITS = ((60.0, 80), (3600.0, 500))  # GitHub's: (window in seconds, most writes in it)
MODE_KEY = "github.write_mode"


@dataclass(frozen=True)
class Write:
    at: float
    what: str  # its kind: branch, commit, merge, dispatch, cancel (research); pull, check, comment, close, log ...
    research: bool


@dataclass(frozen=True)
class WriteMode:
    """How the publisher shows experiments: "full" (each its pull request, check and comment) or
    "degraded" (see bot.github.publisher), since when, and why it was chosen."""

    mode: str = "full"
    since: float | None = None
    why: str = ""
    limits: tuple[tuple[float, int], ...] = DEFAULT_LIMITS


@dataclass(frozen=True)
class WriteSummary:
    """What people are shown of the budget: the writes in each window against its limit, and the mode."""

    counts: list[tuple[float, int, int]] = field(default_factory=list)  # (window s, writes in it, most)
    mode: WriteMode = WriteMode()


class WriteLedger:
    def __init__(self, db: Database | sqlite3.Connection) -> None:
        self.db = db

    def add(self, writes: list[Write]) -> None:
        """Record writes (in one transaction of their own) and forget those older than KEPT_S before
        the newest."""
        if not writes:
            return
        conn = self.db.conn if isinstance(self.db, Database) else self.db
        own = not conn.in_transaction
        if own:
            conn.execute("BEGIN IMMEDIATE")
        try:
            conn.executemany(
                "INSERT INTO writes(at, what, research) VALUES (?, ?, ?)",
                [(w.at, w.what, int(w.research)) for w in writes],
            )
            conn.execute("DELETE FROM writes WHERE at <= ?", (max(w.at for w in writes) - KEPT_S,))
        except BaseException:
            if own:
                conn.execute("ROLLBACK")
            raise
        if own:
            conn.execute("COMMIT")

    def since(self, at: float) -> list[Write]:
        """The writes after `at`, oldest first."""
        rows = self.db.execute("SELECT at, what, research FROM writes WHERE at > ? ORDER BY at, id", (at,))
        return [Write(r[0], r[1], bool(r[2])) for r in rows]

    @property
    def mode(self) -> WriteMode:
        row = self.db.execute("SELECT value FROM settings WHERE key = ?", (MODE_KEY,)).fetchone()
        if not row:
            return WriteMode()
        try:
            saved = json.loads(row[0])
            limits = tuple((float(w), int(n)) for w, n in saved.get("limits") or DEFAULT_LIMITS)
            return WriteMode(str(saved["mode"]), saved.get("since"), str(saved.get("why", "")), limits)
        except (ValueError, KeyError, TypeError):
            return WriteMode()

    @mode.setter
    def mode(self, value: WriteMode) -> None:
        text = json.dumps({"mode": value.mode, "since": value.since, "why": value.why, "limits": value.limits})
        self.db.execute(
            "INSERT INTO settings(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (MODE_KEY, text),
        )

    def summary(self, now: float) -> WriteSummary:
        """The writes in each of the mode's windows up to `now`, and the mode."""
        mode = self.mode
        sums = ", ".join("COALESCE(SUM(at > ?), 0)" for _ in mode.limits)
        oldest = now - max(window for window, _ in mode.limits)
        row = self.db.execute(
            f"SELECT {sums} FROM writes WHERE at > ?", (*(now - window for window, _ in mode.limits), oldest)
        ).fetchone()
        counts = [(window, int(n), most) for (window, most), n in zip(mode.limits, row, strict=True)]
        return WriteSummary(counts, mode)
