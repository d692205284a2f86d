"""The query-latency task's evaluator on the smoke database: preparation, the correctness gate,
the authorizer (with and without the sandbox), the time box, and the shape of query.sql."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from runner import sandbox
from runner.data import DataCorrupt, DataMissing
from runner.tasks import get_task
from runner.tasks import query_latency as task
from runner.tasks.query_latency import asset, database, evaluator, guard, measure

GOOD = (Path(__file__).parent / "indexed_query.sql").read_text()  # also bench/query_latency.py's
REFERENCE = task.REFERENCE.read_text()
BWRAP = pytest.mark.skipif(not sandbox.available()[0], reason="bubblewrap cannot make a sandbox here")
# Every hostile asset is tried both ways: the authorizer must hold without the sandbox.
BOTH_WAYS = pytest.mark.parametrize("use_sandbox", [pytest.param(None, marks=BWRAP, id="sandboxed"), False])


@pytest.fixture(scope="session")
def smoke_database(autoresearch_cache: Path) -> str:
    """The smoke database, prepared once in the session's cache; its fingerprint."""
    return task.prepare("smoke")


def run(text: str, tmp_path: Path, **options) -> evaluator.Evaluation:
    return task.evaluate(text, "smoke", 0, tmp_path / "run", **options)


# --- preparation ---------------------------------------------------------------------------------


def test_the_registered_task_names_this_evaluator():
    assert get_task("query-latency").evaluator == task.__name__
    assert get_task("query-latency").asset == task.STARTER.name


def test_preparation_is_deterministic_and_a_second_call_does_no_work(smoke_database, tmp_path, monkeypatch):
    assert task.fingerprint("smoke") == smoke_database
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path))
    assert task.prepare("smoke") == smoke_database  # made afresh elsewhere: the same files
    made = database.scale_dir(database.get_scale("smoke")) / database.DB_FILE
    before = made.stat().st_mtime_ns

    def generate(*args):
        raise AssertionError("a prepared database is not made again")

    monkeypatch.setattr(database.generate, "database", generate)
    assert task.prepare("smoke") == smoke_database
    assert made.stat().st_mtime_ns == before


def test_the_smoke_database_is_skewed_and_its_workload_has_rows(smoke_database):
    prepared = database.load("smoke")
    assert prepared.table_rows["order_items"] > prepared.table_rows["orders"] > prepared.table_rows["customers"]
    assert len(prepared.parameters) == database.get_scale("smoke").parameter_sets
    assert all(rows for rows in prepared.reference_rows)  # no parameter set that any empty answer passes
    con = sqlite3.connect(f"file:{prepared.database}?mode=ro", uri=True)
    busiest, median = con.execute(
        "SELECT MAX(n), (SELECT n FROM (SELECT COUNT(*) AS n FROM orders GROUP BY customer_id ORDER BY n) "
        "LIMIT 1 OFFSET (SELECT COUNT(DISTINCT customer_id) FROM orders) / 2) "
        "FROM (SELECT COUNT(*) AS n FROM orders GROUP BY customer_id)"
    ).fetchone()
    december, june = (
        con.execute("SELECT COUNT(*) FROM orders WHERE substr(ordered_at, 6, 2) = ?", (month,)).fetchone()[0]
        for month in ("12", "06")
    )
    con.close()
    assert busiest > 20 * median  # a few customers place many orders
    assert december > 1.3 * june  # seasons


def cut_short(path: Path) -> None:
    with open(path, "r+b") as handle:
        handle.truncate(4096)


def change_a_reference_row(path: Path) -> None:
    workload = json.loads(path.read_text())
    workload["reference_rows"][0][0][2] += 1
    path.write_text(json.dumps(workload))


@pytest.mark.parametrize(
    ("name", "damage"),
    [
        (database.DB_FILE, cut_short),
        (database.WORKLOAD_FILE, change_a_reference_row),
        (database.MANIFEST_FILE, Path.unlink),
    ],
)
def test_prepared_files_damaged_after_preparation_are_made_again(smoke_database, tmp_path, monkeypatch, name, damage):
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path))
    task.prepare("smoke")
    root = database.scale_dir(database.get_scale("smoke"))
    damage(root / name)
    abandoned = root.with_name(f".{root.name}.partial-999999999")  # a killed preparation's (no such pid)
    abandoned.mkdir()
    assert task.prepare("smoke") == smoke_database
    assert not abandoned.exists()
    assert database.verify(database.load("smoke")).fingerprint == smoke_database


