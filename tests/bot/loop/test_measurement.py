"""Which runs count, main's value, the noise, the margin now and the loop's baseline: the pure rules
the conductor decides by and every view shows."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

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
