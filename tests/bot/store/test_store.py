"""The store on a real SQLite file: ids, transitions, transactions, the inbox, set-aside runs, the
upgrade of a file written by the previous release, resume, and the crash failpoint."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from bot.core.states import SET_ASIDE, TRANSITIONS, RunState, State
from bot.store import InvalidTransition, Store, schema

MAIN = "0123456789abcdef0123456789abcdef01234567"
FIXTURES = Path(__file__).parent / "fixtures"
RENAMED = {"experiments": {"train_py": "asset"}}  # old column -> its name now, per table

# the states an experiment passes through to reach each state, in allowed moves
PATH: dict[State, list[State]] = {
    State.PROPOSING: [],
    State.PROPOSED: [],  # fill_proposal
    State.BRANCHED: [State.BRANCHED],
    State.MEASURING: [State.BRANCHED, State.MEASURING],
    State.REBASING: [State.BRANCHED, State.MEASURING, State.REBASING],
    State.MERGING: [State.BRANCHED, State.MEASURING, State.MERGING],
    State.CLOSING: [State.BRANCHED, State.MEASURING, State.CLOSING],
    State.DONE: [State.BRANCHED, State.MEASURING, State.CLOSING, State.DONE],
}


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "autoresearch.db"  # the parent does not exist yet: Store creates it


@pytest.fixture
def store(db_path: Path):
    s = Store(db_path)
    yield s
    s.close()


def new_experiment(store: Store, n: int = 1, *, base_sha: str = MAIN, **overrides):
    """An experiment with a proposal: start_proposing, then fill_proposal."""
    kwargs = dict(
        title=f"Experiment {n}",
        hypothesis=f"hypothesis {n}",
        slug=f"exp-{n}",
        code_hash=f"code-{n}",
        asset=f"print({n})\n",
        meta={"changes": [{"name": "LR", "old": 0.04, "new": 0.05}]},
    )
    kwargs.update(overrides)
    exp = store.experiments.start_proposing(base_sha)
    return store.experiments.fill_proposal(exp.id, **kwargs)


def experiment_in(store: Store, state: State, n: int = 1):
    """An experiment moved to `state` along allowed transitions."""
    if state is State.PROPOSING:
        return store.experiments.start_proposing(MAIN)
    exp = new_experiment(store, n)
    for step in PATH[state]:
        exp = store.experiments.update(exp.id, state=step, **({"status": "discard"} if step is State.DONE else {}))
    assert exp.state == state
    return exp


def new_run(
    store: Store,
    experiment_id: int | None = None,
    purpose: str = "candidate",
    code_hash: str = "code-1",
    profile: str = "cpu",
    **kwargs,
):
    return store.runs.add(
        experiment_id=experiment_id,
        purpose=purpose,
        code_hash=code_hash,
        commit_sha="c" * 40,
        base_sha=MAIN,
        asset="print(1)\n",
        profile=profile,
        **kwargs,
    )


def add_failing_trigger(store: Store, table: str, when: str) -> None:
    """Make an INSERT into `table` fail inside SQLite (a real constraint failure, not a mock)."""
    store.db.execute(
        f"CREATE TRIGGER fail_{table} BEFORE INSERT ON {table} WHEN {when} "
        "BEGIN SELECT RAISE(ABORT, 'injected failure'); END"
    )


def count(store: Store, table: str) -> int:
    return store.db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]


# --- the file ------------------------------------------------------------------------------------


def test_wal_mode_is_on(store: Store, db_path: Path):
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db_path.exists()
    # a fresh connection to the file sees WAL too: the mode is persistent in the file
    other = sqlite3.connect(db_path)
    try:
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        other.close()


def test_a_new_file_gets_the_current_schema(store: Store):
    tables = {r[0] for r in store.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"experiments", "runs", "events", "feedback", "settings", "inbox"} <= tables
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == schema.VERSION
    assert store.upgraded_from == 0  # a new, empty file starts at version 0 and runs the whole chain


def test_a_file_in_place_of_the_work_directory_is_refused(tmp_path: Path):
    blocker = tmp_path / "work"
    blocker.write_text("not a directory\n")
    with pytest.raises(NotADirectoryError, match=r"is a file, not a work directory.*--workdir"):
        Store(blocker / "state.db")
    assert blocker.read_text() == "not a directory\n"


# --- the loop's state (the settings table) --------------------------------------------------------


def test_the_loop_state_has_its_defaults_before_anything_is_written(store: Store):
    state = store.state
    assert (state.paused, state.identity, state.spent_usd, state.program_settings) == (False, {}, 0.0, None)
    assert (state.driver_last_run, state.bot_login, state.research_log) == ({}, None, {})
    assert (state.poller_horizon, state.poller_comments_since, state.poller_pulls) == (None, None, {})
    assert count(store, "settings") == 0


def test_the_loop_state_round_trips_and_the_latest_write_wins(store: Store):
    state = store.state
    state.paused = True
    state.paused = False
    state.spent_usd += 0.25
    state.spent_usd += 1.0
    state.identity = {"profile": "cpu", "harness_hash": "h"}
    state.poller_pulls = {"7": {"state": "open", "branch": "autoresearch/1-x", "sha": MAIN}}
    assert (state.paused, state.spent_usd, state.identity) == (False, 1.25, {"profile": "cpu", "harness_hash": "h"})
    assert state.poller_pulls == {"7": {"state": "open", "branch": "autoresearch/1-x", "sha": MAIN}}


# (key, property, the text every release wrote, the value read): an older state.db must read the same
AS_WRITTEN = [
    ("paused", "paused", "1", True),
    ("identity", "identity", '{"profile": "cpu"}', {"profile": "cpu"}),
    ("agent.spent_usd", "spent_usd", "0.5", 0.5),
    ("program.settings", "program_settings", '{"a": 1}', '{"a": 1}'),
    ("driver.last_run", "driver_last_run", '{"ticks": 3}', {"ticks": 3}),
    ("github.bot_login", "bot_login", "autoresearch[bot]", "autoresearch[bot]"),
    ("poller.horizon", "poller_horizon", "2024-01-01T00:00:00Z", "2024-01-01T00:00:00Z"),
    ("poller.comments_since", "poller_comments_since", "2024-01-02T00:00:00Z", "2024-01-02T00:00:00Z"),
    ("poller.pulls", "poller_pulls", '{"7": {"state": "open"}}', {"7": {"state": "open"}}),
    ("github.research_log", "research_log", '{"number": 9}', {"number": 9}),
]


def test_the_loop_state_reads_and_writes_the_settings_as_every_release_wrote_them(store: Store):
    store.db.executemany("INSERT INTO settings(key, value) VALUES (?, ?)", [(k, text) for k, _, text, _ in AS_WRITTEN])
    assert [getattr(store.state, name) for _, name, _, _ in AS_WRITTEN] == [value for *_, value in AS_WRITTEN]
    store.db.execute("DELETE FROM settings")
    for _, name, _, value in AS_WRITTEN:
        setattr(store.state, name, value)
    assert sorted(tuple(r) for r in store.db.execute("SELECT key, value FROM settings")) == sorted(
        (k, text) for k, _, text, _ in AS_WRITTEN
    )
    store.state.paused = False
    assert store.db.execute("SELECT value FROM settings WHERE key = 'paused'").fetchone()[0] == "0"


def test_an_unreadable_research_log_record_reads_as_none(store: Store):
    for text in ("not json", "[1, 2]"):
        store.db.execute("INSERT OR REPLACE INTO settings(key, value) VALUES ('github.research_log', ?)", (text,))
        assert store.state.research_log == {}  # the log is found again on GitHub


# --- the upgrade of a file written by the previous release ---------------------------------------


def _rows(db: sqlite3.Connection, table: str) -> list[dict]:
    db.row_factory = sqlite3.Row
    return [dict(r) for r in db.execute(f"SELECT * FROM {table} ORDER BY rowid")]


@pytest.fixture
def v0_copy(tmp_path: Path) -> Path:
    """A copy of the fixture (never opened in place) inside a work directory."""
    path = tmp_path / "work" / "state.db"
    path.parent.mkdir()
    shutil.copyfile(FIXTURES / "state_v0.db", path)
    return path


@pytest.fixture
def v0_rows(tmp_path: Path) -> dict[str, list[dict]]:
    """Every row of the fixture as the previous release wrote it, read from a second copy."""
    path = tmp_path / "v0-readonly.db"
    shutil.copyfile(FIXTURES / "state_v0.db", path)
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 0
        return {t: _rows(db, t) for t in ("experiments", "runs", "events", "feedback", "settings")}
    finally:
        db.close()


def test_upgrading_a_v0_file_keeps_every_row(v0_copy: Path, v0_rows: dict[str, list[dict]]):
    fixture_hash = hashlib.sha256((FIXTURES / "state_v0.db").read_bytes()).hexdigest()
    store = Store(v0_copy)
    try:
        assert store.upgraded_from == 0
        assert store.db.execute("PRAGMA user_version").fetchone()[0] == schema.VERSION
        for table, old_rows in v0_rows.items():
            new_rows = _rows(store.db, table)
            assert len(new_rows) == len(old_rows), table
            # every old column keeps its value, row for row (under its new name, if it was renamed)
            renamed = RENAMED.get(table, {})
            kept = [{k: r[renamed.get(k, k)] for k in old} for old, r in zip(old_rows, new_rows, strict=True)]
            assert kept == old_rows, table

        exps = store.experiments.all()
        assert [(e.id, e.state, e.status) for e in exps] == [(1, "done", "discard"), (2, "measuring", None)]
        assert exps[0].title == "Raise MATRIX_LR" and exps[0].branch == "autoresearch/1-raise-matrix-lr"
        assert exps[0].meta == {"changes": [{"name": "MATRIX_LR", "old": 0.04, "new": 0.06}]}
        assert exps[0].val_bpb == 2.3 and exps[0].delta == 0.045 and exps[0].reason == "worse"
        assert [e.asset for e in exps] == [r["train_py"] for r in v0_rows["experiments"]]
        assert exps[1].head_sha == "c" * 40
        # the new columns have their defaults
        assert all(
            e.failures == 0 and e.retry_at is None and e.margin is None and e.remeasured_delta is None for e in exps
        )

        runs = store.runs.all()
        assert [(r.id, r.experiment_id, r.purpose, r.state, r.status) for r in runs] == [
            (1, None, "baseline", "done", "ok"),
            (2, None, "baseline", "done", "ok"),
            (3, 1, "candidate", "done", "ok"),
            (4, 2, "candidate", "running", None),
        ]
        assert [r.val_bpb for r in runs] == [2.25, 2.26, 2.3, None]
        assert runs[0].metrics["num_steps"] == 60 and runs[0].harness_hash == "0123456789abcdef"
        assert all(r.rerun_of is None and r.note is None for r in runs)

        assert len(store.events.all()) == 10
        assert [e["kind"] for e in store.events.all(1)] == ["proposed", "branched", "queued", "closing", "done"]
        assert store.feedback.recent() == ["try a lower matrix_lr"]
        assert store.inbox.all() == []
        assert store.experiments.count() == 2 and store.experiments.counts_by_status() == {"discard": 1}
        assert store.runs.measured_values(
            profile="cpu", harness_hash="0123456789abcdef", data_fingerprint="fedcba9876543210"
        ) == [("c0", None, "baseline", 2.25), ("c0", None, "baseline", 2.26), ("c1", 1, "candidate", 2.3)]
    finally:
        store.close()
    assert hashlib.sha256((FIXTURES / "state_v0.db").read_bytes()).hexdigest() == fixture_hash


def test_an_upgraded_v0_file_has_the_schema_of_a_new_file(v0_copy: Path, tmp_path: Path):
    def shape(path: Path):
        db = sqlite3.connect(path)
        try:
            tables = sorted(r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
            indexes = sorted(
                r[0]
                for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND name NOT LIKE 'sqlite_%'")
            )
            columns = {t: [tuple(c)[1:] for c in db.execute(f"PRAGMA table_info({t})")] for t in tables}
            return tables, indexes, columns
        finally:
            db.close()

    Store(v0_copy).close()
    Store(tmp_path / "new" / "state.db").close()
    assert shape(v0_copy) == shape(tmp_path / "new" / "state.db")


def test_the_store_works_after_the_upgrade(v0_copy: Path):
    store = Store(v0_copy)
    try:
        exp = store.experiments.start_proposing("a" * 40)
        assert exp.id == 3
        exp = store.experiments.fill_proposal(
            exp.id, title="Wider MLP", hypothesis="h", slug="wider-mlp", code_hash="c3", asset="print(3)\n", meta={}
        )
        assert exp.branch == "autoresearch/3-wider-mlp"
        assert new_run(store, exp.id, code_hash="c3").id == 5
        # the run that was in flight when the old release stopped can be set aside and re-run
        rerun = store.runs.set_aside(4, RunState.LOST, "the runner restarted")
        assert (rerun.id, rerun.rerun_of, rerun.experiment_id, rerun.code_hash) == (6, 4, 2, "c2")
        assert store.inbox.add(key="k1", kind="steer", payload={"text": "hi"}, author="bob")
        assert [e.id for e in store.inbox.pending()] == [1]
        # the old experiment moves on along the transitions
        assert store.experiments.update(2, state=State.CLOSING).state == "closing"
    finally:
        store.close()


def test_an_upgraded_file_is_not_migrated_again(v0_copy: Path):
    Store(v0_copy).close()
    again = Store(v0_copy)
    try:
        assert again.upgraded_from == schema.VERSION
        assert again.db.execute("PRAGMA user_version").fetchone()[0] == schema.VERSION
        assert [e.id for e in again.experiments.all()] == [1, 2]
        assert count(again, "runs") == 4
    finally:
        again.close()


def test_a_file_from_a_newer_release_is_refused(db_path: Path):
    Store(db_path).close()
    db = sqlite3.connect(db_path)
    db.execute(f"PRAGMA user_version = {schema.VERSION + 1}")
    db.close()
    with pytest.raises(schema.SchemaTooNew, match="upgrade autoresearch-bot"):
        Store(db_path)
    db = sqlite3.connect(db_path)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == schema.VERSION + 1  # left as it was
    finally:
        db.close()


def test_an_upgrade_that_fails_half_way_leaves_the_file_at_its_old_version(v0_copy: Path, monkeypatch):
    # the second migration rebuilds the experiments table, then fails on its last statement
    broken = schema.V2 + "\nINSERT INTO no_such_table VALUES (1);\n"
    monkeypatch.setattr(schema, "MIGRATIONS", [schema.V1, broken])
    with pytest.raises(sqlite3.OperationalError, match="no_such_table"):
        Store(v0_copy)
    db = sqlite3.connect(v0_copy)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 1  # V1 committed, V2 did not
        columns = [c[1] for c in db.execute("PRAGMA table_info(experiments)")]
        assert "failures" not in columns
        assert db.execute("SELECT name FROM sqlite_master WHERE name IN ('inbox', 'experiments_v2')").fetchall() == []
        assert db.execute("SELECT COUNT(*) FROM experiments").fetchone()[0] == 2
    finally:
        db.close()
    monkeypatch.undo()
    store = Store(v0_copy)  # the release with a working migration finishes the upgrade
    try:
        assert store.upgraded_from == 1
        assert [(e.id, e.state) for e in store.experiments.all()] == [(1, "done"), (2, "measuring")]
    finally:
        store.close()


def test_a_version_3_file_reads_each_experiments_train_py_as_its_asset(db_path: Path, monkeypatch):
    # a state.db as the previous release (schema 3, the column still named train_py) left it
    db_path.parent.mkdir()
    db = sqlite3.connect(db_path, isolation_level=None)
    try:
        monkeypatch.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:3])
        monkeypatch.setattr(schema, "VERSION", 3)
        schema.migrate(db)
        monkeypatch.undo()
        db.execute(
            "INSERT INTO experiments(id, state, title, hypothesis, branch, code_hash, train_py, base_sha,"
            " created_at, updated_at) VALUES (4, 'measuring', 'Wider MLP', 'h', 'autoresearch/4-wider-mlp', 'c4',"
            " 'print(4)\n', ?, 1, 2)",
            (MAIN,),
        )
        db.execute(
            "INSERT INTO experiments(state, base_sha, created_at, updated_at) VALUES ('proposing', ?, 3, 3)", (MAIN,)
        )
    finally:
        db.close()
    store = Store(db_path)
    try:
        assert store.upgraded_from == 3
        assert store.experiments.get(4).asset == "print(4)\n"
        assert store.experiments.get(5).asset is None
        assert [(e.id, e.title, e.code_hash) for e in store.experiments.all()] == [(4, "Wider MLP", "c4")]
        assert store.experiments.update(4, asset="print(5)\n").asset == "print(5)\n"  # written where it is read
    finally:
        store.close()


# --- transactions --------------------------------------------------------------------------------


def test_a_nested_transaction_commits_only_with_the_outermost(store: Store, db_path: Path):
    other = sqlite3.connect(db_path)
    try:
        with store.transaction():
            with store.transaction():
                store.feedback.add("alice", "inner")
            assert store.db.in_transaction  # the inner block did not commit
            assert other.execute("SELECT COUNT(*) FROM feedback").fetchone()[0] == 0
            exp = store.experiments.start_proposing(MAIN)  # a method with its own transaction joins this one
            assert store.db.in_transaction
        assert not store.db.in_transaction
        assert other.execute("SELECT COUNT(*) FROM feedback").fetchone()[0] == 1
        assert other.execute("SELECT state FROM experiments WHERE id = ?", (exp.id,)).fetchone() == ("proposing",)
    finally:
        other.close()


def test_an_exception_in_a_nested_transaction_rolls_back_everything(store: Store):
    with pytest.raises(RuntimeError, match="inner"):
        with store.transaction():
            store.experiments.start_proposing(MAIN)
            with store.transaction():
                store.feedback.add("alice", "lost")
                raise RuntimeError("inner")
    assert not store.db.in_transaction
    assert count(store, "experiments") == 0 and store.feedback.recent() == [] and store.events.all() == []
    # the store still works, and a new transaction commits
    with store.transaction():
        store.feedback.add("alice", "kept")
    assert store.feedback.recent() == ["kept"]


def test_an_exception_after_a_nested_transaction_rolls_it_back(store: Store):
    exp = new_experiment(store)
    with pytest.raises(InvalidTransition):
        with store.transaction():
            store.experiments.update(exp.id, state=State.BRANCHED, head_sha="d" * 40, event="pushed")
            store.feedback.add("alice", "lost")
            store.experiments.update(exp.id, state=State.MERGING)  # forbidden: branched -> merging
    assert not store.db.in_transaction
    assert store.experiments.get(exp.id) == exp
    assert store.feedback.recent() == []
    assert [e["kind"] for e in store.events.all(exp.id)] == ["proposing", "proposed"]


def test_a_savepoint_undoes_only_its_own_writes_and_the_transaction_goes_on(store: Store, db_path: Path):
    with store.transaction():
        store.feedback.add("alice", "before")
        with pytest.raises(RuntimeError, match="one entry"):
            with store.savepoint():
                store.feedback.add("alice", "undone")
                store.experiments.start_proposing(MAIN)
                raise RuntimeError("one entry failed")
        with store.savepoint():
            store.feedback.add("alice", "after")
        assert store.db.in_transaction
    assert store.feedback.recent() == ["before", "after"]
    assert count(store, "experiments") == 0 and store.events.all() == []


def test_nested_savepoints_undo_the_inner_one_alone(store: Store):
    with store.transaction():
        with store.savepoint():
            store.feedback.add("alice", "outer")
            with pytest.raises(ValueError):
                with store.savepoint():
                    store.feedback.add("alice", "inner")
                    raise ValueError
    assert store.feedback.recent() == ["outer"]


def test_a_savepoint_belongs_inside_a_transaction(store: Store):
    with pytest.raises(RuntimeError, match="inside store.transaction"):
        with store.savepoint():
            pass
    assert not store.db.in_transaction


# --- experiments ---------------------------------------------------------------------------------


def test_start_proposing_creates_an_experiment_without_a_proposal(store: Store):
    exp = store.experiments.start_proposing(MAIN)
    assert exp.id == 1 and exp.state == "proposing" and exp.base_sha == MAIN
    assert (exp.status, exp.title, exp.hypothesis) == (None, "", "")
    assert (exp.branch, exp.code_hash, exp.asset, exp.head_sha) == (None, None, None, None)
    assert exp.meta == {} and exp.failures == 0 and exp.retry_at is None
    assert exp.created_at == exp.updated_at > 0
    assert [(e["kind"], e["message"]) for e in store.events.all(exp.id)] == [
        ("proposing", "asked the agent for a proposal on main 0123456")
    ]


def test_fill_proposal_records_the_proposal(store: Store):
    started = store.experiments.start_proposing(MAIN)
    exp = store.experiments.fill_proposal(
        started.id,
        title="Raise LR",
        hypothesis="faster",
        slug="raise-lr",
        code_hash="code-1",
        asset="print(1)\n",
        meta={"changes": [{"name": "LR", "new": 0.05}]},
    )
    assert exp.state == "proposed"
    assert exp.status is None
    assert exp.title == "Raise LR" and exp.hypothesis == "faster"
    assert exp.branch == "autoresearch/1-raise-lr"
    assert exp.meta == {"changes": [{"name": "LR", "new": 0.05}]}
    assert exp.base_sha == MAIN
    assert exp.code_hash == "code-1" and exp.asset == "print(1)\n"
    assert (exp.head_sha, exp.merged_sha, exp.val_bpb, exp.delta, exp.reason) == (None,) * 5
    assert exp.created_at == started.created_at <= exp.updated_at
    assert store.experiments.get(exp.id) == exp
    assert [(e["kind"], e["message"]) for e in store.events.all(exp.id)][1:] == [("proposed", "Raise LR")]


def test_ids_increase_and_branches_carry_them(store: Store):
    first = new_experiment(store, 1, slug="raise-lr")
    second = new_experiment(store, 2, slug="deeper-model")
    third = new_experiment(store, 3, slug="raise-lr")  # the same slug again: the id keeps the branch unique
    assert [first.id, second.id, third.id] == [1, 2, 3]
    assert first.branch == "autoresearch/1-raise-lr"
    assert second.branch == "autoresearch/2-deeper-model"
    assert third.branch == "autoresearch/3-raise-lr"


def test_fill_proposal_resets_failures(store: Store):
    exp = store.experiments.start_proposing(MAIN)
    store.experiments.update(exp.id, failures=3, retry_at=123.0)
    filled = store.experiments.fill_proposal(
        exp.id, title="t", hypothesis="h", slug="s", code_hash="c", asset="p", meta={}
    )
    assert filled.failures == 0


def test_fill_proposal_twice_is_refused(store: Store):
    exp = new_experiment(store, 1)
    with pytest.raises(InvalidTransition, match="proposed -> proposed"):
        store.experiments.fill_proposal(
            exp.id, title="other", hypothesis="h", slug="other", code_hash="x", asset="p", meta={}
        )
    assert store.experiments.get(exp.id) == exp


def test_fill_proposal_of_a_missing_experiment_raises_key_error(store: Store):
    with pytest.raises(KeyError):
        store.experiments.fill_proposal(9, title="t", hypothesis="h", slug="s", code_hash="c", asset="p", meta={})
    assert count(store, "experiments") == 0 and store.events.all() == []


def test_withdraw_proposing_deletes_the_row_and_its_id_is_never_reused(store: Store, db_path: Path):
    first = store.experiments.start_proposing(MAIN)
    store.experiments.withdraw_proposing(first.id, "the agent gave up")
    with pytest.raises(KeyError):
        store.experiments.get(first.id)
    assert store.experiments.count() == 0
    event = store.events.all()[-1]
    assert (event["experiment_id"], event["kind"], event["message"]) == (
        None,
        "agent",
        "no experiment 1: the agent gave up",
    )
    second = store.experiments.start_proposing(MAIN)
    assert second.id == 2
    store.experiments.withdraw_proposing(second.id, "again")  # the newest row is gone too
    store.close()
    reopened = Store(db_path)
    try:
        assert reopened.experiments.start_proposing(MAIN).id == 3
    finally:
        reopened.close()


def test_withdraw_proposing_leaves_an_experiment_with_a_proposal_alone(store: Store):
    exp = new_experiment(store)
    store.experiments.withdraw_proposing(exp.id, "too late")
    assert store.experiments.get(exp.id) == exp


def test_missing_experiment_raises_key_error(store: Store):
    with pytest.raises(KeyError):
        store.experiments.get(42)
    with pytest.raises(KeyError):
        store.experiments.update(42, reason="x")
    with pytest.raises(KeyError):
        store.experiments.update(42, state=State.DONE, event="x")
    assert store.events.all() == [] and not store.db.in_transaction


def test_update_experiment_writes_fields_and_event(store: Store):
    exp = new_experiment(store)
    updated = store.experiments.update(
        exp.id, state="branched", head_sha="d" * 40, meta={"k": [1, 2]}, event="branch pushed"
    )
    assert updated.state == "branched"
    assert updated.head_sha == "d" * 40
    assert updated.meta == {"k": [1, 2]}
    assert updated.updated_at >= exp.updated_at
    assert updated.created_at == exp.created_at
    assert [(e["kind"], e["message"]) for e in store.events.all(exp.id)][1:] == [
        ("proposed", exp.title),
        ("branched", "branch pushed"),
    ]


def test_update_experiment_event_kind_without_state_and_no_event(store: Store):
    exp = new_experiment(store)
    store.experiments.update(exp.id, reason="noted", event="a note")
    store.experiments.update(exp.id, val_bpb=0.97, delta=-0.01, margin=0.02, remeasured_delta=-0.008)  # no event
    assert [e["kind"] for e in store.events.all(exp.id)] == ["proposing", "proposed", "update"]
    after = store.experiments.get(exp.id)
    assert after.reason == "noted" and after.state == "proposed"
    assert (after.val_bpb, after.delta, after.margin, after.remeasured_delta) == (0.97, -0.01, 0.02, -0.008)


def test_update_experiment_is_atomic(store: Store):
    exp = new_experiment(store)
    add_failing_trigger(store, "events", "NEW.message = 'boom'")
    with pytest.raises(sqlite3.IntegrityError, match="injected failure"):
        store.experiments.update(exp.id, state="branched", head_sha="d" * 40, event="boom")
    # the event failed after the UPDATE ran: the UPDATE is rolled back with it
    after = store.experiments.get(exp.id)
    assert after.state == "proposed" and after.head_sha is None
    assert [e["kind"] for e in store.events.all(exp.id)] == ["proposing", "proposed"]
    assert not store.db.in_transaction
    # and the store still works
    assert store.experiments.update(exp.id, state="branched", event="ok").state == "branched"


def test_update_experiment_with_unknown_column_writes_nothing(store: Store):
    exp = new_experiment(store)
    with pytest.raises(sqlite3.OperationalError):
        store.experiments.update(exp.id, state="branched", no_such_column=1, event="x")
    assert store.experiments.get(exp.id) == exp
    assert len(store.events.all(exp.id)) == 2
    assert not store.db.in_transaction


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (State.PROPOSED, State.MERGING),
        (State.PROPOSING, State.BRANCHED),
        (State.PROPOSED, State.MEASURING),
        (State.BRANCHED, State.REBASING),
        (State.CLOSING, State.MEASURING),
        (State.DONE, State.MEASURING),
        (State.DONE, State.DONE),
    ],
    ids=lambda s: str(s),
)
def test_a_forbidden_transition_raises_and_leaves_the_row_unchanged(store: Store, old: State, new: State):
    exp = experiment_in(store, old)
    events = store.events.all()
    with pytest.raises(InvalidTransition, match=f"experiment {exp.id}: {old} -> {new} is not allowed"):
        store.experiments.update(exp.id, state=new, status="keep", head_sha="e" * 40, event="moved")
    assert store.experiments.get(exp.id) == exp
    assert store.events.all() == events
    assert not store.db.in_transaction


@pytest.mark.parametrize("old", list(State), ids=str)
def test_every_move_is_allowed_exactly_when_transitions_lists_it(store: Store, old: State):
    for n, new in enumerate(State, start=1):
        exp = experiment_in(store, old, n)
        if new in TRANSITIONS[old]:
            assert store.experiments.update(exp.id, state=new).state == new
        else:
            with pytest.raises(InvalidTransition):
                store.experiments.update(exp.id, state=new)
            assert store.experiments.get(exp.id) == exp


def test_any_active_state_may_end_as_failed(store: Store):
    for n, state in enumerate(s for s in State if s is not State.DONE):
        exp = experiment_in(store, state, n)
        failed = store.experiments.update(exp.id, state=State.DONE, status="failed", reason="step failed")
        assert (failed.state, failed.status) == ("done", "failed")


def test_a_state_change_does_not_reset_failures(store: Store):
    exp = experiment_in(store, State.BRANCHED)
    store.experiments.update(exp.id, failures=2, retry_at=50.0)
    moved = store.experiments.update(exp.id, state=State.MEASURING)
    assert (moved.failures, moved.retry_at) == (2, 50.0)  # the caller resets them when it wants to


def test_experiments_filters(store: Store):
    a = new_experiment(store, 1)
    b = new_experiment(store, 2)
    c = new_experiment(store, 3)
    d = store.experiments.start_proposing(MAIN)
    for state in PATH[State.DONE]:
        store.experiments.update(a.id, state=state, status="keep" if state is State.DONE else None)
    store.experiments.update(b.id, state="branched")
    store.experiments.update(b.id, state="measuring")
    assert [e.id for e in store.experiments.all()] == [a.id, b.id, c.id]  # no proposing rows
    assert [e.id for e in store.experiments.active()] == [b.id, c.id, d.id]
    assert [e.id for e in store.experiments.finished()] == [a.id]
    assert [e.id for e in store.experiments.in_state("proposing")] == [d.id]
    assert [e.id for e in store.experiments.in_state(State.MEASURING)] == [b.id]
    assert store.experiments.in_state("rebasing") == []


def test_count_experiments_and_counts_by_status(store: Store):
    assert store.experiments.count() == 0 and store.experiments.counts_by_status() == {}
    for n, status in enumerate(["keep", "discard", "discard", "crash", "failed"], start=1):
        exp = experiment_in(store, State.MEASURING, n)
        store.experiments.update(exp.id, state=State.DONE, status=status)
    experiment_in(store, State.MEASURING, 9)
    store.experiments.start_proposing(MAIN)
    assert store.experiments.count() == 7  # every row, the proposing one included
    assert store.experiments.counts_by_status() == {"keep": 1, "discard": 2, "crash": 1, "failed": 1}  # finished ones


def test_experiment_by_code(store: Store):
    store.experiments.start_proposing(MAIN)  # no code yet
    new_experiment(store, 2, code_hash="same")
    new_experiment(store, 3, code_hash="same")
    assert store.experiments.by_code("same").id == 2
    assert store.experiments.by_code("other") is None


# --- runs ----------------------------------------------------------------------------------------


def test_add_run_queues_under_a_seed_its_code_has_not_run_under(store: Store):
    exp = new_experiment(store)
    runs = [new_run(store, exp.id), new_run(store, exp.id, purpose="confirm"), new_run(store, None, "baseline")]
    assert [r.id for r in runs] == [1, 2, 3]
    assert [r.seed for r in runs] == [1, 2, 3]  # main's run of the same code takes neither of its seeds
    assert new_run(store, None, "baseline", code_hash="other").seed == 1
    assert all(r.state == "queued" and r.status is None and r.metrics == {} for r in runs)
    assert all(r.rerun_of is None and r.note is None for r in runs)
    assert runs[2].experiment_id is None and runs[2].purpose == "baseline"
    messages = [e["message"] for e in store.events.all()]
    assert "run 1 (candidate) queued" in messages
    assert "run 3 (baseline) queued" in messages


def test_add_run_reason_goes_into_the_event(store: Store):
    new_run(store, None, "baseline", reason="replaces lost run 7")
    assert store.events.all()[-1]["message"] == "run 1 (baseline) queued: replaces lost run 7"


def test_add_run_with_experiment_fields_updates_both(store: Store):
    exp = experiment_in(store, State.BRANCHED)
    run = new_run(store, exp.id, experiment_fields={"state": "measuring", "head_sha": "e" * 40})
    after = store.experiments.get(exp.id)
    assert after.state == "measuring" and after.head_sha == "e" * 40
    assert after.updated_at >= exp.updated_at
    assert store.runs.all(experiment_id=exp.id) == [run]


def test_add_run_with_a_bad_experiment_field_writes_neither(store: Store):
    exp = experiment_in(store, State.BRANCHED)
    events_before = count(store, "events")
    # the INSERT of the run succeeds, then the experiment UPDATE fails: both must be rolled back
    with pytest.raises(sqlite3.OperationalError, match="no_such_column"):
        new_run(store, exp.id, experiment_fields={"state": "measuring", "no_such_column": 1})
    assert count(store, "runs") == 0
    assert store.runs.all() == []
    assert store.experiments.get(exp.id) == exp
    assert count(store, "events") == events_before
    assert not store.db.in_transaction
    # the id is not burnt: the next run is run 1
    assert new_run(store, exp.id).id == 1


def test_add_run_with_a_forbidden_state_change_writes_neither(store: Store):
    exp = new_experiment(store)
    with pytest.raises(InvalidTransition, match="proposed -> measuring"):
        new_run(store, exp.id, experiment_fields={"state": "measuring"})
    assert store.runs.all() == []
    assert store.experiments.get(exp.id) == exp
    assert not store.db.in_transaction


def test_add_run_failing_at_its_event_writes_neither(store: Store):
    exp = experiment_in(store, State.BRANCHED)
    add_failing_trigger(store, "events", "NEW.kind = 'queued'")
    with pytest.raises(sqlite3.IntegrityError, match="injected failure"):
        new_run(store, exp.id, experiment_fields={"state": "measuring"})
    assert store.runs.all() == []
    assert store.experiments.get(exp.id).state == "branched"


def test_mark_run_started(store: Store):
    run = new_run(store)
    store.runs.mark_started(run.id, "/tmp/runs/1")
    started = store.runs.get(run.id)
    assert started.state == "running" and started.run_dir == "/tmp/runs/1" and started.started_at > 0
    assert store.runs.all(state="running") == [started]


def test_a_runs_recent_length_is_the_median_of_the_latest_finished_runs(store: Store):
    assert store.runs.recent_length_s() is None  # none finished yet
    for seconds in (300.0, 310.0, 5.0, 290.0):  # one crashed at once
        run = new_run(store, code_hash=f"code-{seconds}")
        store.runs.mark_started(run.id, "/tmp/runs/x")
        store.runs.finish(run.id, status="ok", val_bpb=1.0, metrics={}, error=None, log_tail="")
        store.db.execute(
            "UPDATE runs SET started_at = 1000.0, finished_at = ? WHERE id = ?", (1000.0 + seconds, run.id)
        )
    new_run(store, code_hash="queued")  # not finished: not counted
    assert store.runs.recent_length_s() == 300.0
    assert store.runs.recent_length_s(limit=2) == 290.0  # the latest two: 5 and 290


def test_how_long_a_proposal_takes_to_be_ready_is_from_its_opening_to_its_first_run(store: Store):
    assert store.runs.recent_ready_s() is None  # no experiment has a run yet
    for took in (10.0, 40.0, 20.0, 30.0):
        exp = store.experiments.start_proposing(MAIN)
        first = new_run(store, experiment_id=exp.id, code_hash=f"code-{took}")
        later = new_run(store, experiment_id=exp.id, code_hash=f"code-{took}", purpose="confirm")
        store.db.execute("UPDATE experiments SET created_at = 1000.0 WHERE id = ?", (exp.id,))
        store.db.execute("UPDATE runs SET queued_at = ? WHERE id = ?", (1000.0 + took, first.id))
        store.db.execute("UPDATE runs SET queued_at = 5000.0 WHERE id = ?", (later.id,))
    assert store.runs.recent_ready_s() == 40.0  # the upper quartile of 10, 20, 30 and 40
    assert store.runs.recent_ready_s(limit=2) == 30.0  # the latest two: 20 and 30
    # one still being proposed counts the time it has taken so far: a slower agent shows at once
    slow = store.experiments.start_proposing(MAIN)
    store.db.execute("UPDATE experiments SET created_at = ? WHERE id = ?", (time.time() - 600.0, slow.id))
    assert 599.0 < store.runs.recent_ready_s(limit=2) < 700.0  # 30 and 600 so far
    ended = store.experiments.start_proposing(MAIN)  # ended with no run (a branch that failed): not counted
    store.db.execute("UPDATE experiments SET state = 'done', status = 'failed' WHERE id = ?", (ended.id,))
    assert 599.0 < store.runs.recent_ready_s(limit=2) < 700.0


def test_finish_run_records_the_result(store: Store):
    run = new_run(store)
    metrics = {"peak_vram_mb": 2048.0, "harness_hash": "h1", "data_fingerprint": "d1", "steps": 10}
    done = store.runs.finish(run.id, status="ok", val_bpb=0.987, metrics=metrics, error=None, log_tail="tail")
    assert done.state == "done" and done.status == "ok" and done.val_bpb == 0.987
    assert done.metrics == metrics
    assert done.harness_hash == "h1" and done.data_fingerprint == "d1"
    assert done.log_tail == "tail" and done.error is None
    assert done.finished_at > 0


def test_a_finished_runs_event_shows_its_value_in_the_tasks_metric(store: Store):
    """The store holds the loss (accuracy negated); the event says the task's metric on its own scale,
    and training's reads as it always did."""
    from runner.tasks import TICKET_ROUTING

    trained, routed = new_run(store), new_run(store)
    store.runs.finish(trained.id, status="ok", val_bpb=0.987, metrics={"num_steps": 12}, error=None, log_tail="")
    store.runs.finish(
        routed.id, status="ok", val_bpb=-0.875, metrics={}, error=None, log_tail="", metric=TICKET_ROUTING.metric
    )
    said = [e["message"] for e in store.events.all() if e["kind"] == "run"]
    assert said == [
        f"run {trained.id} (candidate) val_bpb 0.987000 in 12 steps",
        f"run {routed.id} (candidate) accuracy 0.875000",
    ]


