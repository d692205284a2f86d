"""One read model behind every view: over one store with an identity change, a confirmation and a
keep, the dashboard, `autoresearch status`, the results, the chart and the research log give the
same baseline, margin and deltas, and the baseline is the value the keep was judged against (not a
mean that takes in main's run queued beside the confirmation, which finished after the decision)."""

from __future__ import annotations

import sqlite3
import statistics
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from rich.console import Console

from bot.core.states import State
from bot.loop import measurement
from bot.loop.judge import JudgeConfig, margin
from bot.store import Store
from bot.store.runs import ahead_of
from bot.views import plot, results
from bot.views.dashboard import dashboard_app
from bot.views.read_model import kept_for_simplicity, read_runs, read_view, run_title, view_of
from bot.views.research_log import facts, log_text
from bot.views.status import EVENTS, render_workdir_status
from bot.views.terminal import render_live_progress, results_table

OLD = {"profile": "cpu", "harness_hash": "h0", "data_fingerprint": "d1"}
IDENTITY = {"profile": "cpu", "harness_hash": "h1", "data_fingerprint": "d1"}
MAIN_A, MAIN_B = "a" * 40, "b" * 40
SIX = [2.8712, 2.8801, 2.8745, 2.8853, 2.8731, 2.8825]  # main A, measured six times under IDENTITY
BESIDE = 2.84  # main A's run beside the confirmation: it finished after the keep
CANDIDATE = [2.85, 2.856]  # experiment 1's run and its confirmation
MAIN_B_RUNS = [2.861, 2.865]
DISCARDED = 2.87


def run(
    store: Store,
    value: float,
    *,
    code: str,
    commit: str,
    identity: dict,
    experiment: int | None = None,
    purpose: str = "baseline",
) -> None:
    queued = store.runs.add(
        experiment_id=experiment,
        purpose=purpose,
        code_hash=code,
        commit_sha=commit,
        base_sha=MAIN_A,
        asset="print()\n",
        profile="cpu",
    )
    measured_under = {"harness_hash": identity["harness_hash"], "data_fingerprint": identity["data_fingerprint"]}
    store.runs.finish(queued.id, status="ok", val_bpb=value, error=None, log_tail="", metrics=measured_under)


def experiment(store: Store, title: str, code: str) -> int:
    exp = store.experiments.start_proposing(MAIN_A)
    store.experiments.fill_proposal(
        exp.id, title=title, hypothesis="because", slug="x", code_hash=code, asset="print()\n", meta={}
    )
    store.experiments.update(exp.id, state=State.BRANCHED, head_sha=code[0] * 40)
    store.experiments.update(exp.id, state=State.MEASURING)
    return exp.id


@pytest.fixture
def store(tmp_path: Path):
    """Main A measured under an older harness, then afresh under the pinned one (six runs); experiment
    1 confirmed (one more run of main beside it) and kept against main's six runs while the seventh
    still ran; the new main B measured twice; experiment 2 discarded against it."""
    s = Store(tmp_path / "state.db")
    s.state.identity = OLD
    for value in (3.1, 3.2):
        run(s, value, code="A", commit=MAIN_A, identity=OLD)
    s.state.identity = IDENTITY  # the harness changed: the runs above no longer count
    for value in SIX:
        run(s, value, code="A", commit=MAIN_A, identity=IDENTITY)
    kept = experiment(s, "Raise the learning rate", "E1")
    run(s, CANDIDATE[0], code="E1", commit="e" * 40, identity=IDENTITY, experiment=kept, purpose="candidate")
    run(s, CANDIDATE[1], code="E1", commit="e" * 40, identity=IDENTITY, experiment=kept, purpose="confirm")
    value, base = statistics.fmean(CANDIDATE), statistics.fmean(SIX)
    s.experiments.update(
        kept,
        state=State.MERGING,
        status="keep",
        val_bpb=value,
        delta=value - base,
        margin=0.0123,
        reason=f"val_bpb {value:.6f} beats main {base:.6f}",
        meta={"main_code": "A", "main_val_bpb": base, "runs": 2},
    )
    s.experiments.update(kept, state=State.CLOSING, merged_sha=MAIN_B)
    s.experiments.update(kept, state=State.DONE)
    run(s, BESIDE, code="A", commit=MAIN_A, identity=IDENTITY)
    for value in MAIN_B_RUNS:
        run(s, value, code="E1", commit=MAIN_B, identity=IDENTITY)
    discarded = experiment(s, "Deeper model", "E2")
    run(s, DISCARDED, code="E2", commit="f" * 40, identity=IDENTITY, experiment=discarded, purpose="candidate")
    s.experiments.update(
        discarded,
        state=State.CLOSING,
        status="discard",
        val_bpb=DISCARDED,
        delta=DISCARDED - statistics.fmean(MAIN_B_RUNS),
        margin=0.0456,
        reason="worse",
    )
    s.experiments.update(discarded, state=State.DONE)
    yield s
    s.close()


