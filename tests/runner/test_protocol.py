"""The job/result protocol with tasks: old training documents parse as training, a training document
is written as before tasks, a task's result carries its number as `value`, and check_result refuses
an answer of another task."""

from __future__ import annotations

import json
from pathlib import Path

import fake_task
import pytest

from runner.protocol import Hashes, JobSpec, ResultRefused, ResultSpec, RunnerIdentity, check_result, sha256_text

HARNESS = "h" * 16
# A job and a result as the release before tasks wrote them.
OLD_JOB = {"version": 1, "run_id": 3, "asset": "print(1)\n", "profile": "smoke", "seed": 2}
OLD_RESULT = {
    "version": 1,
    "run_id": 3,
    "status": "ok",
    "val_bpb": 1.25,
    "hashes": {"asset": sha256_text("print(1)\n"), "harness": HARNESS, "data": "d"},
    "runner": {"backend": "local"},
    "profile": "smoke",
}


@pytest.fixture
def word_count(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    return fake_task.register(monkeypatch, tmp_path)


def task_result(job: JobSpec, **fields) -> ResultSpec:
    return ResultSpec(
        task=job.task,
        run_id=job.run_id,
        hashes=Hashes(asset=job.asset_sha256, harness=HARNESS, data="d"),
        runner=RunnerIdentity(backend="local"),
        profile=job.profile,
        **{"status": "ok", "value": 7.0, **fields},
    )


def test_an_old_job_and_result_parse_as_training() -> None:
    job = JobSpec.model_validate(OLD_JOB)
    result = ResultSpec.model_validate(OLD_RESULT)
    assert job.task == result.task == "training"
    assert result.value == result.val_bpb == 1.25
    check_result(job, result, harness=HARNESS)


def test_a_training_document_is_written_as_before_tasks() -> None:
    job = JobSpec.model_validate(OLD_JOB)
    result = ResultSpec.model_validate(OLD_RESULT)
    assert "task" not in json.loads(job.model_dump_json())
    written = json.loads(result.model_dump_json())
    assert "task" not in written and "value" not in written
    assert written["val_bpb"] == 1.25
    assert ResultSpec.model_validate_json(result.model_dump_json()) == result


def test_a_training_result_may_carry_its_number_as_value_too() -> None:
    result = ResultSpec.model_validate({**OLD_RESULT, "val_bpb": None, "value": 1.5})
    assert result.val_bpb == 1.5
    with pytest.raises(ValueError, match="differ"):
        ResultSpec.model_validate({**OLD_RESULT, "value": 1.5})


def test_a_task_document_round_trips_with_its_task_and_value(word_count) -> None:
    job = JobSpec(task=word_count.name, run_id=4, asset="a b c", profile="smoke")
    assert JobSpec.model_validate_json(job.model_dump_json()) == job
    result = task_result(job)
    written = json.loads(result.model_dump_json())
    assert written["task"] == "word-count" and written["value"] == 7.0 and written["val_bpb"] is None
    assert ResultSpec.model_validate(written) == result


def test_a_task_result_cannot_carry_val_bpb(word_count) -> None:
    job = JobSpec(task=word_count.name, run_id=4, asset="a b c", profile="smoke")
    with pytest.raises(ValueError, match="as value, not val_bpb"):
        task_result(job, val_bpb=7.0)


def test_an_ok_result_must_carry_its_value(word_count) -> None:
    job = JobSpec(task=word_count.name, run_id=4, asset="a b c", profile="smoke")
    with pytest.raises(ValueError, match="must carry its value"):
        task_result(job, value=None)


def test_check_result_refuses_a_result_of_another_task(word_count) -> None:
    job = JobSpec(task=word_count.name, run_id=4, asset="a b c", profile="smoke")
    training = ResultSpec.model_validate({**OLD_RESULT, "run_id": 4, "hashes": {**OLD_RESULT["hashes"]}})
    training.hashes.asset = job.asset_sha256
    with pytest.raises(ResultRefused, match="of the training task, the job's is word-count"):
        check_result(job, training, harness=HARNESS)
    check_result(job, task_result(job), harness=HARNESS)
    with pytest.raises(ResultRefused, match="of the word-count task, the job's is training"):
        check_result(JobSpec(run_id=4, asset="a b c", profile="smoke"), task_result(job), harness=HARNESS)


def test_a_task_summary_block_names_its_metric(word_count) -> None:
    job = JobSpec(task=word_count.name, run_id=4, asset="a b c", profile="smoke")
    block = task_result(job).summary_block()
    assert block.splitlines()[:2] == ["---", "words:              7.000000"]
    failed = task_result(job, status="rejected", value=None, error="refused by the gate\nmore").summary_block()
    assert "status:" in failed and "refused by the gate" in failed and "words:" not in failed


def test_the_training_summary_block_is_unchanged() -> None:
    result = ResultSpec.model_validate({**OLD_RESULT, "metrics": {"num_steps": 12}})
    assert result.summary_block().splitlines() == [
        "---",
        "val_bpb:          1.250000",
        "training_seconds: 0.0",
        "total_seconds:    0.0",
        "num_steps:        12",
    ]


def test_a_full_budget_document_is_written_without_the_fraction() -> None:
    job = JobSpec.model_validate(OLD_JOB)
    result = ResultSpec.model_validate(OLD_RESULT)
    assert job.budget_fraction == result.budget_fraction == 1.0
    assert "budget_fraction" not in json.loads(job.model_dump_json())
    assert "budget_fraction" not in json.loads(result.model_dump_json())


def test_a_short_job_round_trips_its_fraction_and_its_result_must_name_it() -> None:
    job = JobSpec.model_validate({**OLD_JOB, "budget_fraction": 0.2})
    assert JobSpec.model_validate_json(job.model_dump_json()).budget_fraction == 0.2
    short = ResultSpec.model_validate({**OLD_RESULT, "budget_fraction": 0.2})
    check_result(job, short, harness=HARNESS)
    with pytest.raises(ResultRefused, match="ran 1 of the budget, the job asked 0.2"):
        check_result(job, ResultSpec.model_validate(OLD_RESULT), harness=HARNESS)


@pytest.mark.parametrize("fraction", [0.0, -0.5, 1.5])
def test_a_budget_fraction_outside_zero_to_one_is_refused(fraction: float) -> None:
    with pytest.raises(ValueError, match="budget_fraction"):
        JobSpec.model_validate({**OLD_JOB, "budget_fraction": fraction})


def test_only_training_has_a_budget_to_shorten(word_count) -> None:
    with pytest.raises(ValueError, match="has no time budget to shorten"):
        JobSpec(task=word_count.name, run_id=4, asset="a b c", profile="smoke", budget_fraction=0.5)
