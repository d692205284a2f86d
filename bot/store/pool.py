"""Read-only connections to a store, one per thread, for the processes that only look: the dashboard
and the webhook server's /healthz.

Each connection is opened with SQLite's `mode=ro` and `query_only`, so nothing read through it can
write, and refuses a file of another schema version (this release would misread it). A read in
`snapshot()` is one read transaction: everything in it is from one moment, and it ends at once, so
the conductor's checkpoints are never held up. A connection closes when its thread ends or when it
failed (the next read opens a fresh one), and all of them at close_all().
"""

from __future__ import annotations

import sqlite3
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bot.store import schema


class StoreUnavailable(RuntimeError):
    """The store cannot be read now: the message says why and what to do; `reason` says why alone,
    without the path (for an answer anyone may see)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class _Connection(sqlite3.Connection):
    """A connection a weak reference can point at: the pool's list of them must not keep a finished
    thread's connection open (the server's worker threads come and go)."""


class ReadPool:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.uri = path.resolve().as_uri() + "?mode=ro"
        self._local = threading.local()  # a thread's connection closes when the thread ends
        self._opened: weakref.WeakSet[sqlite3.Connection] = weakref.WeakSet()  # for close_all
        self._lock = threading.Lock()

    def get(self) -> sqlite3.Connection:
        """This thread's connection (opened on first use); raises StoreUnavailable."""
        db = getattr(self._local, "db", None)
        if db is not None:
            return db
        if not self.path.is_file():
            raise StoreUnavailable(
                f"no store at {self.path} yet: start the loop there (autoresearch demo or "
                "serve), and this page fills in by itself",
                "no store there yet",
            )
        try:
            db = sqlite3.connect(
                self.uri, uri=True, timeout=5, isolation_level=None, check_same_thread=False, factory=_Connection
            )
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA query_only = ON")
            version = db.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.Error as error:
            raise StoreUnavailable(f"cannot read the store at {self.path}: {error}", str(error)) from None
        if version != schema.VERSION:
            db.close()
            which = "an older" if version < schema.VERSION else "a newer"
            raise StoreUnavailable(
                f"the store at {self.path} was written by {which} release (schema {version}, "
                f"this one reads {schema.VERSION}): run this release's bot on it once, or "
                "the dashboard of the release that wrote it",
                f"schema version {version}, this release reads {schema.VERSION}",
            )
        self._local.db = db
        with self._lock:
            self._opened.add(db)
        return db

    @contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        """A connection inside one read transaction: everything read in it is from one moment.
        Raises StoreUnavailable (for an error inside the block too, and the connection is dropped)."""
        db = self.get()
        try:
            db.execute("BEGIN")
            try:
                yield db
            finally:
                db.execute("COMMIT")  # ends the read: the conductor's checkpoints are never held up
        except sqlite3.Error as error:
            self._local.db = None
            with self._lock:
                self._opened.discard(db)
            db.close()
            raise StoreUnavailable(f"cannot read the store at {self.path}: {error}", str(error)) from None

    def check(self) -> None:
        """Raises StoreUnavailable unless the store can be read now (a health check)."""
        with self.snapshot() as db:
            db.execute("SELECT COALESCE(MAX(id), 0) FROM inbox").fetchone()

    def close_all(self) -> None:
        """Close every thread's connection (the server stops)."""
        with self._lock:
            opened = list(self._opened)
            self._opened.clear()
        for db in opened:
            db.close()