def test_finish_run_is_idempotent(store: Store):
    run = new_run(store)
    first = store.runs.finish(
        run.id, status="ok", val_bpb=0.987, metrics={"peak_vram_mb": 1.0}, error=None, log_tail="first"
    )
    second = store.runs.finish(
        run.id, status="crash", val_bpb=None, metrics={"peak_vram_mb": 9.0}, error="Traceback", log_tail="second"
    )
    assert second == first
    assert store.runs.get(run.id).status == "ok" and store.runs.get(run.id).val_bpb == 0.987


RESULT = {
    "status": "ok",
    "val_bpb": 0.991,
    "metrics": {"val_bpb": 0.991, "cpu_share": 0.4, "num_steps": 12},
    "log_tail": "step 12",
}


@pytest.mark.parametrize("state", SET_ASIDE, ids=str)
def test_set_aside_run_and_rerun_it(store: Store, state: RunState):
    exp = experiment_in(store, State.MEASURING)
    run = new_run(store, exp.id)
    store.runs.mark_started(run.id, "/tmp/runs/1")
    rerun = store.runs.set_aside(run.id, state, "why not", result=RESULT)
    old = store.runs.get(run.id)
    assert old.state == state.value and old.note == "why not" and old.finished_at > 0
    assert (old.status, old.val_bpb, old.metrics, old.log_tail) == ("ok", 0.991, RESULT["metrics"], "step 12")
    assert old.run_dir == "/tmp/runs/1" and old.seed == run.seed
    assert rerun == store.runs.get(rerun.id)
    assert rerun.id == run.id + 1 and rerun.seed == run.seed and rerun.rerun_of == run.id
    assert rerun.state == "queued" and rerun.status is None and rerun.metrics == {} and rerun.note is None
    assert (
        rerun.experiment_id,
        rerun.purpose,
        rerun.code_hash,
        rerun.commit_sha,
        rerun.base_sha,
        rerun.asset,
        rerun.profile,
    ) == (run.experiment_id, run.purpose, run.code_hash, run.commit_sha, run.base_sha, run.asset, run.profile)
    assert store.runs.all(state="running") == [] and store.runs.all(state="queued") == [rerun]
    event = store.events.all()[-1]
    assert (event["kind"], event["experiment_id"]) == (state.value, exp.id)
    assert event["message"] == f"run {run.id}: why not; queued again as run {rerun.id}"


