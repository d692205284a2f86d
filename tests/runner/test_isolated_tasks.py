"""The isolated run of a task other than training: run_job (and a warm worker) hand the job to its
task's evaluator (runner.tasks.run) and turn the Evaluation into a ResultSpec. On the word-count
task of tests/fake_task.py: fast, no sandbox or torch needed; a named data source on the
ticket-routing task's own evaluator."""

from __future__ import annotations

import json
from pathlib import Path

import fake_task
import pytest

from runner.isolated import Supervisor, run_job
from runner.profiles import harness_hash
from runner.protocol import JobSpec, ResultSpec, check_result
from runner.tasks import ticket_routing
from runner.tasks.run import prepare_task, task_identity


@pytest.fixture
def word_count(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    task = fake_task.register(monkeypatch, tmp_path / "cache")
    fake_task.prepare("smoke")
    return task


def job(asset: str, task: str = "word-count") -> JobSpec:
    return JobSpec(task=task, run_id=7, experiment_id=2, asset=asset, profile="smoke", seed=3)


def test_an_ok_evaluation_becomes_a_result_that_answers_its_job(word_count, tmp_path: Path) -> None:
    spec = job("one two three\n")
    lines: list[str] = []
    result = run_job(spec, tmp_path / "run", backend="local", threads=2, data=None, on_line=lines.append)
    assert (result.status, result.value, result.val_bpb, result.task) == ("ok", 3.0, None, "word-count")
    assert result.hashes.asset == spec.asset_sha256
    assert result.hashes.data == fake_task.fingerprint("smoke")
    assert result.hashes.harness == harness_hash("word-count") != harness_hash()
    assert result.sandboxed and result.metrics["seed"] == 3
    assert (result.timings.sandbox_setup, result.timings.evaluation) == (0.01, 0.02)
    check_result(spec, result, harness=harness_hash("word-count"))
    written = ResultSpec.model_validate_json((tmp_path / "run" / "result.json").read_text())
    assert written == result
    log = (tmp_path / "run" / "log.txt").read_text()
    assert "counted 3 words" in log and "\nwords:              3.000000\n" in log
    assert lines == ["counted 3 words"]
    assert (tmp_path / "run" / "work" / "seen.txt").read_text() == "one two three\n"


def test_a_rejected_asset_is_rejected_with_the_gates_reason(word_count, tmp_path: Path) -> None:
    result = run_job(job("please REJECT me"), tmp_path / "run")
    assert (result.status, result.value) == ("rejected", None)
    assert "the gate refuses" in (result.error or "")


def test_a_crashing_asset_is_a_crash_with_its_output(word_count, tmp_path: Path) -> None:
    result = run_job(job("CRASH"), tmp_path / "run")
    assert result.status == "crash" and result.error == "the asset crashed"
    assert "Traceback: CRASH" in result.log_tail


def test_a_failing_evaluator_loses_the_run_and_blames_the_machine(word_count, tmp_path: Path) -> None:
    """The evaluator raising is this machine's fault, not the asset's: the run is lost (it runs
    again) rather than a crash that would end its experiment."""
    result = run_job(job("BROKEN"), tmp_path / "run")
    assert (result.status, result.value) == ("lost", None)
    assert "word-count evaluator failed (RuntimeError" in (result.error or "")
    assert "the run is lost and runs again (a second time in a row" in (result.error or "")
    assert ResultSpec.model_validate_json((tmp_path / "run" / "result.json").read_text()).status == "lost"


def test_missing_inputs_say_how_to_prepare_them(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_task.register(monkeypatch, tmp_path / "empty-cache")
    result = run_job(job("one"), tmp_path / "run")
    assert result.status == "crash" and result.hashes.data == ""
    assert "autoresearch prepare --task word-count --profile smoke" in (result.error or "")


def test_an_unknown_task_is_a_crash_that_names_the_choices(tmp_path: Path) -> None:
    result = run_job(job("one", task="no-such-task"), tmp_path / "run")
    assert result.status == "crash"
    assert "unknown task 'no-such-task'" in (result.error or "") and "training" in (result.error or "")


def test_a_line_the_asset_prints_like_the_score_is_marked_as_its_claim(
    word_count, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = fake_task.evaluate

    def boasting(asset, profile, seed, workdir):
        evaluation = original(asset, profile, seed, workdir)
        evaluation.log_tail = "words: 0.0\n"
        return evaluation

    monkeypatch.setattr(fake_task, "evaluate", boasting)
    log = run_job(job("a b"), tmp_path / "run").log_tail
    assert "(the asset printed) words: 0.0" in log
    assert [line for line in log.splitlines() if line.startswith("words:")] == ["words:              2.000000"]


def test_a_warm_training_worker_hands_a_task_job_to_its_evaluator(word_count, tmp_path: Path) -> None:
    worker = Supervisor(tmp_path / "standby", "smoke", backend="local")  # never prepared: no process to start
    (tmp_path / "standby").mkdir()
    moved = tmp_path / "run"
    (tmp_path / "standby").rename(moved)
    result = worker.run(job("one two"), out=moved, detail="call-1")
    assert (result.status, result.value, result.runner.detail) == ("ok", 2.0, "call-1")
    assert json.loads((moved / "result.json").read_text())["value"] == 2.0


def test_a_profile_the_task_has_not_is_refused_naming_the_ones_it_has(word_count, tmp_path: Path) -> None:
    for step in (prepare_task, task_identity):
        with pytest.raises(
            ValueError, match="the query-latency task has no h100 profile .*: it measures under smoke or cpu"
        ):
            step("query-latency", "h100")
    result = run_job(JobSpec(task="word-count", run_id=1, asset="one", profile="h100"), tmp_path / "run")
    assert result.status == "crash" and result.hashes.data == ""
    assert (result.error or "").startswith("the word-count task has no h100 profile (that one is training's)")


def test_a_data_source_for_a_task_that_takes_none_is_refused(word_count, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="the word-count task takes no data source"):
        prepare_task("word-count", "smoke", data="tickets.csv")
    result = run_job(job("one"), tmp_path / "run", data="tickets.csv")
    assert result.status == "crash" and "takes no data source (--data)" in (result.error or "")


def test_a_named_data_source_reaches_the_evaluator_cold_and_warm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The user's tickets (a CSV written here: three queues of six invented tickets) are prepared,
    pinned by their fingerprint and measured by run_job and by a warm worker given --data."""
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path / "cache"))
    own = tmp_path / "own.csv"
    queues = ("card_arrival", "refund", "change_address")
    own.write_text("text,category\n" + "".join(f"ticket {n} about {q},{q}\n" for q in queues for n in range(6)))
    fingerprint = prepare_task("ticket-routing", "smoke", data=str(own))
    assert task_identity("ticket-routing", "smoke", data=str(own))["data_fingerprint"] == fingerprint
    starter = (Path(ticket_routing.__file__).parent / "router.py").read_text()
    spec = JobSpec(task="ticket-routing", run_id=4, asset=starter, profile="smoke", seed=1)
    cold = run_job(spec, tmp_path / "cold", data=str(own))
    worker = Supervisor(tmp_path / "warm", "smoke", backend="local", data=str(own))
    warm = worker.run(spec)
    for result in (cold, warm):
        assert result.status == "ok", result.error
        assert result.hashes.data == fingerprint and result.metrics["holdout_tickets"] == 3
