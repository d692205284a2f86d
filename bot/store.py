"""The store: every experiment, run, decision and piece of feedback, in SQLite (WAL).

The conductor writes each transition here before it performs the side effect that follows, so a
restarted conductor finds, for every experiment, the step it must (re)do. Nothing here calls git,
a runner or an agent.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS experiments (
    id INTEGER PRIMARY KEY,
    state TEXT NOT NULL,            -- proposed | branched | measuring | rebasing | merging | closing | done
    status TEXT,                    -- keep | discard | crash, once decided
    title TEXT NOT NULL,
    hypothesis TEXT NOT NULL,
    branch TEXT NOT NULL UNIQUE,
    code_hash TEXT NOT NULL,        -- of train_py; changes when a rebase merges in a new main
    train_py TEXT NOT NULL,
    meta TEXT NOT NULL DEFAULT '{}',
    base_sha TEXT NOT NULL,         -- main commit the branch sits on
    head_sha TEXT,                  -- branch head, once pushed
    merged_sha TEXT,                -- main commit created by keeping it
    val_bpb REAL,                   -- mean of its counted runs
    delta REAL,                     -- val_bpb minus main's at the decision
    reason TEXT,                    -- why it was kept, discarded or crashed
    error_tail TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    experiment_id INTEGER REFERENCES experiments(id),  -- NULL: a baseline run of main
    purpose TEXT NOT NULL,          -- baseline | candidate | confirm | remeasure
    code_hash TEXT NOT NULL,
    commit_sha TEXT NOT NULL,
    base_sha TEXT NOT NULL,         -- main when the run was queued
    asset TEXT NOT NULL,            -- the train.py text that runs
    profile TEXT NOT NULL,
    seed INTEGER NOT NULL,
    state TEXT NOT NULL,            -- queued | running | done | lost
    status TEXT,                    -- ok | crash
    val_bpb REAL,
    metrics TEXT NOT NULL DEFAULT '{}',
    harness_hash TEXT,
    data_fingerprint TEXT,
    error TEXT,
    log_tail TEXT,
    run_dir TEXT,
    queued_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,
    experiment_id INTEGER,
    kind TEXT NOT NULL,
    message TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS feedback (
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,
    author TEXT NOT NULL,
    text TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS settings (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_by_code ON runs(code_hash, state);
CREATE INDEX IF NOT EXISTS runs_by_experiment ON runs(experiment_id);
"""

ACTIVE_STATES = ("proposed", "branched", "measuring", "rebasing", "merging", "closing")


@dataclass
class Experiment:
    id: int
    state: str
    status: str | None
    title: str
    hypothesis: str
    branch: str
    code_hash: str
    train_py: str
    meta: dict[str, Any]
    base_sha: str
    head_sha: str | None
    merged_sha: str | None
    val_bpb: float | None
    delta: float | None
    reason: str | None
    error_tail: str | None
    created_at: float
    updated_at: float


@dataclass
class Run:
    id: int
    experiment_id: int | None
    purpose: str
    code_hash: str
    commit_sha: str
    base_sha: str
    asset: str
    profile: str
    seed: int
    state: str
    status: str | None
    val_bpb: float | None
    metrics: dict[str, Any]
    harness_hash: str | None
    data_fingerprint: str | None
    error: str | None
    log_tail: str | None
    run_dir: str | None
    queued_at: float
    started_at: float | None
    finished_at: float | None