@pytest.mark.parametrize("state", SET_ASIDE, ids=str)
def test_set_aside_run_without_a_rerun(store: Store, state: RunState):
    run = new_run(store, None, "baseline")
    assert store.runs.set_aside(run.id, state, "enough", rerun=False, result=RESULT) is None
    old = store.runs.get(run.id)
    assert old.state == state.value and old.note == "enough" and old.val_bpb == 0.991
    assert store.runs.all() == [old]
    event = store.events.all()[-1]
    assert (event["kind"], event["experiment_id"], event["message"]) == (state.value, None, f"run {run.id}: enough")


def test_set_aside_run_without_a_result_keeps_what_the_run_had(store: Store):
    run = new_run(store)
    store.runs.mark_started(run.id, "/tmp/runs/1")
    store.runs.set_aside(run.id, RunState.LOST, "its process was gone", rerun=False)
    lost = store.runs.get(run.id)
    assert (lost.state, lost.status, lost.val_bpb, lost.metrics, lost.log_tail) == ("lost", None, None, {}, None)
    store.runs.set_aside(run.id, RunState.CANCELLED, "moved on", rerun=False, result={"log_tail": "partial"})
    cancelled = store.runs.get(run.id)
    assert (cancelled.state, cancelled.status, cancelled.metrics, cancelled.log_tail) == (
        "cancelled",
        None,
        {},
        "partial",
    )


