"""The store on a real SQLite file: ids, transactions, idempotence, resume, and the crash failpoint."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bot.store import Store

MAIN = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "autoresearch.db"  # the parent does not exist yet: Store creates it


@pytest.fixture
def store(db_path: Path):
    s = Store(db_path)
    yield s
    s.close()


def new_experiment(store: Store, n: int = 1, **overrides):
    kwargs = dict(title=f"Experiment {n}", hypothesis=f"hypothesis {n}", slug=f"exp-{n}", code_hash=f"code-{n}",
                  train_py=f"print({n})\n", meta={"changes": [{"name": "LR", "old": 0.04, "new": 0.05}]},
                  base_sha=MAIN)
    kwargs.update(overrides)
    return store.add_experiment(**kwargs)


def new_run(store: Store, experiment_id: int | None = None, purpose: str = "candidate", code_hash: str = "code-1",
            **kwargs):
    return store.add_run(experiment_id=experiment_id, purpose=purpose, code_hash=code_hash, commit_sha="c" * 40,
                         base_sha=MAIN, asset="print(1)\n", profile="cpu", **kwargs)


def add_failing_trigger(store: Store, table: str, when: str) -> None:
    """Make an INSERT into `table` fail inside SQLite (a real constraint failure, not a mock)."""
    store.db.execute(f"CREATE TRIGGER fail_{table} BEFORE INSERT ON {table} WHEN {when} "
                     "BEGIN SELECT RAISE(ABORT, 'injected failure'); END")


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


def test_schema_is_created(store: Store):
    tables = {r[0] for r in store.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"experiments", "runs", "events", "feedback", "settings"} <= tables


def test_settings_round_trip(store: Store):
    assert store.get_setting("main_sha") is None
    assert store.get_setting("main_sha", "none") == "none"
    store.set_setting("main_sha", "abc")
    store.set_setting("main_sha", "def")
    assert store.get_setting("main_sha") == "def"


# --- experiments ---------------------------------------------------------------------------------

def test_add_experiment_assigns_increasing_ids_and_branches(store: Store):
    first = new_experiment(store, 1, slug="raise-lr")
    second = new_experiment(store, 2, slug="deeper-model")
    third = new_experiment(store, 3, slug="raise-lr")  # the same slug again: the id keeps the branch unique
    assert [first.id, second.id, third.id] == [1, 2, 3]
    assert first.branch == "autoresearch/1-raise-lr"
    assert second.branch == "autoresearch/2-deeper-model"
    assert third.branch == "autoresearch/3-raise-lr"


def test_add_experiment_records_the_proposal(store: Store):
    exp = new_experiment(store, 1, title="Raise LR", meta={"changes": [{"name": "LR", "new": 0.05}]})
    assert exp.state == "proposed"
    assert exp.status is None
    assert exp.title == "Raise LR"
    assert exp.meta == {"changes": [{"name": "LR", "new": 0.05}]}
    assert exp.base_sha == MAIN
    assert exp.code_hash == "code-1" and exp.train_py == "print(1)\n"
    assert (exp.head_sha, exp.merged_sha, exp.val_bpb, exp.delta, exp.reason) == (None,) * 5
    assert exp.created_at == exp.updated_at > 0
    assert store.experiment(exp.id) == exp
    events = store.events(exp.id)
    assert [(e["kind"], e["message"]) for e in events] == [("proposed", "Raise LR")]


def test_missing_experiment_raises_key_error(store: Store):
    with pytest.raises(KeyError):
        store.experiment(42)


def test_update_experiment_writes_fields_and_event(store: Store):
    exp = new_experiment(store)
    updated = store.update_experiment(exp.id, state="branched", head_sha="d" * 40, meta={"k": [1, 2]},
                                      event="branch pushed")
    assert updated.state == "branched"
    assert updated.head_sha == "d" * 40
    assert updated.meta == {"k": [1, 2]}
    assert updated.updated_at >= exp.updated_at
    assert updated.created_at == exp.created_at
    assert [(e["kind"], e["message"]) for e in store.events(exp.id)] == [
        ("proposed", exp.title), ("branched", "branch pushed")]


def test_update_experiment_event_kind_without_state_and_no_event(store: Store):
    exp = new_experiment(store)
    store.update_experiment(exp.id, reason="noted", event="a note")
    store.update_experiment(exp.id, val_bpb=0.97, delta=-0.01)  # no event
    assert [e["kind"] for e in store.events(exp.id)] == ["proposed", "update"]
    assert store.experiment(exp.id).reason == "noted"
    assert store.experiment(exp.id).val_bpb == 0.97


def test_update_experiment_is_atomic(store: Store):
    exp = new_experiment(store)
    add_failing_trigger(store, "events", "NEW.message = 'boom'")
    with pytest.raises(sqlite3.IntegrityError, match="injected failure"):
        store.update_experiment(exp.id, state="branched", head_sha="d" * 40, event="boom")
    # the event failed after the UPDATE ran: the UPDATE is rolled back with it
    after = store.experiment(exp.id)
    assert after.state == "proposed" and after.head_sha is None
    assert [e["kind"] for e in store.events(exp.id)] == ["proposed"]
    assert not store.db.in_transaction
    # and the store still works
    assert store.update_experiment(exp.id, state="branched", event="ok").state == "branched"


def test_update_experiment_with_unknown_column_writes_nothing(store: Store):
    exp = new_experiment(store)
    with pytest.raises(sqlite3.OperationalError):
        store.update_experiment(exp.id, state="branched", no_such_column=1, event="x")
    assert store.experiment(exp.id).state == "proposed"
    assert len(store.events(exp.id)) == 1
    assert not store.db.in_transaction


def test_experiments_filters_active_and_done(store: Store):
    a = new_experiment(store, 1)
    b = new_experiment(store, 2)
    c = new_experiment(store, 3)
    store.update_experiment(a.id, state="done", status="keep")
    store.update_experiment(b.id, state="measuring")
    assert [e.id for e in store.experiments()] == [1, 2, 3]
    assert [e.id for e in store.experiments(active=True)] == [b.id, c.id]
    assert [e.id for e in store.experiments(active=False)] == [a.id]


def test_experiment_by_code(store: Store):
    new_experiment(store, 1, code_hash="same")
    new_experiment(store, 2, code_hash="same")
    assert store.experiment_by_code("same").id == 1
    assert store.experiment_by_code("other") is None


# --- runs ----------------------------------------------------------------------------------------

def test_add_run_queues_with_a_seed_per_run(store: Store):
    exp = new_experiment(store)
    runs = [new_run(store, exp.id), new_run(store, exp.id, purpose="confirm"), new_run(store, None, "baseline")]
    assert [r.id for r in runs] == [1, 2, 3]
    assert [r.seed for r in runs] == [r.id for r in runs]
    assert len({r.seed for r in runs}) == 3
    assert all(r.state == "queued" and r.status is None and r.metrics == {} for r in runs)
    assert runs[2].experiment_id is None and runs[2].purpose == "baseline"
    messages = [e["message"] for e in store.events()]
    assert "run 1 (candidate) queued" in messages
    assert "run 3 (baseline) queued" in messages


def test_add_run_reason_goes_into_the_event(store: Store):
    new_run(store, None, "baseline", reason="replaces lost run 7")
    assert store.events()[-1]["message"] == "run 1 (baseline) queued: replaces lost run 7"


def test_add_run_with_experiment_fields_updates_both(store: Store):
    exp = new_experiment(store)
    run = new_run(store, exp.id, experiment_fields={"state": "measuring", "head_sha": "e" * 40})
    after = store.experiment(exp.id)
    assert after.state == "measuring" and after.head_sha == "e" * 40
    assert after.updated_at >= exp.updated_at
    assert store.runs(experiment_id=exp.id) == [run]


def test_add_run_with_a_bad_experiment_field_writes_neither(store: Store):
    exp = new_experiment(store)
    events_before = count(store, "events")
    # the INSERT of the run succeeds, then the experiment UPDATE fails: both must be rolled back
    with pytest.raises(sqlite3.OperationalError, match="no_such_column"):
        new_run(store, exp.id, experiment_fields={"state": "measuring", "no_such_column": 1})
    assert count(store, "runs") == 0
    assert store.runs() == []
    assert store.experiment(exp.id).state == "proposed"
    assert store.experiment(exp.id).updated_at == exp.updated_at
    assert count(store, "events") == events_before
    assert not store.db.in_transaction
    # the id is not burnt: the next run is run 1
    assert new_run(store, exp.id).id == 1


def test_add_run_failing_at_its_event_writes_neither(store: Store):
    exp = new_experiment(store)
    add_failing_trigger(store, "events", "NEW.kind = 'queued'")
    with pytest.raises(sqlite3.IntegrityError, match="injected failure"):
        new_run(store, exp.id, experiment_fields={"state": "measuring"})
    assert store.runs() == []
    assert store.experiment(exp.id).state == "proposed"


def test_mark_run_started(store: Store):
    run = new_run(store)
    store.mark_run_started(run.id, "/tmp/runs/1")
    started = store.run(run.id)
    assert started.state == "running" and started.run_dir == "/tmp/runs/1" and started.started_at > 0
    assert store.runs(state="running") == [started]


def test_finish_run_records_the_result(store: Store):
    run = new_run(store)
    metrics = {"peak_vram_mb": 2048.0, "harness_hash": "h1", "data_fingerprint": "d1", "steps": 10}
    done = store.finish_run(run.id, status="ok", val_bpb=0.987, metrics=metrics, error=None, log_tail="tail")
    assert done.state == "done" and done.status == "ok" and done.val_bpb == 0.987
    assert done.metrics == metrics
    assert done.harness_hash == "h1" and done.data_fingerprint == "d1"
    assert done.log_tail == "tail" and done.error is None
    assert done.finished_at > 0


def test_finish_run_is_idempotent(store: Store):
    run = new_run(store)
    first = store.finish_run(run.id, status="ok", val_bpb=0.987, metrics={"peak_vram_mb": 1.0}, error=None,
                             log_tail="first")
    second = store.finish_run(run.id, status="crash", val_bpb=None, metrics={"peak_vram_mb": 9.0},
                              error="Traceback", log_tail="second")
    assert second == first
    assert store.run(run.id).status == "ok" and store.run(run.id).val_bpb == 0.987


def test_replace_lost_run_queues_an_identical_run_in_one_transaction(store: Store):
    exp = new_experiment(store)
    run = new_run(store, exp.id)
    store.mark_run_started(run.id, "/tmp/runs/1")
    replacement = store.replace_lost_run(run.id, "its process was gone")
    lost = store.run(run.id)
    assert lost.state == "lost" and lost.error == "its process was gone"
    assert store.runs(state="running") == []
    assert replacement.state == "queued" and replacement.id != run.id and replacement.seed == replacement.id
    assert (replacement.experiment_id, replacement.purpose, replacement.code_hash, replacement.asset) == (
        run.experiment_id, run.purpose, run.code_hash, run.asset)
    event = store.events()[-1]
    assert event["kind"] == "lost" and event["experiment_id"] == exp.id
    assert event["message"] == f"run {run.id}: its process was gone; queued again as run {replacement.id}"


def test_runs_filters(store: Store):
    e1 = new_experiment(store, 1)
    e2 = new_experiment(store, 2)
    r1 = new_run(store, e1.id, code_hash="x")
    r2 = new_run(store, e2.id, code_hash="y")
    r3 = new_run(store, e1.id, code_hash="y")
    store.finish_run(r3.id, status="ok", val_bpb=1.0, metrics={}, error=None, log_tail=None)
    assert [r.id for r in store.runs()] == [r1.id, r2.id, r3.id]
    assert [r.id for r in store.runs(experiment_id=e1.id)] == [r1.id, r3.id]
    assert [r.id for r in store.runs(code_hash="y")] == [r2.id, r3.id]
    assert [r.id for r in store.runs(code_hash="y", state="queued")] == [r2.id]
    assert [r.id for r in store.runs(state="done", experiment_id=e1.id, code_hash="y")] == [r3.id]


def test_seen_code_hashes_covers_experiments_and_runs(store: Store):
    assert store.seen_code_hashes() == set()
    exp = new_experiment(store, 1, code_hash="exp-hash")
    new_run(store, None, "baseline", code_hash="main-hash")
    # a rebased experiment: its run has the new hash, the experiment row keeps the old one until updated
    new_run(store, exp.id, "remeasure", code_hash="rebased-hash")
    assert store.seen_code_hashes() == {"exp-hash", "main-hash", "rebased-hash"}


# --- events and feedback -------------------------------------------------------------------------

def test_event_round_trip(store: Store):
    exp = new_experiment(store)
    store.event(exp.id, "note", "hello")
    store.event(None, "global", "world")
    assert [e["message"] for e in store.events(exp.id)] == [exp.title, "hello"]
    assert [e["kind"] for e in store.events()] == ["proposed", "note", "global"]


def test_feedback_round_trip_oldest_first_and_limited(store: Store):
    assert store.recent_feedback() == []
    for i in range(12):
        store.add_feedback("alice" if i % 2 else "bob", f"comment {i}")
    assert store.recent_feedback(limit=3) == ["comment 9", "comment 10", "comment 11"]
    assert store.recent_feedback() == [f"comment {i}" for i in range(2, 12)]  # default: the last 10
    assert store.recent_feedback(limit=100) == [f"comment {i}" for i in range(12)]


# --- resume --------------------------------------------------------------------------------------

def test_reopened_store_sees_everything(db_path: Path):
    first = Store(db_path)
    exp = new_experiment(first, 1, slug="raise-lr")
    first.update_experiment(exp.id, state="measuring", event="measuring")
    run = new_run(first, exp.id)
    first.mark_run_started(run.id, "/tmp/runs/1")
    first.add_feedback("alice", "try a smaller model")
    first.set_setting("main_sha", MAIN)
    first.close()

    second = Store(db_path)
    try:
        assert second.experiment(exp.id).state == "measuring"
        assert second.experiment(exp.id).branch == "autoresearch/1-raise-lr"
        assert second.runs(state="running")[0].run_dir == "/tmp/runs/1"
        assert second.recent_feedback() == ["try a smaller model"]
        assert second.get_setting("main_sha") == MAIN
        assert [e["kind"] for e in second.events(exp.id)] == ["proposed", "measuring", "queued"]
        # numbering continues where it stopped
        assert new_experiment(second, 2).id == 2
        assert new_run(second, None, "baseline").id == run.id + 1
    finally:
        second.close()


def test_two_open_stores_on_one_file_see_each_other(db_path: Path):
    writer = Store(db_path)
    reader = Store(db_path)
    try:
        exp = new_experiment(writer)
        assert reader.experiment(exp.id).title == exp.title
        reader.update_experiment(exp.id, state="branched")
        assert writer.experiment(exp.id).state == "branched"
    finally:
        writer.close()
        reader.close()


# --- the failpoint -------------------------------------------------------------------------------

CHILD = textwrap.dedent("""
    import sys
    from pathlib import Path
    from bot.store import Store

    store = Store(Path(sys.argv[1]))
    exp = store.add_experiment(title="Raise LR", hypothesis="faster", slug="raise-lr", code_hash="h1",
                               train_py="print(1)\\n", meta={"n": 1}, base_sha="abc")
    print("added", exp.id, flush=True)
    store.update_experiment(exp.id, state="branched", head_sha="def", event="pushed")
    print("survived", flush=True)
