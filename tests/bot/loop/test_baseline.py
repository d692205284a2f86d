"""Main's baseline as the loop keeps it: the pooled noise computed once per change of the values,
main measured again in place of a run set aside as an outlier, and afresh when its runs drift, each
recorded as an event a person can read."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bot.core.states import RunState
from bot.loop import measurement
from bot.loop.baseline import Baseline, Main
from bot.loop.program import LoopSettings
from bot.store import Store

IDENTITY = {"profile": "cpu", "harness_hash": "h1", "data_fingerprint": "d1"}
FIVE = [1.000, 1.001, 0.999, 1.0005, 0.9995]
MAIN = Main(sha="a" * 40, asset="print()", code_hash="A", instructions="", settings=LoopSettings())


class NoForge:
    """Baseline.schedule and its reads of the values never ask the forge."""


@pytest.fixture
def store(tmp_path):
    store = Store(tmp_path / "state.db")
    yield store
    store.close()


def finished(store: Store, code_hash: str, value: float, *, purpose: str = "baseline", experiment: int | None = None):
    run = store.runs.add(
        experiment_id=experiment,
        purpose=purpose,
        code_hash=code_hash,
        commit_sha="c",
        base_sha="c",
        asset="print()",
        profile="cpu",
    )
    store.runs.finish(
        run.id,
        status="ok",
        val_bpb=value,
        error=None,
        log_tail=None,
        metrics={"harness_hash": "h1", "data_fingerprint": "d1"},
    )


def queued_runs_of_main(store: Store) -> list[str]:
    """Why each run of main still queued was queued, as its event says."""
    queued = {r.id for r in store.runs.all(code_hash="A") if r.state == RunState.QUEUED}
    return [
        e["message"].split(": ", 1)[1]
        for e in store.events.all()
        if e["kind"] == "queued" and int(e["message"].split()[1]) in queued
    ]


def test_the_pooled_noise_is_computed_once_per_change_of_the_values(store, monkeypatch):
    calls = []
    pooled = measurement.noise
    monkeypatch.setattr(measurement, "noise", lambda values: calls.append(len(values)) or pooled(values))
    for value in FIVE:
        finished(store, "A", value)
    baseline = Baseline(store, NoForge(), identity=IDENTITY, profile="cpu")
    first = baseline.noise()
    assert baseline.noise() == first and baseline.main_values("A") == FIVE and baseline.main_values("B") == []
    assert calls == [5]
    finished(store, "A", 1.0)
    assert baseline.noise() == first  # no run finished as far as the baseline knows
    baseline.run_finished()
    assert baseline.noise() != first and baseline.main_values("A") == [*FIVE, 1.0]
    assert calls == [5, 6]


def test_main_is_measured_once_more_in_place_of_a_run_set_aside_as_an_outlier(store):
    for value in [*FIVE, 1.010]:
        finished(store, "A", value)
    baseline = Baseline(store, NoForge(), identity=IDENTITY, profile="cpu")
    baseline.schedule(MAIN)
    baseline.schedule(MAIN)
    assert baseline.main_values("A") == FIVE
    assert queued_runs_of_main(store) == ["measure main aaaaaaa"]  # six wanted, five count
    [event] = [e["message"] for e in store.events.all() if e["kind"] == "outlier"]
    assert "val_bpb 1.010000, worse than main's other runs" in event and "measured once more" in event


def test_an_outlier_of_a_higher_is_better_task_is_said_in_its_metric(store):
    """The runs hold accuracy's loss (its negation): the outlier is the low accuracy, said as such."""
    for accuracy in [0.800, 0.801, 0.799, 0.8005, 0.7995, 0.790]:
        finished(store, "A", -accuracy)
    baseline = Baseline(store, NoForge(), identity=dict(IDENTITY, task="ticket-routing"), profile="cpu")
    baseline.schedule(replace(MAIN, settings=LoopSettings(task="ticket-routing")))
    [event] = [e["message"] for e in store.events.all() if e["kind"] == "outlier"]
    assert "measured accuracy 0.790000, worse than main's other runs" in event


def test_a_drifting_main_is_measured_afresh_and_the_drift_is_recorded(store):
    """Main's runs beside confirmations come out lower and lower: once its recent runs are fewer than
    baseline_runs, main is measured afresh (not six times: the noise is known by then)."""
    for value in [*FIVE, 1.0]:
        finished(store, "A", value)
    position = 6
    for k in range(62):
        finished(store, f"E{k}", 1.01, purpose="candidate", experiment=k + 1)
        position += 1
        if k % 10 == 9:
            finished(store, "A", 1.0 - 0.00005 * position)
            position += 1
    for k in range(62, 72):  # the loop goes on: only main's newest run is among its last 20 runs
        finished(store, f"E{k}", 1.01, purpose="candidate", experiment=k + 1)
    baseline = Baseline(store, NoForge(), identity=IDENTITY, profile="cpu")
    found = baseline.main_runs("A")
    assert found.drift is not None and len(found.values) == 1  # one run of main among the last 20
    baseline.schedule(MAIN)
    baseline.schedule(MAIN)
    assert queued_runs_of_main(store) == ["measure main aaaaaaa afresh: its runs drift"]
    [event] = [e["message"] for e in store.events.all() if e["kind"] == "drift"]
    assert "measurement moves with time: its 12 runs drift by -0.005" in event
    assert "judged against its runs among the loop's last 20" in event