def test_a_set_aside_run_is_not_measured(store: Store):
    run = new_run(store)
    store.runs.set_aside(
        run.id,
        RunState.DISTURBED,
        "busy machine",
        rerun=False,
        result={**RESULT, "metrics": {"harness_hash": "h", "data_fingerprint": "d"}},
    )
    assert store.runs.measured_values(profile="cpu", harness_hash="h", data_fingerprint="d") == []
    assert store.runs.latest_ok("candidate", 5) == []


def test_a_rerun_can_be_set_aside_again(store: Store):
    first = new_run(store)
    second = store.runs.set_aside(first.id, RunState.LOST, "gone")
    third = store.runs.set_aside(second.id, RunState.REFUSED, "wrong identity")
    assert (second.rerun_of, third.rerun_of) == (first.id, second.id)
    assert [r.state for r in store.runs.all()] == ["lost", "refused", "queued"]
    assert {r.seed for r in store.runs.all()} == {first.seed}  # a re-run keeps the seed of the run it repeats
    assert new_run(store).seed == first.seed + 1  # re-runs take no seed of their own


def test_a_candidate_takes_mains_seeds_in_order_and_no_code_runs_twice_under_one_seed(store: Store):
    """An experiment's k-th run on a main takes main's k-th seed (they pair), then a seed neither
    side has run under; a new main (the kept change's code) runs under seeds that code has not run
    under, so its runs are fresh draws; a change re-measured there takes the new main's seeds."""
    exp, other = new_experiment(store), new_experiment(store, 3)
    main = [new_run(store, None, "baseline", code_hash="main-1").seed for _ in range(3)]
    on_main = dict(main_code="main-1")
    candidate = [new_run(store, exp.id, purpose, **on_main).seed for purpose in ("candidate", "confirm", "confirm")]
    assert (main, candidate) == ([1, 2, 3], [1, 2, 3])
    assert store.runs.next_seed("code-1", "main-1") == 4  # beyond main's seeds: one neither has run under
    assert new_run(store, exp.id, "confirm", **on_main).seed == 4
    assert new_run(store, None, "baseline", code_hash="main-1").seed == 4  # main's run under that seed pairs
    assert new_run(store, other.id, "candidate", code_hash="code-3", **on_main).seed == 1  # each change its own
    kept = [new_run(store, None, "baseline", code_hash="code-1").seed for _ in range(2)]  # code-1 is main now
    assert kept == [5, 6] and store.runs.main_seeds("code-1") == [5, 6]
    remeasured = new_run(store, other.id, "remeasure", code_hash="code-3-on-code-1", main_code="code-1")
    assert remeasured.seed == 5
    assert store.runs.next_seed("code-1") == 7 and store.runs.next_seed("code-3", "main-1") == 2


