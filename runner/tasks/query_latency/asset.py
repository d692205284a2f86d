"""query.sql, the query-latency task's asset: the indexes it creates, then the one query measured.

Its format: any number of `CREATE INDEX` (or `CREATE UNIQUE INDEX`) statements and `ANALYZE`
statements, then exactly one query (`SELECT`, or `WITH ... SELECT`) as its last statement, each
ended by a semicolon (the last one's may be left out). Comments (`--`, `/* */`) may go anywhere.
The query reads its parameter set through named parameters: `:region`, `:category`, `:start` and
`:end` (runner.tasks.query_latency.database says what they hold).

`parse` checks that shape and says what breaks it (`AssetRefused`, which the evaluator turns into a
`rejected` run): no query, two queries, or a statement of a kind the task does not allow (ATTACH,
VACUUM, PRAGMA, a write to the data). What SQLite itself refuses or fails on (a syntax error, an
unknown column) is found when the statements run, and is the run's `crash`. The words at the start
of a statement only sort it; the authorizer (runner.tasks.query_latency.guard) decides what each
statement may really do, so `WITH x AS (...) INSERT ...` passes here and is refused there.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass

MAX_BYTES = 32 * 1024  # a query with its indexes is a few KB; splitting costs the square of this
SETUP_KINDS = ("CREATE INDEX", "CREATE UNIQUE INDEX", "ANALYZE")
QUERY_KINDS = ("SELECT", "WITH")
# Statements the task never allows, by their first words, and what doing them means.
REFUSED_KINDS = (
    (("ATTACH", "DETACH"), "attaches another database"),
    (("VACUUM",), "vacuums the database (VACUUM rewrites it; VACUUM INTO writes a copy elsewhere)"),
    (("PRAGMA",), "uses a PRAGMA (the evaluator sets the connection's settings)"),
    (("INSERT", "REPLACE", "UPDATE", "DELETE"), "writes to the data tables"),
    (("DROP", "ALTER", "CREATE", "REINDEX"), "changes the schema beyond creating indexes"),
    (("BEGIN", "COMMIT", "END", "ROLLBACK", "SAVEPOINT", "RELEASE"), "manages transactions (the evaluator does)"),
)
_COMMENTS = re.compile(r"--[^\n]*|/\*.*?(\*/|$)", re.DOTALL)


class AssetRefused(ValueError):
    """query.sql is not of the task's shape, or holds a statement the task never allows."""


@dataclass(frozen=True)
class Asset:
    setup: tuple[str, ...]  # CREATE INDEX and ANALYZE statements, in order
    query: str

    @property
    def indexes(self) -> int:
        return sum(kind(statement) != "ANALYZE" for statement in self.setup)


def parse(text: str) -> Asset:
    """The asset's statements, sorted; AssetRefused saying what is wrong with its shape."""
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        size = -1
    if size < 0 or "\x00" in text:
        raise AssetRefused("query.sql is not text: it holds a NUL character or one that is not UTF-8")
    if size > MAX_BYTES:
        raise AssetRefused(f"query.sql is larger than {MAX_BYTES // 1024} KB")
    statements = split(text)
    queries = [n for n, statement in enumerate(statements, 1) if kind(statement) in QUERY_KINDS]
    for n, statement in enumerate(statements, 1):
        what = kind(statement)
        if what in QUERY_KINDS or what in SETUP_KINDS:
            continue
        for words, meaning in REFUSED_KINDS:
            if what.split(" ")[0] in words:
                raise AssetRefused(f"query.sql {meaning}: {snippet(statement)}")
        raise AssetRefused(
            f"query.sql's statement {n} is not a CREATE INDEX, ANALYZE or query statement: {snippet(statement)}"
        )
    if not queries:
        raise AssetRefused(
            "query.sql holds no query: after its CREATE INDEX and ANALYZE statements it must end with one "
            "SELECT (or WITH ... SELECT) query"
        )
    if len(queries) > 1:
        raise AssetRefused(
            f"query.sql holds {len(queries)} queries (statements {', '.join(map(str, queries))}): the task "
            "measures exactly one, its last statement"
        )
    if queries[0] != len(statements):
        raise AssetRefused(
            f"query.sql's query is statement {queries[0]} of {len(statements)}: CREATE INDEX and ANALYZE "
            "statements come before it, and nothing after it"
        )
    return Asset(setup=tuple(statements[:-1]), query=statements[-1])


def split(text: str) -> list[str]:
    """The statements of `text` (each with its semicolon; comments kept), empty ones left out.
    A semicolon ends a statement where SQLite says the text up to it is complete (not in a string,
    a quoted name or a comment)."""
    statements, start = [], 0
    for end, char in enumerate(text):
        if char == ";" and sqlite3.complete_statement(text[start : end + 1]):
            statements.append(text[start : end + 1])
            start = end + 1
    statements.append(text[start:])
    return [statement.strip() for statement in statements if kind(statement)]


def kind(statement: str) -> str:
    """The first words of a statement, upper case, comments left out: "CREATE INDEX", "SELECT"..."""
    words = _COMMENTS.sub(" ", statement).replace("(", " ( ").split()
    if not words:
        return ""
    first = words[0].upper().rstrip(";")
    if first == "CREATE" and len(words) > 1:
        second = words[1].upper()
        if second == "UNIQUE" and len(words) > 2:
            return f"CREATE UNIQUE {words[2].upper()}"
        return f"CREATE {second}"
    return first


def snippet(statement: str, limit: int = 120) -> str:
    """A statement on one line without its comments, cut at `limit` characters."""
    line = " ".join(_COMMENTS.sub(" ", statement).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."
