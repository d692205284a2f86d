"""bot.store.schema.migrate on real SQLite connections: the chain, one version per transaction, a file too
new, and a migration that fails half-way (a broken chain patched in with monkeypatch)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.store import schema

THIRD = "CREATE TABLE third (a INTEGER); ALTER TABLE runs ADD COLUMN extra TEXT;"
BROKEN = "CREATE TABLE half (a INTEGER); ALTER TABLE runs ADD COLUMN extra TEXT; INSERT INTO no_such_table VALUES (1);"


@pytest.fixture
def db(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
    yield conn
    conn.close()


def version(db: sqlite3.Connection) -> int:
    return db.execute("PRAGMA user_version").fetchone()[0]


def tables(db: sqlite3.Connection) -> set[str]:
    return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def columns(db: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in db.execute(f"PRAGMA table_info({table})")]


def test_version_is_the_length_of_the_chain():
    assert schema.VERSION == len(schema.MIGRATIONS) == 6


def test_a_new_file_runs_the_whole_chain(db: sqlite3.Connection):
    assert schema.migrate(db) == 0
    assert version(db) == schema.VERSION
    assert {"experiments", "runs", "events", "feedback", "settings", "inbox"} <= tables(db)
    assert {"failures", "retry_at", "margin", "remeasured_delta", "asset"} <= set(columns(db, "experiments"))
    assert "train_py" not in columns(db, "experiments")
    assert {"rerun_of", "note"} <= set(columns(db, "runs"))
    assert not db.in_transaction


def test_an_up_to_date_file_is_left_alone(db: sqlite3.Connection):
    schema.migrate(db)
    before = list(db.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name"))
    assert schema.migrate(db) == schema.VERSION
    assert list(db.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name")) == before
    assert version(db) == schema.VERSION


def test_each_migration_moves_one_version_up(db: sqlite3.Connection, monkeypatch):
    monkeypatch.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:1])
    monkeypatch.setattr(schema, "VERSION", 1)
    assert schema.migrate(db) == 0
    assert version(db) == 1
    assert "inbox" not in tables(db) and "failures" not in columns(db, "experiments")
    db.execute(
        "INSERT INTO experiments(id, state, title, hypothesis, branch, code_hash, train_py, base_sha,"
        " created_at, updated_at) VALUES (7, 'done', 't', 'h', 'autoresearch/7-x', 'c', 'p', 'b', 1, 2)"
    )
    monkeypatch.undo()
    assert schema.migrate(db) == 1
    assert version(db) == schema.VERSION
    row = db.execute("SELECT id, state, branch, failures, retry_at FROM experiments").fetchone()
    assert row == (7, "done", "autoresearch/7-x", 0, None)
    # AUTOINCREMENT carries on from the copied ids
    db.execute("INSERT INTO experiments(state, base_sha, created_at, updated_at) VALUES ('proposing', 'b', 3, 3)")
    assert db.execute("SELECT MAX(id) FROM experiments").fetchone()[0] == 8


def test_rounds_the_publisher_had_shown_count_as_the_experiments_reopenings(db: sqlite3.Connection, monkeypatch):
    monkeypatch.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:5])
    monkeypatch.setattr(schema, "VERSION", 5)
    schema.migrate(db)
    for exp_id, state in ((1, "done"), (2, "done"), (3, "measuring")):
        db.execute(
            "INSERT INTO experiments(id, state, title, hypothesis, base_sha, created_at, updated_at)"
            f" VALUES ({exp_id}, '{state}', 't', 'h', 'b', 1, 2)"
        )
    db.execute(
        "INSERT INTO published(experiment_id, key, value) VALUES (1, 'round', '2'), (2, 'final', 'keep'),"
        " (3, 'round', '1'), (3, 'final', 'discard')"  # 3: measured again, not noticed yet
    )
    monkeypatch.undo()
    assert schema.migrate(db) == 5
    assert db.execute("SELECT id, reopened FROM experiments ORDER BY id").fetchall() == [(1, 2), (2, 0), (3, 2)]


def test_a_file_too_new_is_refused_and_left_alone(db: sqlite3.Connection):
    db.execute(f"PRAGMA user_version = {schema.VERSION + 3}")
    with pytest.raises(schema.SchemaTooNew) as error:
        schema.migrate(db)
    message = str(error.value)
    assert f"schema version {schema.VERSION + 3}" in message and f"({schema.VERSION})" in message
    assert "upgrade autoresearch-bot" in message
    assert isinstance(error.value, RuntimeError)
    assert version(db) == schema.VERSION + 3 and tables(db) == set()


def test_a_migration_that_fails_half_way_leaves_the_file_at_its_old_version(db: sqlite3.Connection, monkeypatch):
    schema.migrate(db)
    db.execute("INSERT INTO feedback(at, author, text) VALUES (1, 'alice', 'kept')")
    monkeypatch.setattr(schema, "MIGRATIONS", [*schema.MIGRATIONS, BROKEN])
    monkeypatch.setattr(schema, "VERSION", schema.VERSION + 1)
    with pytest.raises(sqlite3.OperationalError, match="no_such_table"):
        schema.migrate(db)
    assert version(db) == len(schema.MIGRATIONS) - 1
    assert "half" not in tables(db) and "extra" not in columns(db, "runs")  # its first statements undone
    assert not db.in_transaction
    assert db.execute("SELECT text FROM feedback").fetchall() == [("kept",)]
    # the fixed migration then applies from the same version
    monkeypatch.setattr(schema, "MIGRATIONS", [*schema.MIGRATIONS[:-1], THIRD])
    assert schema.migrate(db) == len(schema.MIGRATIONS) - 1
    assert version(db) == len(schema.MIGRATIONS)
    assert "third" in tables(db) and "extra" in columns(db, "runs")


def test_a_failing_migration_keeps_the_versions_committed_before_it(db: sqlite3.Connection, monkeypatch):
    monkeypatch.setattr(schema, "MIGRATIONS", [schema.V1, BROKEN])
    with pytest.raises(sqlite3.OperationalError):
        schema.migrate(db)
    assert version(db) == 1  # V1 is its own transaction and was committed
    assert "runs" in tables(db) and "half" not in tables(db)


def test_an_interrupted_migration_is_rolled_back(db: sqlite3.Connection, monkeypatch):
    real = schema._statements

    def interrupted(script: str):
        statements = real(script)
        yield statements[0]
        raise KeyboardInterrupt

    monkeypatch.setattr(schema, "_statements", interrupted)
    with pytest.raises(KeyboardInterrupt):
        schema.migrate(db)
    assert version(db) == 0 and tables(db) == set()
    assert not db.in_transaction


def test_statements_drop_comments_and_split_on_semicolons():
    script = """
    CREATE TABLE t (a INTEGER);  -- a comment; with a semicolon
    -- a whole line of comment;
    CREATE INDEX t_a ON t(a);
    """
    assert schema._statements(script) == ["CREATE TABLE t (a INTEGER)", "CREATE INDEX t_a ON t(a)"]
    for migration in schema.MIGRATIONS:
        assert all("--" not in s and s for s in schema._statements(migration))
