"""The bot's side of the job/result protocol (runner.protocol): a conductor's `Job` becomes a
`JobSpec` for a runner, and a runner's `ResultSpec` becomes the `RunResult` the conductor records.

Every backend (local, GitHub Actions, Modal) converts here, so a result means the same wherever
it ran. A rejected run (the evaluator's gate, or training's harness: the causality probe, the
budget cap, a model the scorer refuses) is recorded as `rejected`, its error the reason; a timed-out
run is a crash of its asset, its error saying so; `metrics["outcome"]` keeps the runner's own word
either way. A run that failed by no fault its result can prove of its code (`lost`: the supervisor
found its training process killed from outside, or its task's evaluator raised) is a lost run
(`finished_status`), carrying the crash it would be charged as if that keeps happening (the
conductor decides: bot.loop.runs).

This is the in-edge of the task's metric (runner.tasks.Metric): `run_result` is the one place a
result's number becomes `RunResult.val_bpb`, and it stores `Metric.loss(value)`, the metric on the
scale where lower is better (the metric itself, or its negation for a higher-is-better one such as
accuracy). So the store's column, measurement, the baseline, the schedule and the judge minimise one
number whatever the task, and training's val_bpb goes in unchanged. The name val_bpb stays inside
(the record's field, the store's column); what people read is converted back at the out-edge, the
read model (bot.views.read_model).
"""

from __future__ import annotations

from bot.core.records import Job, RunResult, RunStatus
from runner.protocol import JobSpec, ResultRefused, ResultSpec, check_result
from runner.tasks import get_task

_ERROR_PREFIX = {"crash": "", "timeout": "timed out: ", "lost": ""}


def job_spec(job: Job, *, repository: str = "") -> JobSpec:
    return JobSpec(
        experiment_id=job.experiment_id,
        run_id=job.run_id,
        repository=repository,
        commit=job.commit,
        asset=job.asset,
        asset_sha256=job.asset_sha256,
        profile=job.profile,
        seed=job.seed,
        task=job.task,
        budget_fraction=job.budget_fraction,
    )


def run_result(spec: ResultSpec) -> RunResult:
    """The conductor's record of a result. The identity it was measured under (asset, harness,
    data, profile, seed) goes into the metrics, where the conductor checks it against the job. An ok
    result's value is recorded as its task's loss (the module docstring's in-edge)."""
    metrics = dict(
        spec.metrics,
        outcome=spec.status,
        asset_sha256=spec.hashes.asset,
        harness_hash=spec.hashes.harness,
        data_fingerprint=spec.hashes.data,
        profile=spec.profile,
        seed=spec.seed,
        budget_fraction=spec.budget_fraction,
        sandboxed=spec.sandboxed,
        runner=spec.runner.model_dump(),
        timings=spec.timings.model_dump(),
    )
    if spec.status == "ok":
        loss = get_task(spec.task).metric.loss(spec.value)  # ResultSpec: an ok result carries its value
        return RunResult(run_id=spec.run_id, status="ok", val_bpb=loss, metrics=metrics, log_tail=spec.log_tail)
    rejected = spec.status == "rejected"  # its status says so: its error is the reason alone
    return RunResult(
        run_id=spec.run_id,
        status="rejected" if rejected else "crash",
        metrics=metrics,
        log_tail=spec.log_tail,
        error=("" if rejected else _ERROR_PREFIX[spec.status]) + (spec.error or spec.status),
    )


def finished_status(result: RunResult) -> RunStatus:
    """What lookup() answers for a run that ended with `result`: finished, or lost when its result
    says so (killed from outside, an evaluator that raised: `result` is then the crash the conductor
    charges if the run's code keeps getting lost that way)."""
    if result.metrics.get("outcome") == "lost":
        return RunStatus("lost", detail=result.error or "lost by the machine it ran on", result=result)
    return RunStatus("finished", result=result)


def checked_result(job: JobSpec, spec: ResultSpec, *, harness: str) -> RunResult:
    """`run_result`, after `check_result`: raises ResultRefused for an answer to another job."""
    check_result(job, spec, harness=harness)
    return run_result(spec)


__all__ = ["ResultRefused", "checked_result", "finished_status", "job_spec", "run_result"]
