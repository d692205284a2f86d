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

The tables and their migrations live in bot.store.schema; read-only connections for the processes
that only look (the dashboard, /healthz) in bot.store.pool.
"""

from __future__ import annotations

import sqlite3
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from bot.core.states import RunState
from bot.store.db import Database, failpoint
from bot.store.events import Events
from bot.store.experiments import Experiment, Experiments, InvalidTransition
from bot.store.feedback import Feedback
from bot.store.inbox import Inbox, InboxEntry, Replies
from bot.store.loop_state import LoopState
from bot.store.pool import ReadPool, StoreUnavailable
from bot.store.published import Published
from bot.store.runs import Run, Runs

__all__ = ["Experiment", "InboxEntry", "InvalidTransition", "LoopState", "ReadPool", "Run", "Store",
           "StoreUnavailable", "failpoint"]


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

    # --- delegates until issue 17's sweep: remove
    def get_setting(self, key: str, default: str | None = None) -> str | None:
        value = self.state._read(key)
        return default if value is None else value

    def set_setting(self, key: str, value: str) -> None:
        self.state._write(key, value)

    def identity(self) -> dict[str, Any]:
        return self.state.identity

    def add_inbox(self, **entry: Any) -> bool:
        return self.inbox.add(**entry)

    def pending_inbox(self) -> list[InboxEntry]:
        return self.inbox.pending()

    def mark_processed(self, entry_id: int, outcome: str) -> None:
        self.inbox.mark_processed(entry_id, outcome)

    def last_inbox_id(self) -> int:
        return self.inbox.last_id()

    def start_proposing(self, base_sha: str) -> Experiment:
        return self.experiments.start_proposing(base_sha)

    def fill_proposal(self, exp_id: int, **proposal: Any) -> Experiment:
        return self.experiments.fill_proposal(exp_id, **proposal)

    def withdraw_proposing(self, exp_id: int, why: str) -> None:
        self.experiments.withdraw_proposing(exp_id, why)

    def update_experiment(self, exp_id: int, **fields: Any) -> Experiment:
        return self.experiments.update(exp_id, **fields)

    def experiment(self, exp_id: int) -> Experiment:
        return self.experiments.get(exp_id)

    def count_experiments(self) -> int:
        return self.experiments.count()

    def counts_by_status(self) -> dict[str, int]:
        return self.experiments.counts_by_status()

    def experiment_by_code(self, code_hash: str) -> Experiment | None:
        return self.experiments.by_code(code_hash)

    def codes(self) -> list[tuple[int, str, str]]:
        return self.experiments.codes()

    def requested(self) -> list[Experiment]:
        return self.experiments.requested()

    def request(self, exp_id: int, request: str, by: str) -> Experiment:
        return self.experiments.request(exp_id, request, by)

    def set_published(self, exp_id: int, key: str, value: str) -> None:
        self.published.set(exp_id, key, value)

    def seen_code_hashes(self) -> set[str]:
        return self.experiments.seen_code_hashes()

    def add_run(self, **run: Any) -> Run:
        return self.runs.add(**run)

    def mark_run_started(self, run_id: int, run_dir: str) -> None:
        self.runs.mark_started(run_id, run_dir)

    def finish_run(self, run_id: int, **result: Any) -> Run:
        return self.runs.finish(run_id, **result)

    def set_aside_run(self, run_id: int, state: RunState, why: str, **how: Any) -> Run | None:
        return self.runs.set_aside(run_id, state, why, **how)

    def run(self, run_id: int) -> Run:
        return self.runs.get(run_id)

    def count_runs(self, *states: str) -> int:
        return self.runs.count(*states)

    def latest_ok_runs(self, purpose: str, limit: int) -> list[Run]:
        return self.runs.latest_ok(purpose, limit)

    def measured_values(self, **identity: Any) -> list[tuple[str, int | None, str, float]]:
        return self.runs.measured_values(**identity)

    def event(self, experiment_id: int | None, kind: str, message: str) -> None:
        self.events.add(experiment_id, kind, message)

    def add_feedback(self, author: str, text: str) -> None:
        self.feedback.add(author, text)

    def recent_feedback(self, limit: int = 10) -> list[str]:
        return self.feedback.recent(limit)
