"""The measuring process: runs query.sql on a run's copy of the database and times its query.

`main([DIR])`, started by the evaluator in a process of its own (evaluator.MEASURE) (sandboxed where
bubblewrap works), with DIR holding the copy (shop.sqlite), the asset (query.sql) and the plan
(plan.json: the parameter sets, the reference's rows for each, and the order of the timed passes).
It is the runner's code: the asset is SQL it executes under the authorizer (guard.py), never code
of its own. In order:
1. the asset's CREATE INDEX and ANALYZE statements, timed together (index_build_s: reported, not
   part of the latencies; the evaluator's time box bounds it);
2. the correctness pass: the query once for every parameter set, in the task's order; its rows
   must be the reference's, in the reference's order (the reference orders its rows completely),
   integers and text exactly, real numbers to a relative 1e-9. The first set that differs ends the
   run, `rejected`. This pass also warms the caches and is not timed;
3. the timed passes: every parameter set once per pass, in the plan's order, each execution timed
   from its start to its last row fetched; its rows are checked again, untimed (a query must return
   the reference's rows every time, not only once).
It prints one line, RESULT_PREFIX and JSON: {"status": "ok", "latencies_ms": [...], ...}, or
{"status": "rejected" | "crash", "error": "..."}.
"""

from __future__ import annotations

import gc
import json
import math
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from runner.tasks.query_latency.asset import AssetRefused, kind, parse, snippet
from runner.tasks.query_latency.guard import Guard, connect

RESULT_PREFIX = "[measure] "
DB_FILE, ASSET_FILE, PLAN_FILE = "shop.sqlite", "query.sql", "plan.json"


class Refused(Exception):
    """The asset did what the task does not allow, or returned rows other than the reference's."""


def measure(directory: Path) -> dict[str, Any]:
    plan = json.loads((directory / PLAN_FILE).read_text())
    try:
        asset = parse((directory / ASSET_FILE).read_text(encoding="utf-8"))
    except AssetRefused as error:  # the evaluator checked already: this is the second look
        return {"status": "rejected", "error": str(error)}
    con, guard = connect(directory / DB_FILE)
    try:
        started = time.perf_counter()
        for statement in asset.setup:
            guard.start("analyze" if kind(statement) == "ANALYZE" else "index")
            _run(con, guard, statement, {})
        index_build_s = time.perf_counter() - started
        guard.start("query")
        parameters, references = plan["parameters"], plan["reference_rows"]
        rows = 0
        for number, (values, reference) in enumerate(zip(parameters, references, strict=True), 1):
            found = _run(con, guard, asset.query, values, limit=len(reference) + 1)
            difference = differs(found, reference)
            if difference:
                raise Refused(
                    f"query.sql returned other rows than the reference for parameter set {number} of "
                    f"{len(parameters)} ({json.dumps(values)}): {difference}"
                )
            rows += len(found)
        latencies: list[float] = []
        gc.disable()  # a collection's pause is Python's, not the query's
        for order in plan["passes"]:
            for index in order:
                start = time.perf_counter()
                found = con.execute(asset.query, parameters[index]).fetchall()
                latencies.append((time.perf_counter() - start) * 1000.0)
                if differs(found, references[index]):  # the same rows every time, not only once
                    raise Refused(
                        f"query.sql returned other rows than the reference for parameter set {index + 1} in "
                        f"timed execution {len(latencies)}, after returning the reference's rows before"
                    )
    except Refused as error:
        return {"status": "rejected", "error": str(error)}
    except sqlite3.Error as error:
        return {"status": "crash", "error": f"SQLite could not run query.sql: {type(error).__name__}: {error}"}
    finally:
        gc.enable()
        con.close()
    return {
        "status": "ok",
        "latencies_ms": latencies,
        "index_build_s": index_build_s,
        "indexes": asset.indexes,
        "rows": rows,
    }


def _run(con: sqlite3.Connection, guard: Guard, statement: str, values: dict[str, str], limit: int = 0) -> list[Any]:
    """Execute one statement; its rows (at most `limit`, when given). A refusal of the guard is Refused."""
    try:
        cursor = con.execute(statement, values)
        return cursor.fetchmany(limit) if limit else cursor.fetchall()
    except sqlite3.DatabaseError as error:
        if guard.refused:
            raise Refused(f"{guard.refused}: {snippet(statement)}") from None
        if isinstance(error, sqlite3.ProgrammingError):  # parameters: raised before SQLite compiles it
            raise sqlite3.OperationalError(f"{error} (the parameters are :region, :category, :start, :end)") from None
        raise


def differs(found: list[Any], reference: list[list[Any]]) -> str:
    """How `found` differs from the reference's rows, in words; "" when it does not."""
    for number, (row, expected) in enumerate(zip(found, reference, strict=False), 1):
        if len(row) != len(expected) or not all(map(_same, row, expected)):
            return f"row {number} is {_show(row)} where the reference's is {_show(expected)}"
    if len(found) != len(reference):
        more = "at least " if len(found) > len(reference) else ""
        return f"it returned {more}{len(found)} row(s) where the reference returns {len(reference)}"
    return ""


def _same(value: Any, expected: Any) -> bool:
    if isinstance(value, float) or isinstance(expected, float):
        if isinstance(value, int | float) and isinstance(expected, int | float):
            return math.isclose(value, expected, rel_tol=1e-9)
        return False
    return type(value) is type(expected) and value == expected


def _show(row: Any) -> str:
    text = json.dumps(list(row), default=repr)
    return text if len(text) <= 200 else text[:197] + "..."


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: measure DIR (the evaluator's run directory)", file=sys.stderr)
        return 2
    result = measure(Path(argv[0]))
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0
