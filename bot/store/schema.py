"""The store's tables and the chain of migrations that brings any older state.db up to date.

`PRAGMA user_version` holds the schema version of a file. Version 0 is a file written before the
schema was versioned (or a new, empty file); each migration moves a file one version up inside
one transaction, so a file is always at exactly one version and an interrupted upgrade leaves it
as it was. Never edit a migration that has shipped: add the next one.
"""

from __future__ import annotations

import sqlite3

# Version 1: the schema of the first release (the local loop), as it was created then.
V1 = """
CREATE TABLE IF NOT EXISTS experiments (
    id INTEGER PRIMARY KEY, state TEXT NOT NULL, status TEXT, title TEXT NOT NULL,
    hypothesis TEXT NOT NULL, branch TEXT NOT NULL UNIQUE, code_hash TEXT NOT NULL,
    train_py TEXT NOT NULL, meta TEXT NOT NULL DEFAULT '{}', base_sha TEXT NOT NULL, head_sha TEXT,
    merged_sha TEXT, val_bpb REAL, delta REAL, reason TEXT, error_tail TEXT,
    created_at REAL NOT NULL, updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY, experiment_id INTEGER REFERENCES experiments(id), purpose TEXT NOT NULL,
    code_hash TEXT NOT NULL, commit_sha TEXT NOT NULL, base_sha TEXT NOT NULL, asset TEXT NOT NULL,
    profile TEXT NOT NULL, seed INTEGER NOT NULL, state TEXT NOT NULL, status TEXT, val_bpb REAL,
    metrics TEXT NOT NULL DEFAULT '{}', harness_hash TEXT, data_fingerprint TEXT, error TEXT,
    log_tail TEXT, run_dir TEXT, queued_at REAL NOT NULL, started_at REAL, finished_at REAL
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY, at REAL NOT NULL, experiment_id INTEGER, kind TEXT NOT NULL,
    message TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS feedback (
    id INTEGER PRIMARY KEY, at REAL NOT NULL, author TEXT NOT NULL, text TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS runs_by_code ON runs(code_hash, state);
CREATE INDEX IF NOT EXISTS runs_by_experiment ON runs(experiment_id);
"""

# Version 2: the service's driver. Experiments may exist before the agent has answered
# (state `proposing`: no title, branch or code yet) and may end as `failed`; a step that fails is
# retried with backoff; ids are never reused. Runs can be set aside (refused, disturbed,
# cancelled) and re-run. Every external input goes through the inbox, exactly once.
V2 = """
CREATE TABLE experiments_v2 (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    state TEXT NOT NULL,            -- see bot.lifecycle.State
    status TEXT,                    -- keep | discard | crash | failed, once decided
    title TEXT NOT NULL DEFAULT '',
    hypothesis TEXT NOT NULL DEFAULT '',
    branch TEXT UNIQUE,             -- autoresearch/<id>-<slug>, fixed when the proposal arrives
    code_hash TEXT,                 -- of train_py; changes when a rebase merges in a new main
    train_py TEXT,
    meta TEXT NOT NULL DEFAULT '{}',
    base_sha TEXT NOT NULL,         -- the main the agent read; the branch sits on it
    head_sha TEXT,                  -- branch head, once pushed
    merged_sha TEXT,                -- main commit created by keeping it
    val_bpb REAL,                   -- mean of its counted runs at the decision
    delta REAL,                     -- val_bpb minus main's at the decision (selected: flattering)
    margin REAL,                    -- the noise margin it was judged with
    remeasured_delta REAL,          -- kept: the new main's fresh baseline minus the old main's
    reason TEXT,                    -- why it was kept, discarded, crashed or failed
    error_tail TEXT,
    failures INTEGER NOT NULL DEFAULT 0,  -- failed attempts at the current step (or refusals)
    retry_at REAL,                  -- a failed step is not tried again before this time
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
INSERT INTO experiments_v2(id, state, status, title, hypothesis, branch, code_hash, train_py, meta,
    base_sha, head_sha, merged_sha, val_bpb, delta, reason, error_tail, created_at, updated_at)
  SELECT id, state, status, title, hypothesis, branch, code_hash, train_py, meta, base_sha, head_sha,
    merged_sha, val_bpb, delta, reason, error_tail, created_at, updated_at FROM experiments;
DROP TABLE experiments;
ALTER TABLE experiments_v2 RENAME TO experiments;
CREATE INDEX experiments_by_state ON experiments(state);

ALTER TABLE runs ADD COLUMN rerun_of INTEGER;  -- the run this one repeats (lost, refused, disturbed)
ALTER TABLE runs ADD COLUMN note TEXT;         -- why a run was set aside
CREATE INDEX runs_by_state ON runs(state);

CREATE TABLE inbox (
    id INTEGER PRIMARY KEY,
    key TEXT NOT NULL UNIQUE,       -- the sender's idempotency key (a webhook delivery id, a CLI uuid)
    kind TEXT NOT NULL,             -- steer | pause | resume | ... (see bot.loop.inbox)
    payload TEXT NOT NULL,          -- JSON
    author TEXT NOT NULL,
    received_at REAL NOT NULL,
    processed_at REAL,              -- NULL until the conductor applied it
    outcome TEXT                    -- what applying it did, or why it was rejected
);
CREATE INDEX inbox_pending ON inbox(id) WHERE processed_at IS NULL;
"""

