"""The settings table as typed properties: the loop's state that is no experiment, run or input (paused,
the measurement identity pinned, what the agent spent, program.md's last valid settings), and the
cursors and names the GitHub side keeps (the bot's login, the poller's cursors, the research log).

Each property is one row of `settings` (key -> text); the keys and the text of each value are those
every release wrote, so an older state.db reads the same. Reads work over the store's connection or
a read-only one from bot.store.pool (`LoopState(conn)` inside a snapshot).
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from bot.store.db import Database


class LoopState:
    def __init__(self, db: Database | sqlite3.Connection) -> None:
        self.db = db

    # --- the loop ------------------------------------------------------------------------------
    @property
    def paused(self) -> bool:
        """A person paused the loop (/pause, `autoresearch pause`): no new proposal or run is started."""
        return self._read("paused") == "1"

    @paused.setter
    def paused(self, value: bool) -> None:
        self._write("paused", "1" if value else "0")

    @property
    def identity(self) -> dict[str, Any]:
        """The measurement identity pinned for this work directory (empty before the first start)."""
        return json.loads(self._read("identity") or "{}")

    @identity.setter
    def identity(self, value: dict[str, Any]) -> None:
        self._write("identity", json.dumps(value))

    @property
    def spent_usd(self) -> float:
        """What the agent's answers have cost so far."""
        return float(self._read("agent.spent_usd") or 0.0)

    @spent_usd.setter
    def spent_usd(self, value: float) -> None:
        self._write("agent.spent_usd", repr(value))

    @property
    def program_settings(self) -> str | None:
        """program.md's last valid settings (bot.loop.program.LoopSettings as JSON), kept for when a
        later program.md is invalid; None before the first."""
        return self._read("program.settings")

    @program_settings.setter
    def program_settings(self, value: str) -> None:
        self._write("program.settings", value)

    @property
    def driver_last_run(self) -> dict[str, Any]:
        """The driver's last run: {ticks, cpu_seconds, wall_seconds} (bench/demo_overhead.py reads it)."""
        return json.loads(self._read("driver.last_run") or "{}")

    @driver_last_run.setter
    def driver_last_run(self, value: dict[str, Any]) -> None:
        self._write("driver.last_run", json.dumps(value))

    # --- GitHub --------------------------------------------------------------------------------
    @property
    def bot_login(self) -> str | None:
        """The bot's own login on GitHub, written when the service connects (None before)."""
        return self._read("github.bot_login")

    @bot_login.setter
    def bot_login(self, value: str) -> None:
        self._write("github.bot_login", value)

    @property
    def poller_horizon(self) -> str | None:
        """When polling first began (ISO 8601, UTC): nothing from before it is replayed."""
        return self._read("poller.horizon")

    @poller_horizon.setter
    def poller_horizon(self, value: str) -> None:
        self._write("poller.horizon", value)

    @property
    def poller_comments_since(self) -> str | None:
        """The `since` of the poller's next comments query (ISO 8601)."""
        return self._read("poller.comments_since")

    @poller_comments_since.setter
    def poller_comments_since(self, value: str) -> None:
        self._write("poller.comments_since", value)

    @property
    def poller_pulls(self) -> dict[str, dict[str, Any]]:
        """The pull requests as the poller last saw them: {"<number>": {"state", "branch", "sha"}}."""
        return json.loads(self._read("poller.pulls") or "{}")

    @poller_pulls.setter
    def poller_pulls(self, value: dict[str, dict[str, Any]]) -> None:
        self._write("poller.pulls", json.dumps(value))

    @property
    def research_log(self) -> dict[str, Any]:
        """The research log issue as last written: {number, digest, edited_at, kept}; {} if none (or
        unreadable: the log is found again on GitHub)."""
        try:
            saved = json.loads(self._read("github.research_log") or "{}")
        except ValueError:
            return {}
        return saved if isinstance(saved, dict) else {}

    @research_log.setter
    def research_log(self, value: dict[str, Any]) -> None:
        self._write("github.research_log", json.dumps(value))

    # --- the table -----------------------------------------------------------------------------
    def _read(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM settings WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def _write(self, key: str, value: str) -> None:
        self.db.execute(
            "INSERT INTO settings(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (key, value),
        )
