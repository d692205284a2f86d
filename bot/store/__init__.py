"""The store: every experiment, run, decision, inbox entry and piece of feedback, in SQLite (WAL).

The conductor writes each transition here before it performs the side effect that follows, so a
restarted conductor finds, for every experiment, the step it must (re)do. External inputs (webhook
deliveries, polls, CLI commands) are written to the inbox by other processes and applied by the
conductor exactly once. Nothing here calls git, a runner or an agent.

A Store is one connection (bot.store.db: transactions, savepoints, failpoints) and one component
per table, each owning its rows and their rules:

    store.experiments   bot.store.experiments   the lifecycle, its transitions checked against bot.core.states
    store.runs          bot.store.runs          runs queued, finished once, set aside and re-run
    store.inbox         bot.store.inbox         external inputs, stored once per idempotency key
    store.replies       bot.store.inbox         the answers the bot owes to people's /commands
    store.published     bot.store.published     what GitHub shows of each experiment
    store.state         bot.store.loop_state    the settings table as typed properties (paused, identity, ...)
    store.events        bot.store.events        what happened, for people
    store.feedback      bot.store.feedback      what people asked the agent to try
    store.writes        bot.store.writes        GitHub writes of the last hour, and the write budget's mode

The tables and their migrations live in bot.store.schema; read-only connections for the processes
that only look (the dashboard, /healthz) in bot.store.pool.
"""

from __future__ import annotations

import sqlite3
from contextlib import AbstractContextManager
from pathlib import Path

from bot.store.db import Database, failpoint
from bot.store.events import Events
from bot.store.experiments import Experiment, Experiments, InvalidTransition
from bot.store.feedback import Feedback
from bot.store.inbox import Inbox, InboxEntry, Replies
from bot.store.loop_state import LoopState
from bot.store.pool import ReadPool, StoreUnavailable
from bot.store.published import Published
from bot.store.runs import Run, Runs
from bot.store.writes import WriteLedger

__all__ = [
    "Experiment",
    "InboxEntry",
    "InvalidTransition",
    "LoopState",
    "ReadPool",
    "Run",
    "Store",
    "StoreUnavailable",
    "failpoint",
]


class Store:
    def __init__(self, path: Path) -> None:
        self._database = Database(path)
        self.path = path
        self.upgraded_from = self._database.upgraded_from  # the schema version the file had when opened
        self.events = Events(self._database)
        self.experiments = Experiments(self._database, self.events)
        self.runs = Runs(self._database, self.events, self.experiments)
        self.inbox = Inbox(self._database)
        self.replies = Replies(self._database)
        self.published = Published(self._database)
        self.state = LoopState(self._database)
        self.feedback = Feedback(self._database)
        self.writes = WriteLedger(self._database)

    @property
    def db(self) -> sqlite3.Connection:
        """The connection itself, for what no component says (a test's setup, a benchmark's trace)."""
        return self._database.conn

    def close(self) -> None:
        self._database.close()

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        """One atomic unit across components; nested uses join the outer one, and only the
        outermost commits (an exception that reaches it rolls back everything)."""
        return self._database.transaction()

    def savepoint(self) -> AbstractContextManager[None]:
        """Inside transaction(): writes that an exception leaving this block undoes alone."""
        return self._database.savepoint()
