"""Which runs count, main's value, the noise, the margin now and the loop's baseline: the pure rules
the conductor decides by and every view shows."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from bot.core.states import RunState
from bot.loop import measurement
from bot.loop.judge import JudgeConfig, margin, pooled_noise
from bot.store import Store

IDENTITY = {"profile": "cpu", "harness_hash": "h1", "data_fingerprint": "d1"}


@dataclass
class FakeRun:
    """The fields measurement reads of a run."""

    code_hash: str
    val_bpb: float | None
    purpose: str = "baseline"
    experiment_id: int | None = None
    state: str = "done"
    status: str | None = "ok"
    profile: str = "cpu"
    harness_hash: str | None = "h1"
    data_fingerprint: str | None = "d1"
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass
class FakeKept:
    meta: dict[str, Any]


def test_only_finished_ok_runs_with_a_value_under_the_identity_count():
    runs = [
        FakeRun("A", 1.0),
        FakeRun("A", None, status="crash"),
        FakeRun("A", 1.1, state="running"),
        FakeRun("A", 0.5, harness_hash="old"),
        FakeRun("E1", 0.9, purpose="candidate", experiment_id=1),
    ]
    assert measurement.counted_runs(runs, IDENTITY) == [runs[0], runs[4]]
    assert measurement.counted(runs, IDENTITY) == [("A", None, "baseline", 1.0), ("E1", 1, "candidate", 0.9)]
    assert [v.val_bpb for v in measurement.counted(runs, {})] == [1.0, 0.5, 0.9]  # nothing pinned yet: all


def test_a_cpu_run_counts_only_with_the_pinned_thread_count():
    identity = dict(IDENTITY, threads="4")
    runs = [
        FakeRun("A", 1.0, metrics={"clock": "cpu", "threads": 4}),
        FakeRun("A", 1.1, metrics={"clock": "cpu", "threads": 2}),
    ]
    assert [v.val_bpb for v in measurement.counted(runs, identity)] == [1.0]


def test_mains_value_is_its_own_runs_and_never_a_kept_experiments():
    values = measurement.counted(
        [
            FakeRun("A", 1.0),
            FakeRun("A", 1.02),
            FakeRun("B", 0.9, purpose="candidate", experiment_id=1),
            FakeRun("B", 0.95),
        ],
        IDENTITY,
    )
    assert measurement.main_values(values, "A") == [1.0, 1.02]
    assert measurement.main_values(values, "B") == [0.95]  # the kept experiment's 0.9 was selected: not main's
    assert measurement.main_value(values, "A") == pytest.approx(1.01)
    assert measurement.main_value(values, "C") is None


def test_the_first_main_is_the_first_code_measured_as_main():
    values = measurement.counted(
        [FakeRun("E", 0.9, purpose="candidate", experiment_id=1), FakeRun("A", 1.0), FakeRun("B", 0.95)], IDENTITY
    )
    assert measurement.first_main(values) == "A"
    assert measurement.is_first_main(values[:2], "A") and not measurement.is_first_main(values, "A")
    assert measurement.is_first_main([], "A") and measurement.first_main([]) is None


def test_the_noise_keeps_a_kept_experiments_runs_apart_from_its_new_mains():
    runs = [
        FakeRun("A", 1.0),
        FakeRun("A", 1.02),
        FakeRun("B", 0.9, purpose="candidate", experiment_id=1),
        FakeRun("B", 0.92, purpose="confirm", experiment_id=1),
        FakeRun("B", 0.97),
        FakeRun("B", 0.99),
    ]
    values = measurement.counted(runs, IDENTITY)
    assert measurement.noise(values) == pooled_noise([[1.0, 1.02], [0.9, 0.92], [0.97, 0.99]])
    assert measurement.noise(values[:1]) is None


def test_the_margin_now_is_the_judges_for_one_run_against_mains_runs():
    config = JudgeConfig()
    values = measurement.counted([FakeRun("A", 1.0), FakeRun("A", 1.02), FakeRun("A", 1.01)], IDENTITY)
    expected = margin(pooled_noise([[1.0, 1.02, 1.01]]), 1, 3, config)
    assert measurement.main_margin(values, "A", config) == pytest.approx(expected)
    assert measurement.main_margin(values[:1], "A", config) is None  # one run: no noise yet
    assert measurement.main_margin(values, "B", config) is None  # main B not measured yet


def test_the_baseline_is_the_first_mains_value_the_keep_was_judged_against():
    """Six runs of main, a confirmation with one more run of main beside it, the keep judged against
    the six while the seventh still ran: the baseline stays what the judge compared against."""
    six = [2.87, 2.88, 2.875, 2.885, 2.87, 2.8867]
    runs = [FakeRun("A", v) for v in six] + [
        FakeRun("E1", 2.85, purpose="candidate", experiment_id=1),
        FakeRun("E1", 2.86, purpose="confirm", experiment_id=1),
        FakeRun("A", 2.84),
    ]  # beside the confirmation, finished last
    values = measurement.counted(runs, IDENTITY)
    keep = FakeKept({"main_code": "A", "main_val_bpb": statistics.fmean(six)})
    assert measurement.baseline_value(values, [keep]) == pytest.approx(statistics.fmean(six))
    assert measurement.baseline_value(values, []) == pytest.approx(statistics.fmean([*six, 2.84]))  # still main
    assert measurement.baseline_value(values, [FakeKept({"main_code": "Z", "main_val_bpb": 1.0})]) == pytest.approx(
        statistics.fmean([*six, 2.84])
    )  # a keep of another main says nothing of this one
    assert measurement.baseline_value([], [keep]) is None


def test_the_stores_measured_values_are_the_runs_counted_under_each_identity(tmp_path):
    """store.runs.measured_values (the conductor's query) must select what counted() does of whole runs."""
    store = Store(tmp_path / "state.db")

    def finished(
        code: str,
        value: float | None,
        *,
        status: str = "ok",
        profile: str = "cpu",
        purpose: str = "baseline",
        **metrics: Any,
    ):
        run = store.runs.add(
            experiment_id=None,
            purpose=purpose,
            code_hash=code,
            commit_sha="c",
            base_sha="c",
            asset="print()",
            profile=profile,
        )
        return store.runs.finish(
            run.id,
            status=status,
            val_bpb=value,
            error=None,
            log_tail=None,
            metrics={"harness_hash": "h1", "data_fingerprint": "d1"} | metrics,
        )

    finished("A", 1.0, clock="cpu", threads=4)
    finished("A", 1.1, clock="cpu", threads=2)
    finished("A", 1.2, clock="wall")
    finished("A", 1.3)
    finished("A", None, status="crash", clock="cpu", threads=4)
    finished("A", None, clock="cpu", threads=4)  # ok without a number
    finished("A", 1.4, harness_hash="h2", clock="cpu", threads=4)
    finished("A", 1.5, data_fingerprint="d2")
    finished("A", 1.6, profile="gpu")
    finished("B", 0.9, purpose="candidate", clock="cpu", threads=4)
    disturbed = finished("A", 0.8, clock="cpu", threads=4)
    store.runs.set_aside(disturbed.id, RunState.DISTURBED, "it got a quarter of its cores", rerun=False)
    store.runs.add(
        experiment_id=None,
        purpose="baseline",
        code_hash="A",
        commit_sha="c",
        base_sha="c",
        asset="print()",
        profile="cpu",
    )  # still queued
    runs = store.runs.all()
    for identity in (
        IDENTITY,
        dict(IDENTITY, threads="4"),
        dict(IDENTITY, threads="2"),
        dict(IDENTITY, profile="gpu"),
        dict(IDENTITY, harness_hash="h2", threads="4"),
    ):
        measured = store.runs.measured_values(
            profile=identity["profile"],
            harness_hash=identity["harness_hash"],
            data_fingerprint=identity["data_fingerprint"],
            threads=measurement.pinned_threads(identity),
        )
        assert measured == measurement.counted(runs, identity), identity
    store.close()


def baseline_values(code: str, values: list[float]) -> list[measurement.Value]:
    return [measurement.Value(code, None, "baseline", v) for v in values]


FIVE = [1.000, 1.001, 0.999, 1.0005, 0.9995]  # main's runs that agree: sigma about 0.0008


def test_a_run_of_main_worse_than_the_rest_by_more_than_the_noise_allows_is_set_aside():
    values = baseline_values("A", [*FIVE, 1.010])
    found = measurement.main_runs(values, "A")
    assert found.values == FIVE and found.outlier == 1.010
    assert measurement.main_value(values, "A") == pytest.approx(statistics.fmean(FIVE))
    assert measurement.noise(values) == pooled_noise([[*FIVE, 1.010]])  # the noise keeps every run


def test_a_run_of_main_within_the_noise_or_better_than_the_rest_stays():
    """One-sided: a disturbance makes a run worse, so a better run is never set aside."""
    for last in (1.004, 0.990):
        values = baseline_values("A", [*FIVE, last])
        assert measurement.main_runs(values, "A") == measurement.MainRuns([*FIVE, last], None, None, tuple(range(6)))


def test_of_a_pair_of_main_that_disagrees_the_worse_run_is_set_aside():
    values = baseline_values("A", [*FIVE, 1.0]) + baseline_values("B", [0.990, 0.996])
    assert measurement.main_runs(values, "B") == measurement.MainRuns([0.990], 0.996, None, (6,))
    agreeing = baseline_values("A", [*FIVE, 1.0]) + baseline_values("B", [0.990, 0.991])
    assert measurement.main_values(agreeing, "B") == [0.990, 0.991]


def test_under_gaussian_noise_a_run_is_set_aside_about_one_time_in_a_thousand():
    """The test is calibrated: groups of six Gaussian runs alone (5 degrees of freedom), 20000 of
    them, flag about 6 x 0.1% of groups (standard error 0.055%)."""
    rng = np.random.default_rng(7)
    flagged = 0
    for draws in rng.standard_normal((20000, 6)):
        group = draws.tolist()
        flagged += measurement.outlier(group, pooled_noise([group])) is not None
    assert 0.003 < flagged / 20000 < 0.009  # measured 0.59%


def test_mains_runs_that_drift_with_time_are_noticed_and_only_the_recent_ones_count():
    """The first main's six runs, then a run of main beside every tenth experiment, each lower
    than the last: main is judged against its runs among the loop's last RECENT_RUNS."""
    values = baseline_values("A", [*FIVE, 1.0])
    for k in range(60):
        values.append(measurement.Value("E", k, "candidate", 1.01))
        if k % 10 == 9:
            values.append(measurement.Value("A", None, "baseline", 1.0 - 0.00005 * len(values)))
    found = measurement.main_runs(values, "A")
    assert found.drift is not None and found.drift.slope < 0 and found.drift.runs == 12
    recent = [v.val_bpb for v in values[-measurement.RECENT_RUNS :] if v.purpose == "baseline"]
    assert found.values == recent and len(recent) == 2


def test_a_drifting_main_without_a_recent_run_shows_its_latest_run_while_it_is_measured_afresh():
    """The judge gets no value (it waits for main's fresh runs), but people are shown main as last
    measured: the summary, the views and the target never lose main's value."""
    values = baseline_values("A", [*FIVE, 1.0])
    for k in range(60):
        values.append(measurement.Value("E", k, "candidate", 1.01))
        if k % 10 == 9 and k < 40:
            values.append(measurement.Value("A", None, "baseline", 1.0 - 0.00005 * len(values)))
    found = measurement.main_runs(values, "A")
    assert found.drift is not None and found.values == []
    assert measurement.main_values(values, "A") == []
    assert measurement.main_value(values, "A") == [v.val_bpb for v in values if v.purpose == "baseline"][-1]


def test_mains_runs_that_scatter_without_a_trend_all_count():
    values = baseline_values("A", [*FIVE, 1.0])
    for k in range(60):
        values.append(measurement.Value("E", k, "candidate", 1.01))
        if k % 10 == 9:
            values.append(measurement.Value("A", None, "baseline", 1.0 + (0.0008 if k % 20 == 9 else -0.0008)))
    found = measurement.main_runs(values, "A")
    assert found.drift is None and len(found.values) == 12


def test_the_drift_test_is_calibrated_on_runs_without_drift():
    """Twelve Gaussian runs of main spread over 70 runs of the loop, no drift: the trend is called
    significant in about 1% of 20000 loops (standard error 0.07%)."""
    rng = np.random.default_rng(11)
    positions = [0, 1, 2, 3, 4, 5, 15, 25, 35, 45, 55, 65]
    noticed = 0
    for draws in rng.standard_normal((20000, len(positions))):
        runs = list(zip(positions, draws.tolist(), strict=True))
        noticed += measurement.drift(runs, pooled_noise([draws.tolist()])) is not None
    assert 0.006 < noticed / 20000 < 0.015  # measured 1.09%