def test_a_database_changed_after_preparation_is_not_measured(smoke_database, tmp_path, monkeypatch):
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path))
    task.prepare("smoke")
    path = database.load("smoke").database
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(DataCorrupt, match="changed after its preparation"):
        run(task.STARTER.read_text(), tmp_path)
    assert task.prepare("smoke") == smoke_database  # and preparing again mends it


def test_nothing_prepared_says_which_command_prepares_it(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path))
    with pytest.raises(DataMissing, match="autoresearch prepare --task query-latency --profile smoke"):
        task.fingerprint("smoke")
    with pytest.raises(DataMissing):
        run(task.STARTER.read_text(), tmp_path)


def test_an_unknown_profile_is_refused_by_name():
    with pytest.raises(ValueError, match="no 'h100' profile"):
        task.prepare("h100")


# --- measuring -----------------------------------------------------------------------------------


def test_the_starter_passes_the_gate_and_its_metrics_are_well_formed(smoke_database, tmp_path):
    result = run(task.STARTER.read_text(), tmp_path)
    assert result.status == "ok", result.error
    metrics = result.metrics
    scale = database.get_scale("smoke")
    assert result.value == metrics["p95_ms"] > 0
    assert 0 < metrics["p50_ms"] <= metrics["p95_ms"] <= metrics["p99_ms"] <= metrics["max_ms"]
    assert metrics["executions"] == scale.parameter_sets * scale.measured_passes
    assert metrics["rows"] == sum(len(rows) for rows in database.load("smoke").reference_rows)
    assert metrics["indexes"] == 0 and metrics["index_build_s"] >= 0
    assert result.sandboxed == sandbox.available()[0]
    assert result.setup_s > 0 and result.evaluation_s > 0


def test_an_indexed_rewrite_passes_the_gate_and_reports_its_index_builds(smoke_database, tmp_path):
    result = run(GOOD, tmp_path, use_sandbox=False)
    assert result.status == "ok", result.error
    assert result.metrics["indexes"] == 3 and result.metrics["index_build_s"] > 0
    assert not result.sandboxed and "WITHOUT a sandbox" in result.log_tail


def test_the_reference_itself_passes_the_gate(smoke_database, tmp_path):
    assert run(REFERENCE, tmp_path).status == "ok"


def test_the_timed_passes_follow_the_seed_and_only_reorder_the_task_s_parameter_sets(smoke_database):
    prepared = database.load("smoke")
    first, again, other = (evaluator._plan(prepared, 3, seed) for seed in (1, 1, 2))
    assert first == again and first["passes"] != other["passes"]
    assert first["parameters"] == other["parameters"] == prepared.parameters
    assert all(sorted(order) == list(range(len(prepared.parameters))) for order in first["passes"])


def test_a_query_that_returns_other_rows_is_rejected_naming_the_parameter_set(smoke_database, tmp_path):
    shipped_too = REFERENCE.replace("o.status = 'delivered'", "o.status IN ('delivered', 'shipped')")
    prepared = database.load("smoke")
    con = sqlite3.connect(f"file:{prepared.database}?mode=ro", uri=True)
    first = next(
        number
        for number, (values, rows) in enumerate(zip(prepared.parameters, prepared.reference_rows, strict=True), 1)
        if [list(row) for row in con.execute(shipped_too, values)] != rows
    )
    con.close()
    result = run(shipped_too, tmp_path)
    assert result.status == "rejected"
    assert f"parameter set {first} of 4 ({json.dumps(prepared.parameters[first - 1])})" in result.error


def test_a_query_that_returns_fewer_rows_is_rejected(smoke_database, tmp_path):
    result = run(REFERENCE.replace("LIMIT 10", "LIMIT 3"), tmp_path)
    assert result.status == "rejected" and "returned 3 row(s) where the reference returns" in result.error


@BOTH_WAYS
def test_attaching_another_database_is_rejected(smoke_database, tmp_path, use_sandbox):
    result = run(f"ATTACH '{tmp_path / 'other.db'}' AS other;\n{REFERENCE}", tmp_path, use_sandbox=use_sandbox)
    assert result.status == "rejected" and result.error.startswith("query.sql attaches another database: ATTACH")
    assert not (tmp_path / "other.db").exists()