""")


def run_child(db_path: Path, failpoint: str | None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("AUTORESEARCH_FAILPOINT", None)
    if failpoint is not None:
        env["AUTORESEARCH_FAILPOINT"] = failpoint
    db_path.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, "-c", CHILD, str(db_path)], env=env, capture_output=True, text=True,
                          timeout=120)


def test_failpoint_kills_after_the_experiment_is_committed(db_path: Path):
    result = run_child(db_path, "proposed")
    assert result.returncode == -signal.SIGKILL, result.stderr
    assert "added" not in result.stdout  # killed inside add_experiment, before it returned
    store = Store(db_path)
    try:
        exp = store.experiment(1)
        assert exp.state == "proposed" and exp.title == "Raise LR"
        assert exp.branch == "autoresearch/1-raise-lr" and exp.meta == {"n": 1}
        assert [e["kind"] for e in store.events(1)] == ["proposed"]
    finally:
        store.close()


def test_failpoint_on_a_state_change_kills_after_commit(db_path: Path):
    result = run_child(db_path, "branched")
    assert result.returncode == -signal.SIGKILL, result.stderr
    assert "added 1" in result.stdout and "survived" not in result.stdout
    store = Store(db_path)
    try:
        exp = store.experiment(1)
        assert exp.state == "branched" and exp.head_sha == "def"
        assert [e["kind"] for e in store.events(1)] == ["proposed", "branched"]
    finally:
        store.close()


@pytest.mark.parametrize("failpoint", [None, "something_else"], ids=["unset", "other-name"])
def test_no_failpoint_no_kill(db_path: Path, failpoint):
    result = run_child(db_path, failpoint)
    assert result.returncode == 0, result.stderr
    assert "survived" in result.stdout
