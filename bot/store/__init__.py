"""The store: every experiment, run, decision, inbox entry and piece of feedback, in SQLite (WAL).

The conductor writes each transition here before it performs the side effect that follows, so a
restarted conductor finds, for every experiment, the step it must (re)do. External inputs (CLI
commands now, webhook deliveries later) are written to the inbox by other processes and applied
by the conductor exactly once. Nothing here calls git, a runner or an agent. The tables and their
migrations live in bot.store.schema; the state names in bot.core.states.
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

from bot.core.states import ACTIVE, TRANSITIONS, RunState, State
from bot.store import schema


class InvalidTransition(RuntimeError):
    """A move between states that bot.core.states does not allow: a bug in the caller."""


@dataclass
class Experiment:
    id: int
    state: str
    status: str | None
    title: str
    hypothesis: str
    branch: str | None
    code_hash: str | None
    train_py: str | None
    meta: dict[str, Any]
    base_sha: str
    head_sha: str | None
    merged_sha: str | None
    val_bpb: float | None
    delta: float | None
    margin: float | None
    remeasured_delta: float | None
    reason: str | None
    error_tail: str | None
    failures: int
    retry_at: float | None
    created_at: float
    updated_at: float
    request: str | None = None  # a person's pending request (bot.core.states.Request), until acted on
    request_by: str | None = None


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
    rerun_of: int | None
    note: str | None


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


def failpoint(name: str) -> None:
    """Fault injection for the crash tests: AUTORESEARCH_FAILPOINT=name kills this process with
    SIGKILL right after the transition `name` is committed."""
    if os.environ.get("AUTORESEARCH_FAILPOINT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


class Store:
    def __init__(self, path: Path) -> None:
        if path.parent.exists() and not path.parent.is_dir():
            raise NotADirectoryError(f"{path.parent} is a file, not a work directory: choose another --workdir")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
        self.db.row_factory = sqlite3.Row
        self._depth = 0  # nesting of transaction(): only the outermost one commits
        try:
            self.upgraded_from = schema.migrate(self.db)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")
        except BaseException:
            self.db.close()
            raise

    def close(self) -> None:
        self.db.close()

    def _failpoint(self, name: str) -> None:
        if not self._depth:  # inside an outer transaction nothing is committed yet
            failpoint(name)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One atomic unit; nested uses join the outer one (an exception that reaches the outermost
        block rolls back everything; one caught inside it keeps the inner writes)."""
        if self._depth:
            self._depth += 1
            try:
                yield self.db
            finally:
                self._depth -= 1
            return
        self.db.execute("BEGIN IMMEDIATE")
        self._depth = 1
        try:
            yield self.db
        except BaseException:
            self._depth = 0
            self.db.execute("ROLLBACK")
            raise
        self._depth = 0
        self.db.execute("COMMIT")

    # --- settings ------------------------------------------------------------------------------
    def get_setting(self, key: str, default: str | None = None) -> str | None:
        row = self.db.execute("SELECT value FROM settings WHERE key = ?", (key,)).fetchone()
        return row["value"] if row else default

    def set_setting(self, key: str, value: str) -> None:
        self.db.execute("INSERT INTO settings(key, value) VALUES (?, ?) "
                        "ON CONFLICT(key) DO UPDATE SET value = excluded.value", (key, value))

    def identity(self) -> dict[str, Any]:
        """The measurement identity pinned for this work directory (empty before the first start)."""
        return json.loads(self.get_setting("identity") or "{}")

    # --- the inbox -----------------------------------------------------------------------------
    def add_inbox(self, *, key: str, kind: str, payload: dict[str, Any], author: str) -> bool:
        """Record an external input once; False if an entry with this key is already there."""
        cursor = self.db.execute(
            "INSERT OR IGNORE INTO inbox(key, kind, payload, author, received_at) VALUES (?, ?, ?, ?, ?)",
            (key, kind, json.dumps(payload), author, time.time()))
        return cursor.rowcount == 1

    def add_inbox_many(self, entries: list[dict[str, Any]], *, poll_s: float = 0.001,
                       patience_s: float = 30.0) -> list[bool]:
        """Record several inputs (add_inbox's keyword arguments each) in one transaction, so one
        fsync for all; for each, False if its key was already there (a key twice in `entries`: the
        second is False). All or none are stored: an error rolls every one back and propagates.

        The write lock is waited for by trying again every `poll_s`, up to `patience_s` (then
        sqlite3.OperationalError), rather than by SQLite's busy handler, whose sleeps grow to 100 ms
        and go on after the lock is free: the webhook server answers GitHub after this returns."""
        (timeout_ms,) = self.db.execute("PRAGMA busy_timeout").fetchone()
        self.db.execute("PRAGMA busy_timeout = 0")
        deadline = time.monotonic() + patience_s
        try:
            while True:
                try:
                    self.db.execute("BEGIN IMMEDIATE")
                    break
                except sqlite3.OperationalError as error:
                    if error.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY or time.monotonic() > deadline:
                        raise
                time.sleep(poll_s)
        finally:
            self.db.execute(f"PRAGMA busy_timeout = {int(timeout_ms)}")
        self._depth = 1
        try:
            stored = [self.add_inbox(**entry) for entry in entries]
            self.db.execute("COMMIT")
        except BaseException:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise
        finally:
            self._depth = 0
        return stored

    def pending_inbox(self) -> list[InboxEntry]:
        rows = self.db.execute("SELECT * FROM inbox WHERE processed_at IS NULL ORDER BY id")
        return [_inbox(r) for r in rows]

    def mark_processed(self, entry_id: int, outcome: str) -> None:
        self.db.execute("UPDATE inbox SET processed_at = ?, outcome = ? WHERE id = ?",
                        (time.time(), outcome, entry_id))

    def inbox(self) -> list[InboxEntry]:
        return [_inbox(r) for r in self.db.execute("SELECT * FROM inbox ORDER BY id")]

    def last_inbox_id(self) -> int:
        return self.db.execute("SELECT COALESCE(MAX(id), 0) FROM inbox").fetchone()[0]

    # --- experiments ---------------------------------------------------------------------------
    def start_proposing(self, base_sha: str) -> Experiment:
        """An experiment whose proposal the agent is working on, based on main `base_sha`."""
        now = time.time()
        with self.transaction() as db:
            cursor = db.execute("INSERT INTO experiments(state, base_sha, created_at, updated_at) "
                                "VALUES ('proposing', ?, ?, ?)", (base_sha, now, now))
            exp_id = cursor.lastrowid
            self._event(db, exp_id, "proposing", f"asked the agent for a proposal on main {base_sha[:7]}")
        self._failpoint("proposing")
        return self.experiment(exp_id)

    def fill_proposal(self, exp_id: int, *, title: str, hypothesis: str, slug: str, code_hash: str,
                      train_py: str, meta: dict[str, Any]) -> Experiment:
        """Record a validated proposal; the branch name is fixed here, from the id."""
        exp = self.update_experiment(exp_id, state=State.PROPOSED, title=title, hypothesis=hypothesis,
                                     branch=f"autoresearch/{exp_id}-{slug}", code_hash=code_hash,
                                     train_py=train_py, meta=meta, failures=0, event=title)
        return exp

    def withdraw_proposing(self, exp_id: int, why: str) -> None:
        """Forget an experiment the agent never proposed (it has no branch and no run)."""
        with self.transaction() as db:
            if db.execute("DELETE FROM experiments WHERE id = ? AND state = 'proposing'", (exp_id,)).rowcount:
                self._event(db, None, "agent", f"no experiment {exp_id}: {why}")

    def update_experiment(self, exp_id: int, *, event: str | None = None, **fields: Any) -> Experiment:
        """Write fields (a state change among them) and, optionally, an event in one transaction."""
        if "meta" in fields:
            fields["meta"] = json.dumps(fields["meta"])
        fields["updated_at"] = time.time()
        columns = ", ".join(f"{name} = ?" for name in fields)
        with self.transaction() as db:
            if "state" in fields:
                row = db.execute("SELECT state FROM experiments WHERE id = ?", (exp_id,)).fetchone()
                if row is None:
                    raise KeyError(f"no experiment {exp_id}")
                old, new = State(row["state"]), State(fields["state"])
                if new not in TRANSITIONS[old]:
                    raise InvalidTransition(f"experiment {exp_id}: {old} -> {new} is not allowed")
            cursor = db.execute(f"UPDATE experiments SET {columns} WHERE id = ?", (*fields.values(), exp_id))
            if cursor.rowcount != 1:
                raise KeyError(f"no experiment {exp_id}")
            if event:
                self._event(db, exp_id, str(fields.get("state", "update")), event)
        if "state" in fields:
            self._failpoint(str(fields["state"]))
        return self.experiment(exp_id)

    def experiment(self, exp_id: int) -> Experiment:
        row = self.db.execute("SELECT * FROM experiments WHERE id = ?", (exp_id,)).fetchone()
        if row is None:
            raise KeyError(f"no experiment {exp_id}")
        return _experiment(row)

    def experiments(self, *, active: bool | None = None, state: str | None = None) -> list[Experiment]:
        """All experiments (with a proposal), or the active ones, or those in one state."""
        if state is not None:
            rows = self.db.execute("SELECT * FROM experiments WHERE state = ? ORDER BY id", (state,))
        elif active is True:
            rows = self.db.execute(f"SELECT * FROM experiments WHERE state IN ({_marks(ACTIVE)}) ORDER BY id",
                                   ACTIVE)
        elif active is False:
            rows = self.db.execute("SELECT * FROM experiments WHERE state = 'done' ORDER BY id")
        else:
            rows = self.db.execute("SELECT * FROM experiments WHERE state != 'proposing' ORDER BY id")
        return [_experiment(r) for r in rows]

    def count_experiments(self) -> int:
        """Every experiment, those the agent is still proposing included."""
        return self.db.execute("SELECT COUNT(*) FROM experiments").fetchone()[0]

    def counts_by_status(self) -> dict[str, int]:
        rows = self.db.execute("SELECT status, COUNT(*) FROM experiments WHERE state = 'done' GROUP BY status")
        return {r[0]: r[1] for r in rows}

    def experiment_by_code(self, code_hash: str) -> Experiment | None:
        row = self.db.execute("SELECT * FROM experiments WHERE code_hash = ? ORDER BY id LIMIT 1",
                              (code_hash,)).fetchone()
        return _experiment(row) if row else None

    def codes(self) -> list[tuple[int, str, str]]:
        """(id, title, code_hash) of every experiment with a proposed train.py, without the texts."""
        rows = self.db.execute("SELECT id, title, code_hash FROM experiments "
                               "WHERE code_hash IS NOT NULL AND train_py IS NOT NULL ORDER BY id")
        return [(r[0], r[1], r[2]) for r in rows]

    def experiment_by_branch(self, branch: str) -> Experiment | None:
        row = self.db.execute("SELECT * FROM experiments WHERE branch = ?", (branch,)).fetchone()
        return _experiment(row) if row else None

    def experiment_by_pull(self, number: int) -> Experiment | None:
        row = self.db.execute("SELECT e.* FROM experiments e JOIN published p ON p.experiment_id = e.id "
                              "WHERE p.key = 'pr' AND p.value = ?", (str(number),)).fetchone()
        return _experiment(row) if row else None

    def experiment_by_check_run(self, check_run_id: int) -> Experiment | None:
        """The experiment whose check run (one the publisher created: `check:<head>:<round>`) has this id."""
        row = self.db.execute("SELECT e.* FROM experiments e JOIN published p ON p.experiment_id = e.id "
                              "WHERE p.key LIKE 'check:%' AND p.key NOT LIKE '%:done' AND p.value = ?",
                              (str(check_run_id),)).fetchone()
        return _experiment(row) if row else None

    def requested(self) -> list[Experiment]:
        """Experiments with a person's request waiting."""
        rows = self.db.execute("SELECT * FROM experiments WHERE request IS NOT NULL ORDER BY id")
        return [_experiment(r) for r in rows]

    def request(self, exp_id: int, request: str, by: str) -> Experiment:
        """Record a person's request on an experiment (the latest one wins) for the conductor."""
        return self.update_experiment(exp_id, request=request, request_by=by,
                                      event=f"{by} asked for {request}")

    # --- what GitHub shows of each experiment (bot.github.publisher) -----------------------------
    def published(self, exp_id: int) -> dict[str, str]:
        rows = self.db.execute("SELECT key, value FROM published WHERE experiment_id = ?", (exp_id,))
        return {key: value for key, value in rows}

    def set_published(self, exp_id: int, key: str, value: str) -> None:
        self.db.execute("INSERT INTO published(experiment_id, key, value) VALUES (?, ?, ?) "
                        "ON CONFLICT(experiment_id, key) DO UPDATE SET value = excluded.value", (exp_id, key, value))

    def unpublished(self) -> list[Experiment]:
        """Experiments GitHub may not show as they are: the active ones with a branch, and the
        finished ones whose final state (`final` = their status) is not published yet."""
        rows = self.db.execute(
            "SELECT e.* FROM experiments e LEFT JOIN published p ON p.experiment_id = e.id AND p.key = 'final' "
            "WHERE e.branch IS NOT NULL AND e.head_sha IS NOT NULL "
            "AND (e.state != 'done' OR p.value IS NULL OR p.value != e.status) ORDER BY e.id")
        return [_experiment(r) for r in rows]

    def add_reply(self, comment_id: int, number: int, body: str) -> None:
        """Queue the answer to a person's command (once per comment)."""
        self.db.execute("INSERT OR IGNORE INTO replies(comment_id, number, body, created_at) VALUES (?, ?, ?, ?)",
                        (comment_id, number, body, time.time()))

    def pending_replies(self) -> list[tuple[int, int, str]]:
        rows = self.db.execute("SELECT comment_id, number, body FROM replies WHERE posted_at IS NULL ORDER BY created_at")
        return [(r[0], r[1], r[2]) for r in rows]

    def mark_replied(self, comment_id: int) -> None:
        self.db.execute("UPDATE replies SET posted_at = ? WHERE comment_id = ?", (time.time(), comment_id))

    def seen_code_hashes(self) -> set[str]:
        hashes = {r[0] for r in self.db.execute("SELECT code_hash FROM experiments WHERE code_hash IS NOT NULL")}
        hashes |= {r[0] for r in self.db.execute("SELECT DISTINCT code_hash FROM runs")}
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
                self.update_experiment(experiment_id, **experiment_fields)
            message = f"run {run_id} ({purpose}) queued" + (f": {reason}" if reason else "")
            self._event(db, experiment_id, "queued", message)
        self._failpoint(f"queued_{purpose}")
        return self.run(run_id)

    def mark_run_started(self, run_id: int, run_dir: str) -> None:
        self.db.execute("UPDATE runs SET state = 'running', run_dir = ?, started_at = ? WHERE id = ?",
                        (run_dir, time.time(), run_id))
        self._failpoint("run_started")

    def finish_run(self, run_id: int, *, status: str, val_bpb: float | None, metrics: dict[str, Any],
                   error: str | None, log_tail: str | None) -> Run:
        with self.transaction() as db:
            cursor = db.execute(
                "UPDATE runs SET state = 'done', status = ?, val_bpb = ?, metrics = ?, harness_hash = ?,"
                " data_fingerprint = ?, error = ?, log_tail = ?, finished_at = ? WHERE id = ? AND state != 'done'",
                (status, val_bpb, json.dumps(metrics), metrics.get("harness_hash"),
                 metrics.get("data_fingerprint"), error, log_tail, time.time(), run_id))
            if cursor.rowcount:
                row = db.execute("SELECT experiment_id, purpose FROM runs WHERE id = ?", (run_id,)).fetchone()
                steps = metrics.get("num_steps")
                if status != "ok":
                    what = f"crashed: {error.strip().splitlines()[-1][:200] if (error or '').strip() else 'no error'}"
                else:
                    what = (f"val_bpb {val_bpb:.6f}" if val_bpb is not None else "no val_bpb") + (
                        f" in {steps} steps" if steps else "")
                self._event(db, row["experiment_id"], "run", f"run {run_id} ({row['purpose']}) {what}")
        self._failpoint("run_done")
        return self.run(run_id)

    def set_aside_run(self, run_id: int, state: RunState, why: str, *, rerun: bool = True,
                      result: dict[str, Any] | None = None) -> Run | None:
        """Mark a run lost, refused, disturbed or cancelled (keeping what it reported in `result`)
        and, with `rerun`, queue an identical one (new id, new seed), in one transaction."""
        now = time.time()
        result = result or {}
        with self.transaction() as db:
            db.execute("UPDATE runs SET state = ?, note = ?, finished_at = ?, status = COALESCE(?, status),"
                       " val_bpb = COALESCE(?, val_bpb), metrics = COALESCE(?, metrics), log_tail = COALESCE(?,"
                       " log_tail) WHERE id = ?",
                       (state.value, why, now, result.get("status"), result.get("val_bpb"),
                        json.dumps(result["metrics"]) if "metrics" in result else None,
                        result.get("log_tail"), run_id))
            row = db.execute("SELECT experiment_id FROM runs WHERE id = ?", (run_id,)).fetchone()
            if row is None:
                raise KeyError(f"no run {run_id}")
            experiment = row[0]
            new_id = None
            if rerun:
                cursor = db.execute(
                    "INSERT INTO runs(experiment_id, purpose, code_hash, commit_sha, base_sha, asset, profile,"
                    " seed, state, queued_at, rerun_of) SELECT experiment_id, purpose, code_hash, commit_sha,"
                    " base_sha, asset, profile, 0, 'queued', ?, id FROM runs WHERE id = ?", (now, run_id))
                new_id = cursor.lastrowid
                db.execute("UPDATE runs SET seed = ? WHERE id = ?", (new_id, new_id))
            again = f"; queued again as run {new_id}" if new_id else ""
            self._event(db, experiment, state.value, f"run {run_id}: {why}{again}")
        return self.run(new_id) if new_id else None

    def run(self, run_id: int) -> Run:
        row = self.db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise KeyError(f"no run {run_id}")
        return _run(row)

    def runs(self, *, state: str | None = None, experiment_id: int | None = None,
             code_hash: str | None = None) -> list[Run]:
        clauses, params = [], []
        for column, value in (("state", state), ("experiment_id", experiment_id), ("code_hash", code_hash)):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        return [_run(r) for r in self.db.execute(f"SELECT * FROM runs{where} ORDER BY id", params)]

    def count_runs(self, *states: str) -> int:
        return self.db.execute(f"SELECT COUNT(*) FROM runs WHERE state IN ({_marks(states)})", states).fetchone()[0]

    def latest_ok_runs(self, purpose: str, limit: int) -> list[Run]:
        rows = self.db.execute("SELECT * FROM runs WHERE state = 'done' AND status = 'ok' AND purpose = ?"
                               " ORDER BY id DESC LIMIT ?", (purpose, limit))
        return [_run(r) for r in rows]

    def measured_values(self, *, profile: str, harness_hash: str, data_fingerprint: str, threads: int | None = None
                        ) -> list[tuple[str, int | None, str, float]]:
        """(code_hash, experiment_id, purpose, val_bpb) of every ok run under one identity (and, for
        CPU-clock runs, one thread count when `threads` is given)."""
        rows = self.db.execute(
            "SELECT code_hash, experiment_id, purpose, val_bpb FROM runs WHERE state = 'done' AND status = 'ok'"
            " AND val_bpb IS NOT NULL AND profile = ? AND harness_hash = ? AND data_fingerprint = ?"
            " AND (? IS NULL OR json_extract(metrics, '$.clock') IS NOT 'cpu'"
            " OR json_extract(metrics, '$.threads') = ?) ORDER BY id",
            (profile, harness_hash, data_fingerprint, threads, threads))
        return [(r[0], r[1], r[2], r[3]) for r in rows]

    # --- events and feedback -------------------------------------------------------------------
    def event(self, experiment_id: int | None, kind: str, message: str) -> None:
        with self.transaction() as db:
            self._event(db, experiment_id, kind, message)

    def events(self, experiment_id: int | None = None, *, after: int = 0) -> list[sqlite3.Row]:
        if experiment_id is None:
            return list(self.db.execute("SELECT * FROM events WHERE id > ? ORDER BY id", (after,)))
        return list(self.db.execute("SELECT * FROM events WHERE experiment_id = ? AND id > ? ORDER BY id",
                                    (experiment_id, after)))

    def add_feedback(self, author: str, text: str) -> None:
        self.db.execute("INSERT INTO feedback(at, author, text) VALUES (?, ?, ?)", (time.time(), author, text))

    def recent_feedback(self, limit: int = 10) -> list[str]:
        rows = self.db.execute("SELECT text FROM feedback ORDER BY id DESC LIMIT ?", (limit,)).fetchall()
        return [r["text"] for r in reversed(rows)]

    @staticmethod
    def _event(db: sqlite3.Connection, experiment_id: int | None, kind: str, message: str) -> None:
        db.execute("INSERT INTO events(at, experiment_id, kind, message) VALUES (?, ?, ?, ?)",
                   (time.time(), experiment_id, kind, message))


def _marks(values: tuple) -> str:
    return ", ".join("?" for _ in values)


def _experiment(row: sqlite3.Row) -> Experiment:
    data = dict(row)
    data["meta"] = json.loads(data["meta"])
    return Experiment(**data)


def _run(row: sqlite3.Row) -> Run:
    data = dict(row)
    data["metrics"] = json.loads(data["metrics"])
    return Run(**data)


def _inbox(row: sqlite3.Row) -> InboxEntry:
    data = dict(row)
    data["payload"] = json.loads(data["payload"])
    return InboxEntry(**data)