@BOTH_WAYS
def test_loading_an_extension_is_rejected(smoke_database, tmp_path, use_sandbox):
    query = REFERENCE.replace("p.name AS product", "load_extension('/tmp/evil.so') AS product")
    result = run(query, tmp_path, use_sandbox=use_sandbox)
    assert result.status == "rejected"
    assert result.error.startswith("query.sql loads an extension (load_extension): SELECT")


@BOTH_WAYS
@pytest.mark.parametrize(
    ("statement", "reason"),
    [
        ("INSERT INTO orders VALUES (0, 1, '2022-01-01', 'delivered');", "writes to the data tables"),
        ("UPDATE products SET price_cents = 0;", "writes to the data tables"),
        ("DROP TABLE order_items;", "changes the schema beyond creating indexes"),
        ("PRAGMA journal_mode = WAL;", "uses a PRAGMA"),
    ],
)
def test_a_statement_that_changes_the_database_is_rejected(smoke_database, tmp_path, use_sandbox, statement, reason):
    result = run(f"{statement}\n{REFERENCE}", tmp_path, use_sandbox=use_sandbox)
    assert result.status == "rejected" and reason in result.error


@BOTH_WAYS
def test_a_write_dressed_as_a_query_is_refused_by_the_authorizer(smoke_database, tmp_path, use_sandbox):
    sneaky = "WITH gone AS (SELECT 1) DELETE FROM order_items WHERE id IN (SELECT * FROM gone);"
    result = run(f"CREATE INDEX x ON orders (status);\n{sneaky}", tmp_path, use_sandbox=use_sandbox)
    assert result.status == "rejected"
    assert result.error.startswith("query.sql deletes from table order_items: WITH gone")


@BOTH_WAYS
def test_vacuum_into_a_file_outside_is_rejected_and_writes_nothing(smoke_database, tmp_path, use_sandbox):
    target = tmp_path / "copy.db"
    result = run(f"VACUUM INTO '{target}';\n{REFERENCE}", tmp_path, use_sandbox=use_sandbox)
    assert result.status == "rejected" and "vacuums the database" in result.error
    assert not target.exists()


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("CREATE INDEX x ON orders (status);", "holds no query"),
        ("", "holds no query"),
        (f"{REFERENCE}\n{REFERENCE}", "holds 2 queries (statements 1, 2)"),
        (f"{REFERENCE}\nCREATE INDEX x ON orders (status);", "query is statement 1 of 2"),
        ("SELEC p.id FROM products AS p;", "statement 1 is not a CREATE INDEX, ANALYZE or query statement: SELEC"),
        ("SELECT 1;\x00", "query.sql is not text"),
        ("SELECT '" + "x" * 40_000 + "';", "query.sql is larger than 32 KB"),
    ],
)
def test_an_asset_of_the_wrong_shape_is_rejected_before_anything_runs(smoke_database, tmp_path, text, reason):
    result = run(text, tmp_path)
    assert result.status == "rejected" and reason in result.error
    assert not (tmp_path / "run").exists()  # nothing copied, no process started


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("SELECT p.id FROM products AS p WHERE;", "syntax error"),
        ("SELECT p.colour FROM products AS p;", "no such column: p.colour"),
        ("CREATE INDEX x ON nowhere (id);\n" + REFERENCE, "no such table: main.nowhere"),
        (REFERENCE.replace(":region", ":area"), ":area"),
    ],
)
def test_what_sqlite_cannot_run_is_a_crash_with_its_error(smoke_database, tmp_path, text, error):
    result = run(text, tmp_path, use_sandbox=False)
    assert result.status == "crash" and error in result.error


def test_an_endless_query_is_stopped_at_its_time_box(smoke_database, tmp_path):
    endless = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT COUNT(*) FROM n;"
    result = run(endless, tmp_path, time_box_s=1.0)
    assert result.status == "timeout" and "time box of 1 s" in result.error


# --- the authorizer, alone -------------------------------------------------------------------------


@pytest.fixture()
def guarded(tmp_path):
    path = tmp_path / "db.sqlite"
    con = sqlite3.connect(path)
    con.executescript("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT); INSERT INTO t (v) VALUES ('a'), ('b');")
    con.close()
    con, watch = guard.connect(path)
    yield con, watch
    con.close()