# Version 3: GitHub. A person can ask for something on an experiment (close its pull request,
# reopen it, /rerun, /keep, /discard); the request waits on the experiment until the conductor acts
# on it. What the bot has shown on GitHub for each experiment (its pull request, check runs,
# comments, label) is recorded apart from the lifecycle, so publishing never changes a decision.
V3 = """
ALTER TABLE experiments ADD COLUMN request TEXT;     -- cancel | reopen | rerun | keep | discard, until acted on
ALTER TABLE experiments ADD COLUMN request_by TEXT;  -- who asked
CREATE TABLE published (
    experiment_id INTEGER NOT NULL,
    key TEXT NOT NULL,              -- pr | check:<head sha> | comment:<marker> | label | final
    value TEXT NOT NULL,
    PRIMARY KEY (experiment_id, key)
);
CREATE TABLE replies (              -- answers to people's /commands, posted by the publisher
    comment_id INTEGER PRIMARY KEY, -- the comment that holds the command (its reply's idempotency key)
    number INTEGER NOT NULL,        -- the issue or pull request it was made on
    body TEXT NOT NULL,
    created_at REAL NOT NULL,
    posted_at REAL                  -- NULL until the reaction and the reply are on GitHub
);
"""

# Version 4: one word for the text of the file an experiment edits (train.py): runs always called it
# `asset`, and experiments now do too.
V4 = """
ALTER TABLE experiments RENAME COLUMN train_py TO asset;
"""

# Version 5: the write ledger. Every content-creating request the bot sends to GitHub (GitHub allows
# 80 a minute and 500 an hour), kept for an hour, so the write budget survives a restart and other
# processes (`autoresearch status`, the dashboard) can show it; bot.store.writes.
V5 = """
CREATE TABLE writes (
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,               -- when it was sent (wall time)
    what TEXT NOT NULL,             -- branch | commit | merge | dispatch | cancel | pull | check | comment | close | log ...
    research INTEGER NOT NULL       -- 1: the research needs it (never waits), 0: what people read
);
CREATE INDEX writes_by_time ON writes(at);
"""

# Version 6: how many times people had an experiment measured again (/rerun, reopening its pull
# request, Keep anyway). The publisher shows each such round anew (a new check run, a new decision
# comment); counted here, with the reopening itself, a round is shown even when it ended before the
# publisher looked, with the verdict it had before. Rounds the publisher had already shown count, and
# one it has not noticed yet (measured again, not done, its last verdict still shown).
V6 = """
ALTER TABLE experiments ADD COLUMN reopened INTEGER NOT NULL DEFAULT 0;
UPDATE experiments SET reopened = COALESCE(
    (SELECT CAST(value AS INTEGER) FROM published p WHERE p.experiment_id = experiments.id AND p.key = 'round'), 0
) + (state != 'done' AND EXISTS(
    SELECT 1 FROM published p WHERE p.experiment_id = experiments.id AND p.key = 'final' AND p.value != ''
));
"""

MIGRATIONS: list[str] = [V1, V2, V3, V4, V5, V6]
VERSION = len(MIGRATIONS)


class SchemaTooNew(RuntimeError):
    """The file was written by a newer release than this one."""


def migrate(db: sqlite3.Connection) -> int:
    """Bring `db` to VERSION, one migration per transaction. Returns the version it started at."""
    start = db.execute("PRAGMA user_version").fetchone()[0]
    if start > VERSION:
        raise SchemaTooNew(
            f"this state.db has schema version {start}, newer than this release "
            f"understands ({VERSION}): upgrade autoresearch-bot, or use another work directory"
        )
    for version in range(start, VERSION):
        db.execute("BEGIN IMMEDIATE")
        try:
            for statement in _statements(MIGRATIONS[version]):
                db.execute(statement)
            db.execute(f"PRAGMA user_version = {version + 1}")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
    return start


def _statements(script: str) -> list[str]:
    """Split a migration into statements (executescript would commit on its own)."""
    lines = [line.split("--", 1)[0] for line in script.splitlines()]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]