def test_every_view_gives_the_same_baseline_margin_and_deltas(store: Store):
    view = view_of(store)
    baseline = statistics.fmean(SIX)
    assert baseline != pytest.approx(statistics.fmean([*SIX, BESIDE]))  # the run beside the confirmation matters
    assert view.baseline is not None and view.baseline.val_bpb == pytest.approx(baseline)
    values = measurement.counted(store.runs.all(), IDENTITY)
    noise = measurement.noise(values)
    assert noise is not None
    now = margin(noise, 1, len(MAIN_B_RUNS), JudgeConfig())  # one run against main B's two
    assert view.main.margin == pytest.approx(now) and view.main.val_bpb == pytest.approx(statistics.fmean(MAIN_B_RUNS))
    deltas = {e.experiment.id: e.delta for e in view.experiments}

    with TestClient(dashboard_app(store_path=store.path)) as client:
        state = client.get("/api/state").json()
    assert state["main"]["baseline_val_bpb"] == pytest.approx(baseline)
    assert state["chart"]["points"][0]["val_bpb"] == pytest.approx(baseline)
    assert state["main"]["margin"] == pytest.approx(now)
    assert {e["id"]: e["delta"] for e in state["experiments"]} == deltas

    rows = results.rows(view)
    assert rows[0]["val_bpb"] == pytest.approx(baseline)
    assert {r["id"]: r["delta"] for r in rows[1:]} == deltas
    assert results.to_tsv(view).splitlines()[1].split("\t")[1] == f"{baseline:.6f}"

    chart = plot.chart_data(view)
    assert chart.baseline == pytest.approx(baseline) and chart.margin == pytest.approx(now)
    assert chart.best_steps[0] == (0, pytest.approx(baseline))

    status = text(render_workdir_status(view_of(store, events=EVENTS)))
    assert f"baseline {baseline:.6f}" in status and f"noise margin {now:.6f}" in status
    assert f"main {MAIN_B[:7]}: val_bpb {statistics.fmean(MAIN_B_RUNS):.6f} (mean of 2 run(s))" in status

    assert f"{deltas[1]:+.6f}" in text(results_table(view)) and f"{deltas[2]:+.6f}" in text(results_table(view))
    assert facts(view, now=0.0).baseline == pytest.approx(baseline)


