"""bot.store.pool on real SQLite files: read-only connections, one moment per snapshot, a file missing,
unreadable or of another schema refused with its reason, and a connection that failed replaced."""

from __future__ import annotations

import gc
import sqlite3
import threading
import weakref
from pathlib import Path

import pytest

from bot.store import LoopState, ReadPool, Store, StoreUnavailable, schema


@pytest.fixture
def store(tmp_path: Path):
    s = Store(tmp_path / "state.db")
    yield s
    s.close()


@pytest.fixture
def pool(store: Store):
    readers = ReadPool(store.path)
    yield readers
    readers.close_all()


def test_a_pooled_connection_never_writes(store: Store, pool: ReadPool):
    with pytest.raises(sqlite3.OperationalError, match="readonly|read-only"):
        pool.get().execute("INSERT INTO settings(key, value) VALUES ('x', 'y')")
    assert store.db.execute("SELECT COUNT(*) FROM settings").fetchone()[0] == 0


def test_a_thread_keeps_its_connection(pool: ReadPool):
    assert pool.get() is pool.get()


def test_a_snapshot_reads_one_moment(store: Store, pool: ReadPool):
    store.feedback.add("alice", "first")
    with pool.snapshot() as db:
        assert db.execute("SELECT COUNT(*) FROM feedback").fetchone()[0] == 1  # the read begins here
        store.feedback.add("alice", "second")  # committed meanwhile: not seen inside the snapshot
        assert db.execute("SELECT COUNT(*) FROM feedback").fetchone()[0] == 1
    with pool.snapshot() as db:
        assert db.execute("SELECT COUNT(*) FROM feedback").fetchone()[0] == 2


def test_the_loop_state_reads_through_a_pooled_connection(store: Store, pool: ReadPool):
    store.state.paused = True
    store.state.identity = {"profile": "cpu"}
    with pool.snapshot() as db:
        state = LoopState(db)
        assert state.paused and state.identity == {"profile": "cpu"}


def test_no_store_yet_is_unavailable_with_what_to_do(tmp_path: Path):
    pool = ReadPool(tmp_path / "state.db")
    with pytest.raises(StoreUnavailable, match="no store at .* yet: start the loop there") as raised:
        pool.check()
    assert raised.value.reason == "no store there yet"
    assert not (tmp_path / "state.db").exists()  # looking creates nothing


def test_a_file_that_is_no_database_is_unavailable(tmp_path: Path):
    path = tmp_path / "state.db"
    path.write_bytes(b"not a database, but long enough to have a header " * 4)
    with pytest.raises(StoreUnavailable) as raised:
        ReadPool(path).check()
    assert raised.value.reason == "file is not a database"
    assert str(path) in str(raised.value)


@pytest.mark.parametrize(("version", "which"), [(schema.VERSION - 1, "an older"), (schema.VERSION + 1, "a newer")])
def test_a_store_of_another_schema_is_refused_unread(store: Store, version: int, which: str):
    store.db.execute(f"PRAGMA user_version = {version}")
    with pytest.raises(StoreUnavailable, match=f"written by {which} release") as raised:
        ReadPool(store.path).get()
    assert raised.value.reason == f"schema version {version}, this release reads {schema.VERSION}"


def test_a_connection_that_failed_is_replaced(store: Store, pool: ReadPool):
    first = pool.get()
    with pytest.raises(StoreUnavailable, match="no such table"):
        with pool.snapshot() as db:
            db.execute("SELECT * FROM no_such_table")
    with pytest.raises(sqlite3.ProgrammingError):  # closed
        first.execute("SELECT 1")
    second = pool.get()
    assert second is not first
    pool.check()


def test_close_all_closes_every_thread_connection(pool: ReadPool):
    db = pool.get()
    pool.close_all()
    with pytest.raises(sqlite3.ProgrammingError):
        db.execute("SELECT 1")


def test_a_finished_thread_leaves_no_connection_open(pool: ReadPool):
    held: list[weakref.ref] = []
    worker = threading.Thread(target=lambda: held.append(weakref.ref(pool.get())))
    worker.start()
    worker.join()
    gc.collect()
    assert held[0]() is None  # closed and gone with its thread, not kept for close_all
