"""The bot's side of the protocol for tasks: a job carries its task to the runner, and a task's
result comes back with its value, as its loss, where the conductor reads a run's number
(RunResult.val_bpb)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import fake_task
import pytest

from bot.core.records import Job
from bot.runners.specs import checked_result, finished_status, job_spec, run_result
from runner.profiles import harness_hash
from runner.protocol import Hashes, ResultSpec, RunnerIdentity
from runner.tasks import TASKS, Metric
from runner.tasks.run import run_task_job


def test_a_training_job_is_sent_as_before_tasks() -> None:
    spec = job_spec(Job(run_id=1, asset="print(1)\n", profile="smoke", seed=0))
    assert spec.task == "training" and "task" not in spec.model_dump_json()


def test_a_task_job_and_its_result_carry_the_task_and_its_value(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake_task.register(monkeypatch, tmp_path / "cache")
    fake_task.prepare("smoke")
    spec = job_spec(Job(run_id=2, asset="a b c d\n", profile="smoke", seed=1, task="word-count"))
    assert spec.task == "word-count"
    result = checked_result(spec, run_task_job(spec, tmp_path / "run"), harness=harness_hash("word-count"))
    assert (result.status, result.val_bpb) == ("ok", 4.0)
    assert result.metrics["data_fingerprint"] == fake_task.fingerprint("smoke")


def test_a_higher_is_better_value_is_recorded_as_its_loss(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The in-edge: the store and the judge minimise, so a metric where higher is better goes in
    negated (and training's val_bpb, lower is better, as it is)."""
    task = fake_task.register(monkeypatch, tmp_path / "cache")
    monkeypatch.setitem(TASKS, task.name, replace(task, metric=Metric("words", "words", "higher", digits=1)))
    fake_task.prepare("smoke")
    spec = job_spec(Job(run_id=3, asset="a b c\n", profile="smoke", seed=1, task="word-count"))
    result = checked_result(spec, run_task_job(spec, tmp_path / "run"), harness=harness_hash("word-count"))
    assert (result.status, result.val_bpb) == ("ok", -3.0)


def test_a_task_run_that_fails_the_gate_is_recorded_rejected_with_the_reason_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake_task.register(monkeypatch, tmp_path / "cache")
    fake_task.prepare("smoke")
    spec = job_spec(Job(run_id=4, asset="please REJECT me\n", profile="smoke", seed=1, task="word-count"))
    result = checked_result(spec, run_task_job(spec, tmp_path / "run"), harness=harness_hash("word-count"))
    assert (result.status, result.val_bpb) == ("rejected", None)
    assert result.error == "the asset says REJECT, which the gate refuses"
    assert result.metrics["outcome"] == "rejected"


def test_a_task_run_whose_evaluator_raised_is_lost_carrying_the_crash_it_may_be(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """What every runner answers for it (finished_status): lost, so the conductor runs it again, with
    the crash to charge if the asset keeps making its evaluator fail (bot.loop.runs)."""
    fake_task.register(monkeypatch, tmp_path / "cache")
    fake_task.prepare("smoke")
    spec = job_spec(Job(run_id=6, asset="BROKEN\n", profile="smoke", seed=1, task="word-count"))
    status = finished_status(
        checked_result(spec, run_task_job(spec, tmp_path / "run"), harness=harness_hash("word-count"))
    )
    assert status.state == "lost" and "evaluator failed (RuntimeError" in (status.detail or "")
    assert status.result is not None and (status.result.status, status.result.val_bpb) == ("crash", None)
    assert status.result.metrics["outcome"] == "lost"


@pytest.mark.parametrize(
    ("outcome", "status", "error"),
    [
        ("rejected", "rejected", "trained past the budget"),  # training's harness refused it a number
        ("timeout", "crash", "timed out: trained past the budget"),  # a timeout stays a crash of its train.py
        ("crash", "crash", "trained past the budget"),
    ],
)
def test_a_training_run_refused_by_its_harness_is_rejected_and_a_timed_out_one_a_crash(
    outcome: str, status: str, error: str
) -> None:
    spec = ResultSpec(
        run_id=5,
        status=outcome,
        error="trained past the budget",
        hashes=Hashes(asset="a" * 64, harness="h", data="d"),
        runner=RunnerIdentity(backend="local"),
    )
    result = run_result(spec)
    assert (result.status, result.error, result.val_bpb) == (status, error, None)
    assert result.metrics["outcome"] == outcome
