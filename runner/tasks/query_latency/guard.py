"""What query.sql's statements may do to the database, enforced by SQLite itself: an authorizer.

SQLite asks the authorizer about every action a statement would take while it compiles it (each
table and column read, each function, each write, each attach); an action refused here makes the
statement fail to compile, so nothing of it runs. The asset's statements run in phases, and each
phase allows its own:
- every phase: reading any table (SELECT, READ), recursive common table expressions, and every
  function but `load_extension` and `fts3_tokenizer` (which reach outside the database);
- "index" (a CREATE INDEX statement): creating an index on a table of the database, and the
  writes to sqlite_master that record it;
- "analyze" (ANALYZE): gathering statistics, in sqlite_stat1/sqlite_stat4 and sqlite_master;
- "query": nothing more. Temporary b-trees for sorting, grouping and DISTINCT need no permission.
Everything else is refused with the reason in words (`Guard.refused`): ATTACH (and VACUUM, which
SQLite carries out as an attach), DETACH, PRAGMA, writes to the data tables, dropping or altering
anything, tables, views, triggers and virtual tables, transactions.

`connect` opens a run's copy of the database for the asset: the connection's settings are set
first (by the evaluator, not the asset), no database may be attached (SQLITE_LIMIT_ATTACHED 0, a
second wall behind the authorizer), extensions cannot be loaded, and the guard is installed last.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Literal

Phase = Literal["index", "analyze", "query"]
CACHE_KIB = 256 * 1024  # SQLite's page cache: the whole cpu database fits, as on a server with the memory
SCHEMA_TABLES = ("sqlite_master", "sqlite_schema", "sqlite_temp_master", "sqlite_temp_schema")
STATISTICS_TABLES = ("sqlite_stat1", "sqlite_stat4")
REFUSED_FUNCTIONS = ("load_extension", "fts3_tokenizer")
_WRITES = (sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE)
_ALWAYS = (sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE)
# What each refused action means, for the reason given; the argument is the authorizer's first.
_MEANINGS = {
    sqlite3.SQLITE_ATTACH: "attaches another database ({})",
    sqlite3.SQLITE_DETACH: "detaches a database ({})",
    sqlite3.SQLITE_PRAGMA: "uses PRAGMA {} (the evaluator sets the connection's settings)",
    sqlite3.SQLITE_INSERT: "writes to table {}",
    sqlite3.SQLITE_UPDATE: "writes to table {}",
    sqlite3.SQLITE_DELETE: "deletes from table {}",
    sqlite3.SQLITE_CREATE_INDEX: "creates index {} where it may not",
    sqlite3.SQLITE_CREATE_TABLE: "creates table {}",
    sqlite3.SQLITE_CREATE_TEMP_TABLE: "creates temporary table {}",
    sqlite3.SQLITE_CREATE_TEMP_INDEX: "creates temporary index {}",
    sqlite3.SQLITE_CREATE_VIEW: "creates view {}",
    sqlite3.SQLITE_CREATE_TEMP_VIEW: "creates temporary view {}",
    sqlite3.SQLITE_CREATE_TRIGGER: "creates trigger {}",
    sqlite3.SQLITE_CREATE_TEMP_TRIGGER: "creates temporary trigger {}",
    sqlite3.SQLITE_CREATE_VTABLE: "creates virtual table {}",
    sqlite3.SQLITE_DROP_INDEX: "drops index {}",
    sqlite3.SQLITE_DROP_TABLE: "drops table {}",
    sqlite3.SQLITE_DROP_TEMP_TABLE: "drops table {}",
    sqlite3.SQLITE_DROP_TEMP_INDEX: "drops index {}",
    sqlite3.SQLITE_DROP_VIEW: "drops view {}",
    sqlite3.SQLITE_DROP_TEMP_VIEW: "drops view {}",
    sqlite3.SQLITE_DROP_TRIGGER: "drops trigger {}",
    sqlite3.SQLITE_DROP_TEMP_TRIGGER: "drops trigger {}",
    sqlite3.SQLITE_DROP_VTABLE: "drops virtual table {}",
    sqlite3.SQLITE_ALTER_TABLE: "alters a table ({})",
    sqlite3.SQLITE_REINDEX: "rebuilds index {}",
    sqlite3.SQLITE_ANALYZE: "analyzes {} outside an ANALYZE statement",
    sqlite3.SQLITE_TRANSACTION: "manages transactions ({})",
    sqlite3.SQLITE_SAVEPOINT: "manages transactions (savepoint {})",
    sqlite3.SQLITE_FUNCTION: "calls a function it may not call",
}


class Guard:
    """The authorizer. `start(phase)` before each statement of the asset; after a refusal,
    `refused` says why in words (SQLite's own error only says "not authorized")."""

    def __init__(self) -> None:
        self.phase: Phase = "query"
        self.refused = ""

    def start(self, phase: Phase) -> None:
        self.phase, self.refused = phase, ""

    def __call__(
        self, action: int, arg1: str | None, arg2: str | None, database: str | None, source: str | None
    ) -> int:
        if self._allows(action, arg1, arg2, database):
            return sqlite3.SQLITE_OK
        if not self.refused:  # the first refusal ends the statement's compilation
            self.refused = "query.sql " + self._meaning(action, arg1, arg2)
        return sqlite3.SQLITE_DENY

    def _allows(self, action: int, arg1: str | None, arg2: str | None, database: str | None) -> bool:
        if action in _ALWAYS:
            return True
        if action == sqlite3.SQLITE_FUNCTION:
            return (arg2 or "").lower() not in REFUSED_FUNCTIONS
        main = database == "main"
        if self.phase == "index":
            if action == sqlite3.SQLITE_CREATE_INDEX:  # arg1 the index, arg2 its table
                return main and not (arg2 or "").lower().startswith("sqlite_")
            if action == sqlite3.SQLITE_REINDEX:  # the new index being filled
                return main
            return action == sqlite3.SQLITE_INSERT and main and arg1 in SCHEMA_TABLES
        if self.phase == "analyze":
            if action == sqlite3.SQLITE_ANALYZE:
                return main
            if action == sqlite3.SQLITE_CREATE_TABLE:
                return main and arg1 in STATISTICS_TABLES
            return action in _WRITES and main and arg1 in (*SCHEMA_TABLES, *STATISTICS_TABLES)
        return False

    @staticmethod
    def _meaning(action: int, arg1: str | None, arg2: str | None) -> str:
        if action == sqlite3.SQLITE_FUNCTION:
            if (arg2 or "").lower() == "load_extension":
                return "loads an extension (load_extension)"
            return f"calls {arg2}(), which the task does not allow"
        if action == sqlite3.SQLITE_ATTACH and not arg1:
            return "vacuums the database"
        if action in _WRITES and arg1 in SCHEMA_TABLES:  # what SQLite asks first for DROP, CREATE TABLE...
            return f"changes the database's schema (it would write to {arg1})"
        template = _MEANINGS.get(action, "does what the task does not allow (SQLite authorizer action {})")
        return template.format(arg1 if action in _MEANINGS else action)


def connect(path: Path) -> tuple[sqlite3.Connection, Guard]:
    """The run's copy of the database at `path`, opened for the asset with the guard installed."""
    con = sqlite3.connect(f"file:{path}?mode=rw", uri=True, isolation_level=None)
    con.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    if hasattr(con, "enable_load_extension"):  # absent where Python's SQLite was built without extensions
        con.enable_load_extension(False)
    con.execute("PRAGMA journal_mode = MEMORY")  # a private copy: index builds need no journal on disk
    con.execute("PRAGMA synchronous = OFF")
    con.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
    guard = Guard()
    con.set_authorizer(guard)
    return con, guard
