"""results.tsv from a store built by hand: the baseline row, one row per finished experiment, and
the per-run rows."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bot.core.states import RunState
from bot.store import Store
from bot.views import results
from bot.views.read_model import view_of

MAIN_A = "aaaaaaa" + "1" * 33
MAIN_B = "bbbbbbb" + "2" * 33
HEADER = "commit\tval_bpb\tmemory_gb\tstatus\tdescription"
FIXTURES = Path(__file__).parents[1] / "store" / "fixtures"

# the allowed moves that take a new proposal to each state
PATH = {
    "proposed": [],
    "branched": ["branched"],
    "measuring": ["branched", "measuring"],
    "rebasing": ["branched", "measuring", "rebasing"],
    "merging": ["branched", "measuring", "merging"],
    "closing": ["branched", "measuring", "closing"],
    "done": ["branched", "measuring", "closing", "done"],
}


@pytest.fixture
def store(tmp_path: Path):
    s = Store(tmp_path / "autoresearch.db")
    yield s
    s.close()


def measured(
    store: Store,
    *,
    experiment_id: int | None,
    purpose: str,
    code_hash: str,
    commit_sha: str,
    status: str,
    val_bpb: float | None,
    metrics: dict | None = None,
):
    run = store.runs.add(
        experiment_id=experiment_id,
        purpose=purpose,
        code_hash=code_hash,
        commit_sha=commit_sha,
        base_sha=MAIN_A,
        asset="print()\n",
        profile="cpu",
    )
    return store.runs.finish(
        run.id,
        status=status,
        val_bpb=val_bpb,
        metrics=metrics or {},
        error="Traceback\nRuntimeError: boom" if status == "crash" else None,
        log_tail="",
    )


def experiment(
    store: Store,
    title: str,
    *,
    code_hash: str,
    runs: list[tuple[str, float | None, dict]],
    state: str = "done",
    status: str | None = None,
    val_bpb: float | None = None,
    delta: float | None = None,
    head_sha: str | None = None,
    **fields,
):
    started = store.experiments.start_proposing(MAIN_A)
    exp = store.experiments.fill_proposal(
        started.id, title=title, hypothesis="because", slug="x", code_hash=code_hash, asset="print()\n", meta={}
    )
    for run_status, value, metrics in runs:
        measured(
            store,
            experiment_id=exp.id,
            purpose="candidate",
            code_hash=code_hash,
            commit_sha=head_sha or "f" * 40,
            status=run_status,
            val_bpb=value,
            metrics=metrics,
        )
    for step in PATH[state][:-1]:
        store.experiments.update(exp.id, state=step)
    last = {"state": PATH[state][-1]} if PATH[state] else {}
    return store.experiments.update(
        exp.id,
        **last,
        status=status,
        val_bpb=val_bpb,
        delta=delta,
        head_sha=head_sha,
        reason=f"{status} because",
        **fields,
    )


@pytest.fixture
def history(store: Store) -> Store:
    """Baseline of main A (two ok runs and one crash), a later main B measured once, then experiments
    1 keep, 2 discard, 3 crash, 4 still measuring, 5 discard."""
    for value in (1.0, 1.02):
        measured(
            store,
            experiment_id=None,
            purpose="baseline",
            code_hash="A",
            commit_sha=MAIN_A,
            status="ok",
            val_bpb=value,
            metrics={"peak_vram_mb": 2048},
        )
    measured(
        store,
        experiment_id=None,
        purpose="baseline",
        code_hash="A",
        commit_sha=MAIN_A,
        status="crash",
        val_bpb=None,
        metrics={"peak_vram_mb": 99999},
    )
    experiment(
        store,
        "Raise the learning rate",
        code_hash="E1",
        head_sha="1234567890" * 4,
        runs=[("ok", 0.98, {"peak_vram_mb": 3072}), ("ok", 0.97, {"peak_vram_mb": 2560})],
        status="keep",
        val_bpb=0.975,
        delta=-0.035,
    )
    # the new main after the keep gets its own baseline: not part of the first main's baseline
    measured(
        store,
        experiment_id=None,
        purpose="baseline",
        code_hash="B",
        commit_sha=MAIN_B,
        status="ok",
        val_bpb=0.5,
        metrics={"peak_vram_mb": 8192},
    )
    experiment(
        store,
        "Deeper\tmodel\nwith more heads",
        code_hash="E2",
        head_sha="abcdef0123" * 4,
        runs=[("ok", 0.99, {"peak_vram_mb": 2560})],
        status="discard",
        val_bpb=0.99,
        delta=0.015,
    )
    experiment(
        store,
        "Huge batch",
        code_hash="E3",
        head_sha="9876543210" * 4,
        runs=[("crash", None, {})],
        status="crash",
        val_bpb=0.7,
        delta=-0.3,
    )
    experiment(
        store,
        "Still running",
        code_hash="E4",
        head_sha="5555555555" * 4,
        runs=[("ok", 0.96, {"peak_vram_mb": 1024})],
        state="measuring",
    )
    experiment(store, "No head", code_hash="E5", runs=[("ok", 1.1, {})], status="discard", val_bpb=1.1, delta=0.125)
    return store


# --- the baseline --------------------------------------------------------------------------------


def baseline_val_bpb(store: Store) -> float | None:
    """The loop's baseline as the results show it (its first row's val_bpb)."""
    baseline = view_of(store).baseline
    return baseline.val_bpb if baseline else None


def test_baseline_val_bpb_empty_store(store: Store):
    assert baseline_val_bpb(store) is None


def test_baseline_val_bpb_is_the_mean_of_the_first_mains_ok_runs(history: Store):
    assert baseline_val_bpb(history) == pytest.approx(1.01)


def test_baseline_val_bpb_none_when_every_baseline_run_crashed(store: Store):
    measured(
        store, experiment_id=None, purpose="baseline", code_hash="A", commit_sha=MAIN_A, status="crash", val_bpb=None
    )
    assert baseline_val_bpb(store) is None


def test_baseline_val_bpb_ignores_queued_runs(store: Store):
    measured(store, experiment_id=None, purpose="baseline", code_hash="A", commit_sha=MAIN_A, status="ok", val_bpb=1.25)
    store.runs.add(
        experiment_id=None,
        purpose="baseline",
        code_hash="A",
        commit_sha=MAIN_A,
        base_sha=MAIN_A,
        asset="print()\n",
        profile="cpu",
    )
    assert baseline_val_bpb(store) == 1.25


# --- rows ----------------------------------------------------------------------------------------


def test_rows_of_an_empty_store(store: Store):
    assert results.rows(view_of(store)) == []
    assert results.to_tsv(view_of(store)) == HEADER + "\n"


def test_rows_baseline_first_then_finished_experiments_in_id_order(history: Store):
    rows = results.rows(view_of(history))
    assert [r["id"] for r in rows] == [0, 1, 2, 3, 5]  # 4 is still measuring: not a row
    baseline = rows[0]
    assert baseline["commit"] == MAIN_A[:7]
    assert baseline["status"] == "keep" and baseline["description"] == "baseline"
    assert baseline["val_bpb"] == pytest.approx(1.01)
    assert baseline["memory_gb"] == 2.0  # the crashed run's number is not counted
    assert baseline["runs"] == 2
    assert baseline["delta"] is None and baseline["margin"] is None and baseline["remeasured_delta"] is None
    assert baseline["steps"] is None and baseline["tokens_per_second"] is None  # not reported by these runs
    assert set(baseline) == {
        "id",
        "commit",
        "val_bpb",
        "delta",
        "margin",
        "remeasured_delta",
        "memory_gb",
        "status",
        "runs",
        "steps",
        "tokens_per_second",
        "description",
        "reason",
        "cost_usd",
        "kept_for_simplicity",
    }
    assert all(set(row) == set(baseline) for row in rows)

    keep = rows[1]
    assert keep["status"] == "keep" and keep["val_bpb"] == 0.975 and keep["delta"] == -0.035
    assert keep["memory_gb"] == 3.0  # the peak over its runs
    assert keep["runs"] == 2 and keep["commit"] == "1234567"
    assert keep["reason"] == "keep because"

    crash = rows[3]
    assert crash["status"] == "crash"
    assert crash["val_bpb"] is None and crash["delta"] is None and crash["memory_gb"] == 0.0
    assert crash["runs"] == 1

    assert rows[4]["commit"] == ""  # never pushed
    assert rows[4]["memory_gb"] == 0.0  # no peak_vram_mb reported


def test_active_experiments_are_not_rows(store: Store):
    for state in ("proposed", "branched", "measuring", "rebasing", "merging", "closing"):
        experiment(
            store, f"in {state}", code_hash=state, runs=[("ok", 1.0, {})], state=state, status="keep", val_bpb=1.0
        )
    assert results.rows(view_of(store)) == []
    assert results.to_tsv(view_of(store)) == HEADER + "\n"


def test_experiments_finished_out_of_order_stay_in_id_order(store: Store):
    a = experiment(store, "first", code_hash="a", runs=[], state="measuring")
    experiment(store, "second", code_hash="b", runs=[("ok", 1.0, {})], status="discard", val_bpb=1.0)
    store.experiments.update(a.id, state="done", status="discard", val_bpb=1.1)
    assert [r["description"] for r in results.rows(view_of(store))] == ["first", "second"]


def test_rows_carry_margin_remeasured_delta_steps_and_tokens_per_second(store: Store):
    for steps, tps in ((100, 5000.0), (110, 5200.0)):
        measured(
            store,
            experiment_id=None,
            purpose="baseline",
            code_hash="A",
            commit_sha=MAIN_A,
            status="ok",
            val_bpb=1.0,
            metrics={"num_steps": steps, "tokens_per_second": tps},
        )
    experiment(
        store,
        "Faster attention",
        code_hash="E1",
        head_sha="1" * 40,
        status="keep",
        val_bpb=0.97,
        delta=-0.03,
        margin=0.012,
        remeasured_delta=-0.021,
        runs=[
            ("ok", 0.97, {"num_steps": 120, "tokens_per_second": 6000.0}),
            ("ok", 0.97, {"num_steps": 130, "tokens_per_second": 6400.0}),
            ("crash", None, {"num_steps": 1, "tokens_per_second": 1.0}),
        ],
    )  # a crash does not count
    baseline, keep = results.rows(view_of(store))
    assert (baseline["steps"], baseline["tokens_per_second"]) == (105, 5100.0)
    assert (keep["margin"], keep["remeasured_delta"]) == (0.012, -0.021)
    assert (keep["steps"], keep["tokens_per_second"]) == (125, 6200.0)
    assert keep["runs"] == 3


def test_a_discard_never_measured_shows_no_value_rather_than_zero(store: Store):
    """A proposal discarded unrun (it conflicted with a main that moved) has no number: 0.000000
    would read as the best result of the loop."""
    experiment(store, "Conflicted with the new main", code_hash="C", runs=[], status="discard")
    assert results.to_tsv(view_of(store)).splitlines()[1].split("\t")[1:4] == ["", "0.0", "discard"]


def test_a_failed_experiment_shows_like_a_crash(store: Store):
    experiment(
        store,
        "Gave up at rebasing",
        code_hash="F",
        head_sha="e" * 40,
        state="rebasing",
        runs=[("ok", 0.95, {"peak_vram_mb": 4096})],
        val_bpb=0.95,
        delta=-0.05,
    )
    failed = store.experiments.update(1, state="done", status="failed", reason="its rebasing step failed 5 times")
    row = results.rows(view_of(store))[0]
    assert (row["status"], row["val_bpb"], row["delta"], row["memory_gb"]) == ("failed", None, None, 0.0)
    assert row["reason"] == failed.reason and row["runs"] == 1
    assert results.to_tsv(view_of(store)).splitlines()[1] == "eeeeeee\t0.000000\t0.0\tfailed\tGave up at rebasing"


def test_proposing_experiments_are_not_rows(store: Store):
    store.experiments.start_proposing(MAIN_A)
    assert results.rows(view_of(store)) == []


def test_the_baseline_row_counts_only_done_baseline_runs(store: Store):
    # a set-aside run of another code first: it does not decide which main is the first one
    lost = store.runs.add(
        experiment_id=None,
        purpose="baseline",
        code_hash="Z",
        commit_sha="9" * 40,
        base_sha=MAIN_A,
        asset="print()\n",
        profile="cpu",
    )
    store.runs.set_aside(lost.id, RunState.LOST, "the runner restarted", rerun=False)
    measured(
        store,
        experiment_id=None,
        purpose="baseline",
        code_hash="A",
        commit_sha=MAIN_A,
        status="ok",
        val_bpb=1.0,
        metrics={"peak_vram_mb": 1024, "num_steps": 10},
    )
    disturbed = store.runs.add(
        experiment_id=None,
        purpose="baseline",
        code_hash="A",
        commit_sha=MAIN_A,
        base_sha=MAIN_A,
        asset="print()\n",
        profile="cpu",
    )
    store.runs.set_aside(
        disturbed.id,
        RunState.DISTURBED,
        "cpu_share 0.3",
        result={"status": "ok", "val_bpb": 2.0, "metrics": {"peak_vram_mb": 9999, "num_steps": 3}},
    )
    # the disturbed run's re-run is still queued; another one is running
    running = store.runs.add(
        experiment_id=None,
        purpose="baseline",
        code_hash="A",
        commit_sha=MAIN_A,
        base_sha=MAIN_A,
        asset="print()\n",
        profile="cpu",
    )
    store.runs.mark_started(running.id, "/tmp/runs/x")
    [baseline] = results.rows(view_of(store))
    assert baseline["commit"] == MAIN_A[:7]
    assert baseline["val_bpb"] == 1.0 and baseline_val_bpb(store) == 1.0
    assert baseline["runs"] == 1 and baseline["memory_gb"] == 1.0 and baseline["steps"] == 10


# --- run_rows ------------------------------------------------------------------------------------


def test_run_rows_of_an_empty_store(store: Store):
    assert results.run_rows(store) == []


def test_run_rows_list_every_run(store: Store):
    measured(
        store,
        experiment_id=None,
        purpose="baseline",
        code_hash="A",
        commit_sha=MAIN_A,
        status="ok",
        val_bpb=1.0,
        metrics={"num_steps": 100, "tokens_per_second": 5000.0, "cpu_share": 0.98, "total_seconds": 61.5},
    )
    exp = experiment(
        store, "Crashy", code_hash="E1", head_sha="1234567890" * 4, state="measuring", runs=[("crash", None, {})]
    )
    refused = store.runs.add(
        experiment_id=exp.id,
        purpose="confirm",
        code_hash="E1",
        commit_sha=exp.head_sha,
        base_sha=MAIN_A,
        asset="print()\n",
        profile="cpu",
    )
    rerun = store.runs.set_aside(
        refused.id,
        RunState.REFUSED,
        "result refused: wrong harness",
        result={"status": "ok", "val_bpb": 0.9, "metrics": {"num_steps": 90, "cpu_share": 0.5}},
    )
    rows = results.run_rows(store)
    assert [(r["run"], r["experiment"], r["purpose"], r["state"], r["status"]) for r in rows] == [
        (1, None, "baseline", "done", "ok"),
        (2, exp.id, "candidate", "done", "crash"),
        (3, exp.id, "confirm", "refused", "ok"),
        (rerun.id, exp.id, "confirm", "queued", None),
    ]
    assert set(rows[0]) == {
        "run",
        "experiment",
        "purpose",
        "state",
        "status",
        "val_bpb",
        "steps",
        "tokens_per_second",
        "cpu_share",
        "seconds",
        "commit",
        "note",
    }
    assert rows[0] == {
        "run": 1,
        "experiment": None,
        "purpose": "baseline",
        "state": "done",
        "status": "ok",
        "val_bpb": 1.0,
        "steps": 100,
        "tokens_per_second": 5000.0,
        "cpu_share": 0.98,
        "seconds": 61.5,
        "commit": MAIN_A[:7],
        "note": None,
    }
    assert rows[1]["note"] == "Traceback\nRuntimeError: boom"  # no note: the run's error
    assert rows[1]["commit"] == "1234567" and rows[1]["steps"] is None
    assert (rows[2]["note"], rows[2]["val_bpb"], rows[2]["steps"], rows[2]["cpu_share"]) == (
        "result refused: wrong harness",
        0.9,
        90,
        0.5,
    )
    assert rows[3]["note"] is None and rows[3]["val_bpb"] is None


# --- a state.db of the previous release ------------------------------------------------------------


def test_results_of_an_upgraded_v0_file(tmp_path: Path):
    path = tmp_path / "state.db"
    shutil.copyfile(FIXTURES / "state_v0.db", path)
    store = Store(path)
    try:
        assert (
            results.to_tsv(view_of(store))
            == "\n".join(
                [
                    HEADER,
                    "aaaaaaa\t2.255000\t0.5\tkeep\tbaseline",
                    "bbbbbbb\t2.300000\t0.5\tdiscard\tRaise MATRIX_LR",
                ]
            )
            + "\n"
        )
        rows = results.rows(view_of(store))
        assert rows[0]["steps"] == 60 and rows[1]["margin"] is None and rows[1]["remeasured_delta"] is None
        assert [r["state"] for r in results.run_rows(store)] == ["done", "done", "done", "running"]
    finally:
        store.close()


# --- to_tsv --------------------------------------------------------------------------------------


def test_to_tsv(history: Store):
    assert (
        results.to_tsv(view_of(history))
        == "\n".join(
            [
                HEADER,
                "aaaaaaa\t1.010000\t2.0\tkeep\tbaseline",
                "1234567\t0.975000\t3.0\tkeep\tRaise the learning rate",
                "abcdef0\t0.990000\t2.5\tdiscard\tDeeper model with more heads",
                "9876543\t0.000000\t0.0\tcrash\tHuge batch",
                "\t1.100000\t0.0\tdiscard\tNo head",
            ]
        )
        + "\n"
    )


def test_to_tsv_every_line_has_five_columns(history: Store):
    lines = results.to_tsv(view_of(history)).splitlines()
    assert lines[0].split("\t") == results.TSV_COLUMNS
    assert len(lines) == 1 + 5
    assert all(len(line.split("\t")) == 5 for line in lines)


@pytest.mark.parametrize(
    ("title", "description"),
    [
        ("a\tb", "a b"),
        ("a\nb", "a b"),
        ("tab\tand\nnewline\t\t", "tab and newline"),
        ("carriage\rreturn", "carriage return"),
        ('Use "flash" attention', 'Use "flash" attention'),  # no CSV quoting
    ],
)
def test_to_tsv_replaces_tabs_and_newlines_in_titles(store: Store, title, description):
    experiment(store, title, code_hash="t", runs=[("ok", 1.0, {})], status="discard", val_bpb=1.0, head_sha="c" * 40)
    line = results.to_tsv(view_of(store)).splitlines()[1]
    assert line == f"ccccccc\t1.000000\t0.0\tdiscard\t{description}"


def test_crash_row_without_experiment_numbers(store: Store):
    experiment(
        store, "boom", code_hash="c", runs=[("crash", None, {"peak_vram_mb": 4096})], status="crash", head_sha="d" * 40
    )
    assert results.to_tsv(view_of(store)).splitlines()[1] == "ddddddd\t0.000000\t0.0\tcrash\tboom"


# --- export_tsv ----------------------------------------------------------------------------------


def test_export_tsv_writes_atomically(history: Store, tmp_path: Path):
    out = tmp_path / "out"
    out.mkdir()
    path = out / "results.tsv"
    path.write_text("stale\n")
    results.export_tsv(history, path)
    assert path.read_text() == results.to_tsv(view_of(history))
    assert sorted(p.name for p in out.iterdir()) == ["results.tsv"]  # no results.tsv.tmp left behind
    # exporting again replaces it in place
    history.experiments.update(4, state="done", status="discard", val_bpb=0.96, delta=-0.05)
    results.export_tsv(history, path)
    assert path.read_text() == results.to_tsv(view_of(history))
    assert "Still running" in path.read_text()
    assert sorted(p.name for p in out.iterdir()) == ["results.tsv"]


def test_export_tsv_of_an_empty_store(store: Store, tmp_path: Path):
    path = tmp_path / "results.tsv"
    results.export_tsv(store, path)
    assert path.read_text() == HEADER + "\n"
    assert not list(tmp_path.glob("*.tmp"))  # no temporary file left behind
