"""The store's one read-write connection: opened (and migrated) here, transactions, savepoints, and the
failpoints of the crash tests.

Every component of the store writes through one Database, so a unit of work that spans components
(a run queued with its experiment's state change) is one transaction: `transaction()` nests, and
only the outermost block commits. The tables and their migrations live in bot.store.schema.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bot.store import schema


def failpoint(name: str) -> None:
    """Fault injection for the crash tests: AUTORESEARCH_FAILPOINT=name kills this process with
    SIGKILL right after the transition `name` is committed."""
    if os.environ.get("AUTORESEARCH_FAILPOINT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


class Database:
    """One SQLite connection to a state.db (WAL, synchronous=FULL), usable from any thread but by
    one at a time; the file is created, or brought up to the current schema, when it opens."""

    def __init__(self, path: Path) -> None:
        if path.parent.exists() and not path.parent.is_dir():
            raise NotADirectoryError(f"{path.parent} is a file, not a work directory: choose another --workdir")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
        self.conn.row_factory = sqlite3.Row
        self._depth = 0  # nesting of transaction(): only the outermost one commits
        self._savepoints = 0  # savepoints open, which names the next one
        try:
            self.upgraded_from = schema.migrate(self.conn)  # the schema version the file had
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=FULL")
        except BaseException:
            self.conn.close()
            raise

    def close(self) -> None:
        self.conn.close()

    def execute(self, sql: str, params: tuple | list = ()) -> sqlite3.Cursor:
        return self.conn.execute(sql, params)

    def failpoint(self, name: str) -> None:
        """The crash tests' failpoint `name`, unless an outer transaction still holds the write back."""
        if not self._depth:
            failpoint(name)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One atomic unit; nested uses join the outer one (an exception that reaches the outermost
        block rolls back everything; one caught inside it keeps the inner writes: see savepoint())."""
        if self._depth:
            self._depth += 1
            try:
                yield self.conn
            finally:
                self._depth -= 1
            return
        self.conn.execute("BEGIN IMMEDIATE")
        with self._outermost():
            yield self.conn

    @contextmanager
    def transaction_polling(self, *, poll_s: float, patience_s: float) -> Iterator[sqlite3.Connection]:
        """An outermost transaction whose write lock is waited for by trying again every `poll_s`, up to
        `patience_s` (then sqlite3.OperationalError), rather than by SQLite's busy handler, whose
        sleeps grow to 100 ms and go on after the lock is free: for a writer that someone waits on."""
        (timeout_ms,) = self.conn.execute("PRAGMA busy_timeout").fetchone()
        self.conn.execute("PRAGMA busy_timeout = 0")
        deadline = time.monotonic() + patience_s
        try:
            while True:
                try:
                    self.conn.execute("BEGIN IMMEDIATE")
                    break
                except sqlite3.OperationalError as error:
                    if error.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY or time.monotonic() > deadline:
                        raise
                time.sleep(poll_s)
        finally:
            self.conn.execute(f"PRAGMA busy_timeout = {int(timeout_ms)}")
        with self._outermost():
            yield self.conn

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        """Inside a transaction, writes that an exception leaving this block undoes alone (the
        exception propagates; the transaction around goes on if the caller catches it)."""
        if not self._depth:
            raise RuntimeError("a savepoint belongs inside store.transaction()")
        self._savepoints += 1
        name = f"savepoint_{self._savepoints}"
        self.conn.execute(f"SAVEPOINT {name}")
        try:
            yield
        except BaseException:
            self.conn.execute(f"ROLLBACK TO {name}")
            self.conn.execute(f"RELEASE {name}")
            raise
        else:
            self.conn.execute(f"RELEASE {name}")
        finally:
            self._savepoints -= 1

    @contextmanager
    def _outermost(self) -> Iterator[None]:
        """The body of a transaction just begun: committed at its end, rolled back on any exception
        (a failed COMMIT included)."""
        self._depth = 1
        try:
            yield
            self.conn.execute("COMMIT")
        except BaseException:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            raise
        finally:
            self._depth = 0