def test_the_dashboards_connection_and_the_stores_read_the_same_view(store: Store):
    db = sqlite3.connect(f"{store.path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        alone = read_view(db)
    finally:
        db.close()
    assert alone.baseline == view_of(store).baseline and alone.main == view_of(store).main
    assert alone.chart == view_of(store).chart


def test_before_the_keep_the_baseline_is_main_now_with_every_run_that_counts(tmp_path: Path):
    store = Store(tmp_path / "state.db")
    store.state.identity = IDENTITY
    for value in [*SIX, BESIDE]:
        run(store, value, code="A", commit=MAIN_A, identity=IDENTITY)
    view = view_of(store)
    store.close()
    mean = statistics.fmean([*SIX, BESIDE])  # what the judge compares the next experiment against
    assert view.baseline is not None and view.baseline.val_bpb == pytest.approx(mean)
    assert view.main.val_bpb == pytest.approx(mean) and view.main.runs == 7


def test_a_run_queued_ahead_of_a_keeps_merge_is_not_mains_until_the_merge(tmp_path: Path):
    """While a keep waits to be merged, the runs of its train.py as the next main have already
    started (and may have ended): main is still the old one, and the run says whose it is."""
    store = Store(tmp_path / "state.db")
    store.state.identity = IDENTITY
    for value in SIX:
        run(store, value, code="A", commit=MAIN_A, identity=IDENTITY)
    ahead = store.runs.add(
        experiment_id=None,
        purpose="baseline",
        code_hash="E1",
        commit_sha="k" * 40,  # the kept branch's head: a squashing forge makes main another commit
        base_sha=ahead_of("E1"),
        asset="x",
        profile="cpu",
    )
    store.runs.finish(ahead.id, status="ok", val_bpb=2.5, error=None, log_tail="", metrics=dict(IDENTITY))
    view = view_of(store)
    assert view.main.commit == MAIN_A and view.main.val_bpb == pytest.approx(statistics.fmean(SIX))
    [row] = [r for r in read_runs(store.db) if r.id == ahead.id]
    assert run_title(row, None) == "baseline of the kept change, main once it is merged"

    store.runs.adopt([ahead.id], MAIN_B)  # merged: main's now
    view = view_of(store)
    store.close()
    assert view.main.commit == MAIN_B and view.main.val_bpb == pytest.approx(2.5)


SIMPLER = {"lines": 2, "tokens": 9, "loss_margin": 0.004}  # as bot.loop.lifecycle records a keep for simplicity
KEPT_FOR_SIMPLICITY = "kept for simplicity, 2 fewer lines of code (9 fewer code tokens)"


def test_a_keep_for_simplicity_is_said_so_wherever_a_keep_is_shown(store: Store):
    meta = store.experiments.get(1).meta
    store.experiments.update(1, meta={**meta, "kept_for_simplicity": SIMPLER})
    view = view_of(store)
    assert view.counts["keep"] == 1 and view.kept_for_simplicity == 1

    # results.tsv keeps the reference's columns and status; the description says it
    assert results.to_tsv(view).splitlines()[2].split("\t")[3:] == [
        "keep",
        f"Raise the learning rate; {KEPT_FOR_SIMPLICITY}",
    ]
    assert (
        results.rows(view)[1]["kept_for_simplicity"] == SIMPLER and results.rows(view)[2]["kept_for_simplicity"] is None
    )
    assert f"Raise the learning rate; {KEPT_FOR_SIMPLICITY}" in text(results_table(view))
    assert "kept 1 (1 for simplicity)" in text(render_live_progress(view, {}, 2, started=0.0))
    assert "experiments done 2: kept 1 (1 for simplicity), discarded 1" in text(render_workdir_status(view))

    with TestClient(dashboard_app(store_path=store.path)) as client:
        state = client.get("/api/state").json()
    assert state["counts"]["keep"] == 1 and state["counts"]["kept_for_simplicity"] == 1
    assert [e["kept_for_simplicity"] for e in state["experiments"]] == [KEPT_FOR_SIMPLICITY, None]
    assert [(p["status"], p["for_simplicity"]) for p in state["chart"]["points"]] == [
        ("baseline", False),
        ("keep", True),
        ("discard", False),
    ]

    assert [p.for_simplicity for p in plot.chart_data(view).points] == [False, True, False]

    log = log_text(facts(view, now=0.0), now=0.0, limit=65_536)
    assert "| Experiments | 2 finished: 1 kept (1 for simplicity), 1 discarded, 0 crashed;" in log
    assert "| 1 | Raise the learning rate (kept for simplicity) |" in log


def test_a_keep_with_no_simplicity_record_or_a_broken_one_is_a_plain_keep(store: Store):
    for record in (None, "yes", {"lines": "2", "tokens": 9, "loss_margin": 0.004}, {"lines": 2, "tokens": 9}):
        meta = {k: v for k, v in store.experiments.get(1).meta.items() if k != "kept_for_simplicity"}
        store.experiments.update(1, meta=meta if record is None else {**meta, "kept_for_simplicity": record})
        view = view_of(store)
        assert view.kept_for_simplicity == 0 and kept_for_simplicity(view.experiments[0].experiment) is None
        assert "for simplicity" not in results.to_tsv(view) + text(render_workdir_status(view))
    store.experiments.update(2, meta={"kept_for_simplicity": SIMPLER})  # a discard never reads as one
    assert view_of(store).kept_for_simplicity == 0


def text(renderable) -> str:
    console = Console(record=True, width=200)
    console.print(renderable)
    return console.export_text()