@pytest.mark.parametrize(
    ("statement", "reason"),
    [
        ("ATTACH 'elsewhere.db' AS other", "attaches another database (elsewhere.db)"),
        ("VACUUM INTO 'elsewhere.db'", "attaches another database (elsewhere.db)"),
        ("VACUUM", "vacuums the database"),
        ("PRAGMA writable_schema = ON", "uses PRAGMA writable_schema"),
        ("SELECT load_extension('evil')", "loads an extension"),
        ("INSERT INTO t (v) VALUES ('c')", "writes to table t"),
        ("DELETE FROM t", "deletes from table t"),
        ("DROP TABLE t", "changes the database's schema (it would write to sqlite_master)"),
        ("CREATE VIEW u AS SELECT 1", "changes the database's schema (it would write to sqlite_master)"),
        ("CREATE TEMP TABLE u (x)", "changes the database's schema (it would write to sqlite_temp_master)"),
        ("CREATE INDEX i ON t (v)", "changes the database's schema (it would write to sqlite_master)"),
        ("BEGIN", "manages transactions"),
    ],
)
def test_the_guard_refuses_in_the_query_phase(guarded, tmp_path, monkeypatch, statement, reason):
    con, watch = guarded
    monkeypatch.chdir(tmp_path)
    with pytest.raises(sqlite3.DatabaseError):
        con.execute(statement)
    assert watch.refused.startswith(f"query.sql {reason}")
    assert not (tmp_path / "elsewhere.db").exists()


def test_the_guard_allows_index_builds_and_statistics_in_their_phases_only(guarded):
    con, watch = guarded
    watch.start("index")
    con.execute("CREATE INDEX by_value ON t (v) WHERE v > 'a'")
    with pytest.raises(sqlite3.DatabaseError):
        con.execute("INSERT INTO t (v) VALUES ('c')")
    watch.start("analyze")
    con.execute("ANALYZE")
    watch.start("query")
    assert con.execute("SELECT COUNT(*) FROM t INDEXED BY by_value WHERE v > 'a'").fetchone() == (1,)
    assert con.execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 5) SELECT SUM(i) FROM n"
    ).fetchone() == (15,)
    assert con.execute("SELECT DISTINCT v FROM t ORDER BY v DESC").fetchall() == [("b",), ("a",)]
    assert watch.refused == ""


# --- the asset's shape and the rows' comparison ----------------------------------------------------


def test_statements_are_split_where_sqlite_says_they_end():
    text = "-- a; comment\nCREATE INDEX a ON t (v); /* b; */ SELECT ';' AS x, \"semi;colon\" FROM t WHERE v = :v"
    statements = asset.split(text)
    assert [asset.kind(s) for s in statements] == ["CREATE INDEX", "SELECT"]
    assert statements[1].endswith("WHERE v = :v")
    assert asset.parse(text).indexes == 1


def test_rows_are_compared_in_order_with_real_numbers_to_a_relative_1e_9():
    reference = [[1, "a", 2.0], [2, "b", 3]]
    assert measure.differs([(1, "a", 2.0 + 1e-12), (2, "b", 3)], reference) == ""
    assert "row 1 is [2" in measure.differs([(2, "b", 3), (1, "a", 2.0)], reference)
    assert "row 2" in measure.differs([(1, "a", 2.0), (2, "b", "3")], reference)
    assert "at least 3 row(s)" in measure.differs([(1, "a", 2.0), (2, "b", 3), (3, "c", 4)], reference)


def test_the_measuring_process_is_not_run_as_a_module_already_imported(smoke_database, tmp_path):
    """runpy warns about `-m` on a module this package imports: the evaluator runs main() by import."""
    result = run(REFERENCE, tmp_path, use_sandbox=False)
    assert result.status == "ok" and "RuntimeWarning" not in result.log_tail
    assert os.path.isfile(tmp_path / "run" / measure.DB_FILE)


def test_a_measuring_process_that_ends_without_an_answer_is_a_crash(smoke_database, tmp_path, monkeypatch):
    monkeypatch.setattr(evaluator, "MEASURE", "import sys; print('segfault, say', file=sys.stderr); sys.exit(139)")
    result = run(REFERENCE, tmp_path, use_sandbox=False)
    assert result.status == "crash" and "exit code 139" in result.error
    assert "segfault, say" in result.log_tail


def test_the_profiles_the_task_declares_are_the_scales_it_has() -> None:
    assert task.PROFILES == tuple(database.SCALES)