def failpoint(name: str) -> None:
    """Fault injection for the crash tests: AUTORESEARCH_FAILPOINT=name kills this process with
    SIGKILL right after the transition `name` is committed."""
    if os.environ.get("AUTORESEARCH_FAILPOINT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


class Store:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    # --- settings ------------------------------------------------------------------------------
    def get_setting(self, key: str, default: str | None = None) -> str | None:
        row = self.db.execute("SELECT value FROM settings WHERE key = ?", (key,)).fetchone()
        return row["value"] if row else default

    def set_setting(self, key: str, value: str) -> None:
        self.db.execute("INSERT INTO settings(key, value) VALUES (?, ?) "
                        "ON CONFLICT(key) DO UPDATE SET value = excluded.value", (key, value))

    # --- experiments ---------------------------------------------------------------------------
    def add_experiment(self, *, title: str, hypothesis: str, slug: str, code_hash: str, train_py: str,
                       meta: dict[str, Any], base_sha: str) -> Experiment:
        """Record a validated proposal; the branch name is fixed here, from the new id."""
        now = time.time()
        with self.transaction() as db:
            next_id = db.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM experiments").fetchone()[0]
            db.execute(
                "INSERT INTO experiments(id, state, title, hypothesis, branch, code_hash, train_py, meta,"
                " base_sha, created_at, updated_at) VALUES (?, 'proposed', ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (next_id, title, hypothesis, f"autoresearch/{next_id}-{slug}", code_hash, train_py,
                 json.dumps(meta), base_sha, now, now))
            self._event(db, next_id, "proposed", title)
        failpoint("proposed")
        return self.experiment(next_id)

    def update_experiment(self, exp_id: int, *, event: str | None = None, **fields: Any) -> Experiment:
        """Write fields (a state change among them) and, optionally, an event in one transaction."""
        if "meta" in fields:
            fields["meta"] = json.dumps(fields["meta"])
        fields["updated_at"] = time.time()
        columns = ", ".join(f"{name} = ?" for name in fields)
        with self.transaction() as db:
            cursor = db.execute(f"UPDATE experiments SET {columns} WHERE id = ?", (*fields.values(), exp_id))
            if cursor.rowcount != 1:
                raise KeyError(f"no experiment {exp_id}")
            if event:
                self._event(db, exp_id, fields.get("state", "update"), event)
        if "state" in fields:
            failpoint(fields["state"])
        return self.experiment(exp_id)

    def experiment(self, exp_id: int) -> Experiment:
        row = self.db.execute("SELECT * FROM experiments WHERE id = ?", (exp_id,)).fetchone()
        if row is None:
            raise KeyError(f"no experiment {exp_id}")
        return _experiment(row)

    def experiments(self, *, active: bool | None = None) -> list[Experiment]:
        query = "SELECT * FROM experiments"
        if active is True:
            query += f" WHERE state IN {ACTIVE_STATES}"
        elif active is False:
            query += " WHERE state = 'done'"
        return [_experiment(r) for r in self.db.execute(query + " ORDER BY id")]

    def experiment_by_code(self, code_hash: str) -> Experiment | None:
        row = self.db.execute("SELECT * FROM experiments WHERE code_hash = ? ORDER BY id LIMIT 1",
                              (code_hash,)).fetchone()
        return _experiment(row) if row else None

    def seen_code_hashes(self) -> set[str]:
        hashes = {r[0] for r in self.db.execute("SELECT code_hash FROM experiments")}
        hashes |= {r[0] for r in self.db.execute("SELECT code_hash FROM runs")}
        return hashes

    # --- runs ----------------------------------------------------------------------------------
    def add_run(self, *, experiment_id: int | None, purpose: str, code_hash: str, commit_sha: str,
                base_sha: str, asset: str, profile: str, experiment_fields: dict[str, Any] | None = None,
                reason: str | None = None) -> Run:
        """Queue a run; `experiment_fields` (a state change, say) are written in the same
        transaction, so a restart never finds the one without the other."""
        now = time.time()
        with self.transaction() as db:
            cursor = db.execute(
                "INSERT INTO runs(experiment_id, purpose, code_hash, commit_sha, base_sha, asset, profile,"
                " seed, state, queued_at) VALUES (?, ?, ?, ?, ?, ?, ?, 0, 'queued', ?)",
                (experiment_id, purpose, code_hash, commit_sha, base_sha, asset, profile, now))
            run_id = cursor.lastrowid
            db.execute("UPDATE runs SET seed = ? WHERE id = ?", (run_id, run_id))  # a new seed per run
            if experiment_fields:
                fields = dict(experiment_fields, updated_at=now)
                columns = ", ".join(f"{name} = ?" for name in fields)
                db.execute(f"UPDATE experiments SET {columns} WHERE id = ?", (*fields.values(), experiment_id))
            message = f"run {run_id} ({purpose}) queued" + (f": {reason}" if reason else "")
            self._event(db, experiment_id, "queued", message)
        failpoint(f"queued_{purpose}")
        return self.run(run_id)

    def mark_run_started(self, run_id: int, run_dir: str) -> None:
        self.db.execute("UPDATE runs SET state = 'running', run_dir = ?, started_at = ? WHERE id = ?",
                        (run_dir, time.time(), run_id))
        failpoint("run_started")

    def finish_run(self, run_id: int, *, status: str, val_bpb: float | None, metrics: dict[str, Any],
                   error: str | None, log_tail: str | None) -> Run:
        with self.transaction() as db:
            db.execute(
                "UPDATE runs SET state = 'done', status = ?, val_bpb = ?, metrics = ?, harness_hash = ?,"
                " data_fingerprint = ?, error = ?, log_tail = ?, finished_at = ? WHERE id = ? AND state != 'done'",
                (status, val_bpb, json.dumps(metrics), metrics.get("harness_hash"),
                 metrics.get("data_fingerprint"), error, log_tail, time.time(), run_id))
        failpoint("run_done")
        return self.run(run_id)

    def replace_lost_run(self, run_id: int, why: str) -> Run:
        """Mark a run lost and queue an identical one (new id, new seed) in one transaction."""
        now = time.time()
        with self.transaction() as db:
            db.execute("UPDATE runs SET state = 'lost', error = ? WHERE id = ? AND state = 'running'", (why, run_id))
            cursor = db.execute(
                "INSERT INTO runs(experiment_id, purpose, code_hash, commit_sha, base_sha, asset, profile, seed,"
                " state, queued_at) SELECT experiment_id, purpose, code_hash, commit_sha, base_sha, asset,"
                " profile, 0, 'queued', ? FROM runs WHERE id = ?", (now, run_id))
            new_id = cursor.lastrowid
            db.execute("UPDATE runs SET seed = ? WHERE id = ?", (new_id, new_id))
            experiment = db.execute("SELECT experiment_id FROM runs WHERE id = ?", (run_id,)).fetchone()[0]
            self._event(db, experiment, "lost", f"run {run_id}: {why}; queued again as run {new_id}")
        return self.run(new_id)

    def run(self, run_id: int) -> Run:
        return _run(self.db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone())

    def runs(self, *, state: str | None = None, experiment_id: int | None = None,
             code_hash: str | None = None) -> list[Run]:
        clauses, params = [], []
        for column, value in (("state", state), ("experiment_id", experiment_id), ("code_hash", code_hash)):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        return [_run(r) for r in self.db.execute(f"SELECT * FROM runs{where} ORDER BY id", params)]

    # --- events and feedback -------------------------------------------------------------------
    def event(self, experiment_id: int | None, kind: str, message: str) -> None:
        with self.transaction() as db:
            self._event(db, experiment_id, kind, message)

    def events(self, experiment_id: int | None = None) -> list[sqlite3.Row]:
        if experiment_id is None:
            return list(self.db.execute("SELECT * FROM events ORDER BY id"))
        return list(self.db.execute("SELECT * FROM events WHERE experiment_id = ? ORDER BY id",
                                    (experiment_id,)))

    def add_feedback(self, author: str, text: str) -> None:
        self.db.execute("INSERT INTO feedback(at, author, text) VALUES (?, ?, ?)", (time.time(), author, text))

    def recent_feedback(self, limit: int = 10) -> list[str]:
        rows = self.db.execute("SELECT text FROM feedback ORDER BY id DESC LIMIT ?", (limit,)).fetchall()
        return [r["text"] for r in reversed(rows)]

    @staticmethod
    def _event(db: sqlite3.Connection, experiment_id: int | None, kind: str, message: str) -> None:
        db.execute("INSERT INTO events(at, experiment_id, kind, message) VALUES (?, ?, ?, ?)",
                   (time.time(), experiment_id, kind, message))


def _experiment(row: sqlite3.Row) -> Experiment:
    data = dict(row)
    data["meta"] = json.loads(data["meta"])
    return Experiment(**data)


def _run(row: sqlite3.Row) -> Run:
    data = dict(row)
    data["metrics"] = json.loads(data["metrics"])
    return Run(**data)