def test_main_runs_under_the_seed_an_experiments_next_run_takes_when_given(store: Store):
    store.runs.add(
        experiment_id=None,
        purpose="baseline",
        code_hash="main-1",
        commit_sha="c" * 40,
        base_sha=MAIN,
        asset="print(1)\n",
        profile="cpu",
        seed=7,
    )
    assert store.runs.main_seeds("main-1") == [7]
    assert new_run(store, new_experiment(store).id, main_code="main-1").seed == 7


def test_set_aside_run_is_one_transaction(store: Store):
    run = new_run(store)
    store.runs.mark_started(run.id, "/tmp/runs/1")
    events = store.events.all()
    add_failing_trigger(store, "runs", "NEW.rerun_of IS NOT NULL")
    with pytest.raises(sqlite3.IntegrityError, match="injected failure"):
        store.runs.set_aside(run.id, RunState.LOST, "gone", result=RESULT)
    assert store.runs.all() == [store.runs.get(run.id)]
    assert store.runs.get(run.id).state == "running" and store.runs.get(run.id).note is None
    assert store.events.all() == events
    assert not store.db.in_transaction


def test_set_aside_run_of_a_missing_run_raises_key_error(store: Store):
    with pytest.raises(KeyError):
        store.runs.set_aside(99, RunState.LOST, "gone")


