"""Every face speaks the loop's task's metric: over a store of a higher-is-better task (ticket
routing's accuracy), whose runs hold their loss (the accuracy negated, as bot.runners.specs records
it), the View, results.tsv, the plot, the dashboard's state, `autoresearch status`, the results
table and the research log show accuracy on its own scale, named, with the best line the highest."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from rich.console import Console

from bot.core.states import State
from bot.store import Store
from bot.views import plot, results
from bot.views.dashboard_state import build_state
from bot.views.read_model import view_of
from bot.views.research_log import facts, log_text
from bot.views.status import main_line
from bot.views.terminal import results_table, runs_table

IDENTITY = {"task": "ticket-routing", "profile": "cpu", "harness_hash": "h1", "data_fingerprint": "d1"}
MAIN_A, MAIN_B, MAIN_C = "a" * 40, "b" * 40, "c" * 40
A_RUNS = [0.80, 0.81, 0.79, 0.80]  # accuracy: higher is better
KEPT = 0.85  # experiment 1, kept: main B
B_RUNS = [0.85, 0.86]
DISCARDED = 0.84  # experiment 2, against main B
SIMPLER = 0.845  # experiment 3, kept for simplicity: main C, a little worse than B
C_RUNS = [0.846, 0.844]


def loss(accuracy: float) -> float:
    return -accuracy


def run(store: Store, accuracy: float, *, code: str, commit: str, experiment: int | None = None) -> None:
    queued = store.runs.add(
        experiment_id=experiment,
        purpose="baseline" if experiment is None else "candidate",
        code_hash=code,
        commit_sha=commit,
        base_sha=MAIN_A,
        asset="def route(text): return 'card'\n",
        profile="cpu",
    )
    measured_under = {"harness_hash": "h1", "data_fingerprint": "d1"}
    store.runs.finish(queued.id, status="ok", val_bpb=loss(accuracy), error=None, log_tail="", metrics=measured_under)


def decided(store: Store, title: str, code: str, accuracy: float, main: float, status: str, **meta: object) -> int:
    exp = store.experiments.start_proposing(MAIN_A)
    store.experiments.fill_proposal(
        exp.id, title=title, hypothesis="because", slug="x", code_hash=code, asset="x\n", meta={}
    )
    store.experiments.update(exp.id, state=State.BRANCHED, head_sha=code[-1] * 40)
    store.experiments.update(exp.id, state=State.MEASURING)
    run(store, accuracy, code=code, commit=code[-1] * 40, experiment=exp.id)
    store.experiments.update(
        exp.id,
        state=State.CLOSING,
        status=status,
        val_bpb=loss(accuracy),
        delta=loss(accuracy) - loss(main),
        margin=0.01,
        reason="judged",
        meta={"main_val_bpb": loss(main), **meta},
    )
    store.experiments.update(exp.id, state=State.DONE)
    return exp.id


@pytest.fixture
def store(tmp_path: Path):
    s = Store(tmp_path / "state.db")
    s.state.identity = IDENTITY
    for accuracy in A_RUNS:
        run(s, accuracy, code="A", commit=MAIN_A)
    decided(s, "Bigrams", "E1", KEPT, statistics.fmean(A_RUNS), "keep")
    for accuracy in B_RUNS:
        run(s, accuracy, code="E1", commit=MAIN_B)
    decided(s, "Trigrams", "E2", DISCARDED, statistics.fmean(B_RUNS), "discard")
    simpler = {"lines": 2, "tokens": 9, "loss_margin": 0.02}
    decided(s, "Fewer rules", "E3", SIMPLER, statistics.fmean(B_RUNS), "keep", kept_for_simplicity=simpler)
    for accuracy in C_RUNS:
        run(s, accuracy, code="E3", commit=MAIN_C)
    yield s
    s.close()


def test_the_view_is_on_the_metrics_scale_and_its_best_line_is_the_highest(store: Store):
    view = view_of(store)
    assert (view.metric.name, view.metric.direction) == ("accuracy", "higher")
    assert view.baseline is not None and view.baseline.val_bpb == pytest.approx(statistics.fmean(A_RUNS))
    assert view.main.val_bpb == pytest.approx(statistics.fmean(C_RUNS))
    assert view.main.margin is not None and view.main.margin > 0  # a margin is a magnitude
    numbers = {e.experiment.title: (e.val_bpb, e.delta) for e in view.experiments}
    assert numbers["Bigrams"] == pytest.approx((KEPT, KEPT - statistics.fmean(A_RUNS)))  # a gain is positive
    assert numbers["Trigrams"] == pytest.approx((DISCARDED, DISCARDED - statistics.fmean(B_RUNS)))
    chart = view.chart
    assert [p.val_bpb for p in chart.points] == pytest.approx([statistics.fmean(A_RUNS), KEPT, DISCARDED, SIMPLER])
    assert [v for _, v in chart.main_steps] == pytest.approx([statistics.fmean(A_RUNS), KEPT, SIMPLER])
    assert chart.best[-1] == (3, pytest.approx(KEPT))  # the keep for simplicity is no new best


def test_results_tsv_names_the_metric_in_val_bpbs_column(store: Store):
    view = view_of(store)
    lines = [line.split("\t") for line in results.to_tsv(view).splitlines()]
    assert lines[0] == ["commit", "accuracy", "memory_gb", "status", "description"]
    assert [line[1] for line in lines[1:]] == [f"{v:.6f}" for v in (statistics.fmean(A_RUNS), KEPT, DISCARDED, SIMPLER)]
    assert [row["val_bpb"] for row in results.run_rows(store)][:4] == pytest.approx(A_RUNS)


def test_the_plot_labels_the_metric_and_its_direction(store: Store, tmp_path: Path):
    data = plot.chart_data(view_of(store))
    assert data.gain == pytest.approx(SIMPLER - statistics.fmean(A_RUNS))  # better than the baseline: positive
    svg_path = tmp_path / "progress.svg"
    plot.write_chart(store, svg_path)
    svg = svg_path.read_text()
    assert "accuracy (fraction of hold-out tickets routed to their queue)" in svg
    assert "higher is better" in svg and "lower is better" not in svg
    assert f"best accuracy {SIMPLER:.6f} (main now)" in svg and "val_bpb" not in svg


def test_the_dashboard_state_carries_the_metric_and_its_numbers(store: Store):
    state = build_state(store.db)
    assert state["metric"] == {
        "name": "accuracy",
        "unit": "fraction of hold-out tickets routed to their queue",
        "direction": "higher",
        "places": 6,
        "scale": "linear",
    }
    assert state["main"]["val_bpb"] == pytest.approx(statistics.fmean(C_RUNS))
    assert state["main"]["baseline_val_bpb"] == pytest.approx(statistics.fmean(A_RUNS))
    assert [e["delta"] > 0 for e in state["experiments"]] == [True, False, False]
    assert state["chart"]["best"][-1] == [3, pytest.approx(KEPT)]


def test_status_the_results_table_and_the_research_log_speak_accuracy(store: Store):
    view = view_of(store)
    line = main_line(view)
    gain = statistics.fmean(C_RUNS) - statistics.fmean(A_RUNS)
    assert line is not None and line.startswith(f"main ccccccc: accuracy {statistics.fmean(C_RUNS):.6f}")
    assert line.endswith(f"baseline {statistics.fmean(A_RUNS):.6f} ({gain:+.6f})")
    console = Console(width=200, record=True)
    console.print(results_table(view))
    console.print(runs_table(store))
    shown = console.export_text()
    assert "accuracy" in shown and "val_bpb" not in shown
    text = log_text(facts(view, now=0.0), now=0.0, limit=60_000)
    assert f"| Best accuracy | **{KEPT:.6f}** (experiment 1) |" in text
    assert f"| Gain over the first baseline | {KEPT - statistics.fmean(A_RUNS):+.6f}" in text
    assert "| Experiment | Change | accuracy |" in text and "val_bpb" not in text