def test_runs_filters(store: Store):
    e1 = new_experiment(store, 1)
    e2 = new_experiment(store, 2)
    r1 = new_run(store, e1.id, code_hash="x")
    r2 = new_run(store, e2.id, code_hash="y")
    r3 = new_run(store, e1.id, code_hash="y")
    store.runs.finish(r3.id, status="ok", val_bpb=1.0, metrics={}, error=None, log_tail=None)
    assert [r.id for r in store.runs.all()] == [r1.id, r2.id, r3.id]
    assert [r.id for r in store.runs.all(experiment_id=e1.id)] == [r1.id, r3.id]
    assert [r.id for r in store.runs.all(code_hash="y")] == [r2.id, r3.id]
    assert [r.id for r in store.runs.all(code_hash="y", state="queued")] == [r2.id]
    assert [r.id for r in store.runs.all(state="done", experiment_id=e1.id, code_hash="y")] == [r3.id]


def test_the_runs_of_several_experiments_come_in_one_read_each_in_run_order(store: Store):
    e1, e2, e3 = (new_experiment(store, n) for n in (1, 2, 3))
    r1 = new_run(store, e1.id)
    r2 = new_run(store, e2.id)
    r3 = new_run(store, e1.id, purpose="confirm")
    new_run(store)  # main's: no experiment
    found = store.runs.of_experiments([e1.id, e2.id, e3.id])
    assert {exp: [r.id for r in runs] for exp, runs in found.items()} == {
        e1.id: [r1.id, r3.id],
        e2.id: [r2.id],
        e3.id: [],
    }
    assert found[e1.id] == store.runs.all(experiment_id=e1.id)
    assert store.runs.of_experiments([]) == {}


def test_an_experiment_waits_while_a_run_of_its_current_train_py_is_queued_or_running(store: Store):
    e1, e2, e3, e4 = (new_experiment(store, n) for n in (1, 2, 3, 4))
    new_run(store, e1.id, code_hash="code-1")  # queued
    store.runs.mark_started(new_run(store, e2.id, code_hash="code-2").id, "/r")  # running
    done = new_run(store, e3.id, code_hash="code-3")
    store.runs.finish(done.id, status="ok", val_bpb=1.0, metrics={}, error=None, log_tail=None)
    new_run(store, e4.id, code_hash="older")  # queued, but of a train.py it no longer has
    assert store.runs.waiting_experiments([e1.id, e2.id, e3.id, e4.id]) == {e1.id, e2.id}
    assert store.runs.waiting_experiments([]) == set()


def test_count_runs_by_state(store: Store):
    runs = [new_run(store) for _ in range(5)]
    store.runs.mark_started(runs[0].id, "/r/1")
    store.runs.mark_started(runs[1].id, "/r/2")
    store.runs.finish(runs[1].id, status="ok", val_bpb=1.0, metrics={}, error=None, log_tail=None)
    store.runs.set_aside(runs[2].id, RunState.LOST, "gone")  # and a re-run queued
    assert store.runs.count(RunState.QUEUED) == 3
    assert store.runs.count(RunState.RUNNING) == 1
    assert store.runs.count(RunState.QUEUED, RunState.RUNNING) == 4
    assert store.runs.count("done", "lost") == 2
    assert store.runs.count(RunState.REFUSED) == 0


def test_latest_ok_runs_newest_first(store: Store):
    def finished(purpose: str, status: str, value: float | None):
        run = new_run(store, None, purpose)
        return store.runs.finish(run.id, status=status, val_bpb=value, metrics={}, error=None, log_tail=None)

    a = finished("baseline", "ok", 1.0)
    finished("baseline", "crash", None)
    finished("candidate", "ok", 0.9)
    b = finished("baseline", "ok", 1.1)
    new_run(store, None, "baseline")  # queued: not finished
    c = finished("baseline", "ok", 1.2)
    assert [r.id for r in store.runs.latest_ok("baseline", 10)] == [c.id, b.id, a.id]
    assert [r.id for r in store.runs.latest_ok("baseline", 2)] == [c.id, b.id]
    assert store.runs.latest_ok("confirm", 5) == []


def test_measured_values_only_ok_runs_under_one_identity(store: Store):
    exp = new_experiment(store)
    identity = {"harness_hash": "h1", "data_fingerprint": "d1"}

    def finished(code: str, experiment_id, purpose: str, status: str, value, profile: str = "cpu", **metrics):
        run = new_run(store, experiment_id, purpose, code_hash=code, profile=profile)
        return store.runs.finish(
            run.id, status=status, val_bpb=value, metrics={**identity, **metrics}, error=None, log_tail=None
        )

    finished("main", None, "baseline", "ok", 1.0)
    finished("main", None, "baseline", "crash", None)
    finished("main", None, "baseline", "ok", None)  # ok without a number
    finished("main", None, "baseline", "ok", 1.5, harness_hash="h2")
    finished("main", None, "baseline", "ok", 1.6, data_fingerprint="d2")
    finished("main", None, "baseline", "ok", 1.7, profile="gpu")
    finished("code-1", exp.id, "candidate", "ok", 0.9, params_fingerprint="f1")
    new_run(store, exp.id, "confirm", code_hash="code-1")  # still queued
    assert store.runs.measured_values(profile="cpu", harness_hash="h1", data_fingerprint="d1") == [
        ("main", None, "baseline", 1.0),
        ("code-1", exp.id, "candidate", 0.9),
    ]
    assert store.runs.measured_runs(profile="cpu", harness_hash="h1", data_fingerprint="d1") == [
        ("main", None, "baseline", 1.0, 1, MAIN, None),  # main's first run; its runner reported no fingerprint
        ("code-1", exp.id, "candidate", 0.9, 1, MAIN, "f1"),  # the experiment's first run
    ]
    assert store.runs.measured_values(profile="gpu", harness_hash="h1", data_fingerprint="d1") == [
        ("main", None, "baseline", 1.7)
    ]
    assert store.runs.measured_values(profile="cpu", harness_hash="h3", data_fingerprint="d1") == []


def test_run_code_hashes_lists_each_runs_code_after_a_run_id(store: Store):
    assert store.experiments.run_code_hashes() == []
    exp = new_experiment(store, 1, code_hash="exp-hash")
    main = new_run(store, None, "baseline", code_hash="main-hash")
    # a rebased experiment: its run has the new hash, the experiment row keeps the old one until updated
    rebased = new_run(store, exp.id, "remeasure", code_hash="rebased-hash")
    assert store.experiments.run_code_hashes() == [(main.id, "main-hash"), (rebased.id, "rebased-hash")]
    assert store.experiments.run_code_hashes(after=main.id) == [(rebased.id, "rebased-hash")]


def test_experiments_count_their_writes_for_readers_that_keep_them(store: Store):
    before = store.experiments.version
    exp = store.experiments.start_proposing(MAIN)
    other = new_experiment(store, 2)
    middle = store.experiments.version
    store.experiments.request(exp.id, "cancel", "alice")
    assert store.experiments.changed_since(middle) == {exp.id}
    assert store.experiments.changed_since(before) == {exp.id, other.id}
    assert store.experiments.changed_since(store.experiments.version) == set()
    store.experiments.withdraw_proposing(exp.id, "gone")
    assert [e.id for e in store.experiments.several({exp.id, other.id})] == [other.id]


# --- the inbox -----------------------------------------------------------------------------------


def test_add_inbox_records_an_entry(store: Store):
    assert store.inbox.last_id() == 0 and store.inbox.all() == [] and store.inbox.pending() == []
    assert store.inbox.add(key="cli-1", kind="steer", payload={"text": "try SwiGLU", "n": [1, 2]}, author="alice")
    [entry] = store.inbox.all()
    assert (entry.id, entry.key, entry.kind, entry.author) == (1, "cli-1", "steer", "alice")
    assert entry.payload == {"text": "try SwiGLU", "n": [1, 2]}
    assert entry.received_at > 0 and entry.processed_at is None and entry.outcome is None
    assert store.inbox.pending() == [entry]
    assert store.inbox.last_id() == 1


def test_a_duplicate_inbox_key_is_one_entry(store: Store):
    assert store.inbox.add(key="delivery-7", kind="pause", payload={}, author="github")
    assert not store.inbox.add(key="delivery-7", kind="pause", payload={}, author="github")
    assert not store.inbox.add(key="delivery-7", kind="steer", payload={"text": "other"}, author="eve")
    [entry] = store.inbox.all()
    assert (entry.kind, entry.payload, entry.author) == ("pause", {}, "github")
    store.inbox.mark_processed(entry.id, "paused")
    assert not store.inbox.add(key="delivery-7", kind="pause", payload={}, author="github")  # also once processed
    assert len(store.inbox.all()) == 1 and store.inbox.pending() == []


def test_pending_inbox_lists_unprocessed_entries_in_order(store: Store):
    for n, kind in enumerate(["steer", "pause", "resume", "steer"], start=1):
        store.inbox.add(key=f"k{n}", kind=kind, payload={"n": n}, author="bob")
    assert [e.key for e in store.inbox.pending()] == ["k1", "k2", "k3", "k4"]
    store.inbox.mark_processed(2, "paused")
    store.inbox.mark_processed(1, "rejected: empty text")
    assert [e.key for e in store.inbox.pending()] == ["k3", "k4"]
    done = {e.id: e for e in store.inbox.all()}
    assert done[1].outcome == "rejected: empty text" and done[1].processed_at > 0
    assert done[2].outcome == "paused" and done[3].processed_at is None
    assert [e.id for e in store.inbox.all()] == [1, 2, 3, 4]
    assert store.inbox.last_id() == 4


def entry(key: str, text: str = "hi") -> dict:
    return {"key": key, "kind": "steer", "payload": {"text": text}, "author": "github"}


def test_add_inbox_many_stores_a_batch_and_says_which_keys_were_new(store: Store):
    assert store.inbox.add(key="seen", kind="pause", payload={}, author="bob")
    ended: list[str] = []
    store.db.set_trace_callback(lambda sql: ended.append(sql) if sql in ("COMMIT", "ROLLBACK") else None)
    stored = store.inbox.add_many([entry("a"), entry("seen"), entry("b"), entry("a", "again")])
    assert stored == [True, False, True, False]
    assert ended == ["COMMIT"], "one transaction for the batch"
    assert [(e.key, e.payload) for e in store.inbox.all()] == [
        ("seen", {}),
        ("a", {"text": "hi"}),
        ("b", {"text": "hi"}),
    ]


def test_add_inbox_many_stores_all_or_none(store: Store):
    with pytest.raises(TypeError):  # json.dumps refuses the second payload: the first is rolled back too
        store.inbox.add_many([entry("a"), {**entry("b"), "payload": {"x": object()}}])
    assert store.inbox.all() == [] and not store.db.in_transaction
    assert store.inbox.add_many([entry("a")]) == [True]


def test_add_inbox_many_waits_for_another_writer_then_gives_up_and_keeps_its_busy_timeout(db_path: Path):
    store = Store(db_path)
    (timeout_ms,) = store.db.execute("PRAGMA busy_timeout").fetchone()
    other = sqlite3.connect(db_path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # the conductor, say, holds the write lock
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            store.inbox.add_many([entry("a")], patience_s=0.05)
        assert store.db.execute("PRAGMA busy_timeout").fetchone()[0] == timeout_ms == 30_000
        assert not store.db.in_transaction
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert store.inbox.add_many([entry("a")]) == [True]
    store.close()


def test_add_inbox_many_is_stored_once_the_other_writer_commits(db_path: Path):
    store = Store(db_path)
    other = sqlite3.connect(db_path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    outcome: list = []
    writer = threading.Thread(target=lambda: outcome.append(store.inbox.add_many([entry("a")])))
    writer.start()  # it polls the lock (or, scheduled late, finds it free): either way it stores the row
    other.execute("INSERT INTO inbox(key, kind, payload, author, received_at) VALUES ('b', 'pause', '{}', 'x', 0)")
    other.execute("COMMIT")
    writer.join(timeout=30)
    other.close()
    assert outcome == [[True]] and sorted(e.key for e in store.inbox.all()) == ["a", "b"]
    store.close()


def test_an_inbox_entry_written_by_another_process_is_seen(db_path: Path):
    conductor = Store(db_path)
    cli = Store(db_path)
    try:
        assert cli.inbox.add(key="cli-x", kind="steer", payload={"text": "hi"}, author="alice")
        assert [e.key for e in conductor.inbox.pending()] == ["cli-x"]
        conductor.inbox.mark_processed(1, "ok")
        assert cli.inbox.pending() == []
    finally:
        conductor.close()
        cli.close()


# --- a person's requests, what GitHub shows, the replies owed ------------------------------------


def test_a_request_waits_on_its_experiment_and_the_latest_one_wins(store: Store):
    first, second = new_experiment(store, 1), new_experiment(store, 2)
    store.experiments.request(second.id, "rerun", "alice")
    store.experiments.request(second.id, "keep", "bob")
    assert [(e.id, e.request, e.request_by) for e in store.experiments.requested()] == [(second.id, "keep", "bob")]
    assert store.events.all(second.id)[-1]["message"] == "bob asked for keep"
    assert store.experiments.get(first.id).request is None


def test_published_keys_find_their_experiment(store: Store):
    exp, other = new_experiment(store, 1), new_experiment(store, 2)
    store.published.set(exp.id, "pr", "7")
    store.published.set(exp.id, "pr", "8")  # the latest value wins
    store.published.set(exp.id, f"check:{MAIN}:0", "111")
    store.published.set(other.id, f"check:{MAIN}:0:done", "1")
    assert store.published.get(exp.id) == {"pr": "8", f"check:{MAIN}:0": "111"}
    assert store.published.experiment_of_pull(8) == store.experiments.get(exp.id)
    assert store.published.experiment_of_pull(7) is None
    assert store.published.experiment_of_check_run(111).id == exp.id
    assert store.published.experiment_of_check_run(1) is None  # a `:done` mark is no check run id


def test_an_experiment_is_behind_on_github_until_its_final_status_is_shown(store: Store):
    exp = experiment_in(store, State.BRANCHED)
    assert store.published.behind() == []  # no head pushed yet
    exp = store.experiments.update(exp.id, head_sha="d" * 40)
    assert [e.id for e in store.published.behind()] == [exp.id]  # active: always looked at
    for step in (State.MEASURING, State.CLOSING, State.DONE):
        exp = store.experiments.update(exp.id, state=step, status="discard")
    store.published.set(exp.id, "final", "keep")
    assert [e.id for e in store.published.behind()] == [exp.id]  # shown with another status
    store.published.set(exp.id, "final", "discard")
    assert store.published.behind() == []


def test_an_experiment_never_pushed_is_behind_once_it_ran_and_ended(store: Store):
    ran, never_ran = experiment_in(store, State.MEASURING, 1), experiment_in(store, State.BRANCHED, 2)
    run = new_run(store, ran.id)
    assert store.published.behind() == [] and store.experiments.started_without_branch() == []
    store.runs.mark_started(run.id, "fake://1")
    assert store.experiments.started_without_branch() == [ran.id]  # in flight, a run started, no branch
    for exp in (ran, never_ran):
        for step in (State.CLOSING, State.DONE):
            store.experiments.update(exp.id, state=step, status="discard")
    assert [e.id for e in store.published.behind()] == [ran.id]  # listed in the research log; the other had no run
    assert store.experiments.started_without_branch() == []
    store.published.set(ran.id, "final", "discard")
    assert store.published.behind() == []


def test_a_reply_is_owed_once_per_comment_until_posted(store: Store):
    store.replies.add(41, 7, "first")
    store.replies.add(41, 7, "again")  # the same comment's command applied twice
    store.replies.add(42, 9, "other")
    assert store.replies.pending() == [(41, 7, "first"), (42, 9, "other")]
    store.replies.mark_posted(41)
    assert store.replies.pending() == [(42, 9, "other")]


# --- events and feedback -------------------------------------------------------------------------


def test_event_round_trip(store: Store):
    exp = new_experiment(store)
    store.events.add(exp.id, "note", "hello")
    store.events.add(None, "global", "world")
    assert [e["message"] for e in store.events.all(exp.id)][1:] == [exp.title, "hello"]
    assert [e["kind"] for e in store.events.all()] == ["proposing", "proposed", "note", "global"]


def test_events_after_an_id(store: Store):
    exp = new_experiment(store)  # events 1 and 2
    store.events.add(exp.id, "note", "three")
    store.events.add(None, "global", "four")
    store.events.add(exp.id, "note", "five")
    assert [e["id"] for e in store.events.all(after=3)] == [4, 5]
    assert [e["message"] for e in store.events.all(exp.id, after=2)] == ["three", "five"]
    assert store.events.all(after=5) == [] and store.events.all(exp.id, after=99) == []
    assert [e["id"] for e in store.events.all(after=0)] == [1, 2, 3, 4, 5]


def test_feedback_round_trip_oldest_first_and_limited(store: Store):
    assert store.feedback.recent() == []
    for i in range(12):
        store.feedback.add("alice" if i % 2 else "bob", f"comment {i}")
    assert store.feedback.recent(limit=3) == ["comment 9", "comment 10", "comment 11"]
    assert store.feedback.recent() == [f"comment {i}" for i in range(2, 12)]  # default: the last 10
    assert store.feedback.recent(limit=100) == [f"comment {i}" for i in range(12)]


# --- resume --------------------------------------------------------------------------------------


def test_reopened_store_sees_everything(db_path: Path):
    first = Store(db_path)
    exp = new_experiment(first, 1, slug="raise-lr")
    first.experiments.update(exp.id, state="branched", event="pushed")
    run = new_run(first, exp.id, experiment_fields={"state": "measuring"})
    first.runs.mark_started(run.id, "/tmp/runs/1")
    first.feedback.add("alice", "try a smaller model")
    first.state.paused = True
    first.inbox.add(key="k", kind="pause", payload={}, author="alice")
    proposing = first.experiments.start_proposing(MAIN)
    first.close()

    second = Store(db_path)
    try:
        assert second.upgraded_from == schema.VERSION
        assert second.experiments.get(exp.id).state == "measuring"
        assert second.experiments.get(exp.id).branch == "autoresearch/1-raise-lr"
        assert second.experiments.get(proposing.id).state == "proposing"
        assert second.runs.all(state="running")[0].run_dir == "/tmp/runs/1"
        assert second.feedback.recent() == ["try a smaller model"]
        assert second.state.paused
        assert [e.key for e in second.inbox.pending()] == ["k"]
        assert [e["kind"] for e in second.events.all(exp.id)] == ["proposing", "proposed", "branched", "queued"]
        # numbering continues where it stopped
        assert new_experiment(second, 3).id == proposing.id + 1
        assert new_run(second, None, "baseline").id == run.id + 1
    finally:
        second.close()


def test_two_open_stores_on_one_file_see_each_other(db_path: Path):
    writer = Store(db_path)
    reader = Store(db_path)
    try:
        exp = new_experiment(writer)
        assert reader.experiments.get(exp.id).title == exp.title
        reader.experiments.update(exp.id, state="branched")
        assert writer.experiments.get(exp.id).state == "branched"
    finally:
        writer.close()
        reader.close()


# --- the failpoint -------------------------------------------------------------------------------

CHILD = textwrap.dedent("""
    import sys
    from pathlib import Path
    from bot.store import Store

    store = Store(Path(sys.argv[1]))
    mode = sys.argv[2]
    exp = store.experiments.start_proposing("abc")
    print("started", exp.id, flush=True)
    exp = store.experiments.fill_proposal(exp.id, title="Raise LR", hypothesis="faster", slug="raise-lr",
                                          code_hash="h1", asset="print(1)\\n", meta={"n": 1})
    print("added", exp.id, flush=True)
    if mode == "nested":
        with store.transaction():
            store.experiments.update(exp.id, state="branched", head_sha="def", event="pushed")
            print("inside", flush=True)
        print("committed", flush=True)
    else:
        store.experiments.update(exp.id, state="branched", head_sha="def", event="pushed")
    store.runs.add(experiment_id=exp.id, purpose="candidate", code_hash="h1", commit_sha="def", base_sha="abc",
                  asset="print(1)\\n", profile="cpu", experiment_fields={"state": "measuring"})
    print("survived", flush=True)
""")


def run_child(db_path: Path, failpoint: str | None, mode: str = "plain") -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("AUTORESEARCH_FAILPOINT", None)
    if failpoint is not None:
        env["AUTORESEARCH_FAILPOINT"] = failpoint
    db_path.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(db_path), mode], env=env, capture_output=True, text=True, timeout=120
    )


def test_failpoint_kills_after_proposing_is_committed(db_path: Path):
    result = run_child(db_path, "proposing")
    assert result.returncode == -signal.SIGKILL, result.stderr
    assert "started" not in result.stdout  # killed inside start_proposing, before it returned
    store = Store(db_path)
    try:
        assert store.experiments.get(1).state == "proposing"
        assert [e["kind"] for e in store.events.all(1)] == ["proposing"]
    finally:
        store.close()


def test_failpoint_kills_after_the_proposal_is_committed(db_path: Path):
    result = run_child(db_path, "proposed")
    assert result.returncode == -signal.SIGKILL, result.stderr
    assert "started 1" in result.stdout and "added" not in result.stdout
    store = Store(db_path)
    try:
        exp = store.experiments.get(1)
        assert exp.state == "proposed" and exp.title == "Raise LR"
        assert exp.branch == "autoresearch/1-raise-lr" and exp.meta == {"n": 1}
        assert [e["kind"] for e in store.events.all(1)] == ["proposing", "proposed"]
    finally:
        store.close()


def test_failpoint_on_a_state_change_kills_after_commit(db_path: Path):
    result = run_child(db_path, "branched")
    assert result.returncode == -signal.SIGKILL, result.stderr
    assert "added 1" in result.stdout and "survived" not in result.stdout
    store = Store(db_path)
    try:
        exp = store.experiments.get(1)
        assert exp.state == "branched" and exp.head_sha == "def"
        assert [e["kind"] for e in store.events.all(1)] == ["proposing", "proposed", "branched"]
    finally:
        store.close()


def test_failpoint_on_a_state_change_inside_an_outer_transaction_does_not_fire(db_path: Path):
    result = run_child(db_path, "branched", mode="nested")
    assert result.returncode == 0, result.stderr
    assert "inside" in result.stdout and "committed" in result.stdout and "survived" in result.stdout


def test_failpoint_of_a_state_change_written_with_a_run_fires_as_the_run_is_queued(db_path: Path):
    # the state change inside add_run is not committed on its own: its failpoint does not fire...
    assert run_child(db_path, "measuring").returncode == 0
    # ...the run's does, once both are committed
    other = db_path.parent / "other.db"
    result = run_child(other, "queued_candidate")
    assert result.returncode == -signal.SIGKILL, result.stderr
    assert "survived" not in result.stdout
    store = Store(other)
    try:
        assert store.experiments.get(1).state == "measuring"
        assert [(r.id, r.state) for r in store.runs.all()] == [(1, "queued")]
    finally:
        store.close()


@pytest.mark.parametrize("failpoint", [None, "something_else"], ids=["unset", "other-name"])
def test_no_failpoint_no_kill(db_path: Path, failpoint):
    result = run_child(db_path, failpoint)
    assert result.returncode == 0, result.stderr
    assert "survived" in result.stdout


def test_the_events_after_the_last_id_are_the_new_ones(store: Store):
    assert store.events.last_id() == 0
    store.events.add(None, "note", "first")
    seen = store.events.last_id()
    store.events.add(None, "note", "second")
    assert [e["message"] for e in store.events.all(after=seen)] == ["second"]
