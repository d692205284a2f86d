"""The job/result protocol every runner speaks: the local subprocess, GitHub Actions, Modal.

A `JobSpec` goes to a runner and a `ResultSpec` comes back, as JSON, with a version field: a
runner on another machine may run another release. The run itself always goes through
`runner.isolated` (sandboxed training, evaluation in a process that never ran train.py; or, for a
task other than training, the task's evaluator: runner.tasks.run), so every backend measures the
same way; a backend only carries the two documents.

Both documents name their task (runner.tasks: "training" by default). A result's number is
`value`, the task's metric measured by the harness (val_bpb, p95_ms, accuracy...). A training
result also carries it as `val_bpb`, its old name, and a training document is written without
`task` and `value`, exactly as before tasks: a job or result of the previous release parses as
training, and one of this release reads in the previous one. The bot keeps the name val_bpb past
this boundary (bot.runners.specs): RunResult.val_bpb and the store's column hold the task's
value, whatever its metric.

A job may ask for a fraction of the profile's budget (`budget_fraction`, in (0, 1]: a screening
run, issue 20): the harness trains that share of `time_budget_s`, the cap scaling with it, and the
result names the fraction it ran. A short run's value is a different measurement from a full one's
and is never compared with it. A document at the full budget is written without the field, as
before it: a runner of the previous release reads it.

`check_result` is what the bot does with an answer before it believes it: the result must name
the job's run id and task, the sha256 of the job's asset and the harness the bot runs, or it is
refused (`ResultRefused`), whatever number it carries.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from runner.tasks import DEFAULT_TASK, TASKS

PROTOCOL_VERSION = 1
FULL_BUDGET = 1.0  # budget_fraction of an ordinary run: the profile's whole time budget
STATUSES = ("ok", "crash", "timeout", "rejected", "lost")


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class ResultRefused(ValueError):
    """A result that does not answer its job (another run, task, asset or harness)."""


class JobSpec(BaseModel):
    """One time-boxed run of one asset (train.py for training) under one profile."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = PROTOCOL_VERSION
    task: str = Field(DEFAULT_TASK, min_length=1)  # runner.tasks: what the asset is and how it is measured
    experiment_id: int | None = None  # None for a baseline run of main
    run_id: int = Field(ge=0)
    repository: str = ""  # owner/name, or "" for a local work directory
    commit: str = ""  # the commit the asset was read from
    asset: str  # the asset's text (train.py for training)
    asset_sha256: str = ""  # filled in from the asset when left empty
    profile: str
    seed: int = 0
    budget_fraction: float = Field(FULL_BUDGET, gt=0.0, le=1.0)  # of the profile's time budget (a screening run)

    @model_validator(mode="before")
    @classmethod
    def _hash_asset(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("asset_sha256") and isinstance(data.get("asset"), str):
            data = dict(data, asset_sha256=sha256_text(data["asset"]))
        return data

    @model_validator(mode="after")
    def _asset_matches(self) -> JobSpec:
        if sha256_text(self.asset) != self.asset_sha256:
            raise ValueError("asset_sha256 is not the sha256 of asset: the job was changed in transit")
        if self.budget_fraction != FULL_BUDGET and self.task != DEFAULT_TASK:
            raise ValueError(
                f"the {self.task} task has no time budget to shorten: give it budget_fraction 1 "
                f"(a short run is training's, not {self.budget_fraction})"
            )
        return self

    @model_serializer(mode="wrap")
    def _as_before_tasks(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_full_budget(_without_training_task(handler(self), self.task))


class Timings(BaseModel):
    """Seconds, measured by the supervisor outside the sandbox (never by train.py)."""

    model_config = ConfigDict(extra="forbid")

    queued: float | None = None  # dispatch to start: the backend's queue (Actions, Modal), when known
    sandbox_setup: float = 0.0  # supervisor start to the training process's first instruction
    startup: float = 0.0  # training process start to its first timed step (imports, data, compile)
    training: float = 0.0  # the training process on the profile's clock (wall, or CPU / threads)
    training_wall: float = 0.0  # the training process, wall clock
    export: float = 0.0  # serialising the model, inside the training process (its own claim)
    evaluation: float = 0.0  # the scoring process, wall clock: load, causality probe, val_bpb
    probe: float = 0.0  # of which the causality probe
    total: float = 0.0  # supervisor start to result


class Hashes(BaseModel):
    model_config = ConfigDict(extra="forbid")

    asset: str  # sha256 of the asset that ran
    harness: str  # runner.profiles.harness_hash() of the code that measured
    data: str  # the prepared data's (a task's fixed inputs') fingerprint ("" when the run never got to them)


class RunnerIdentity(BaseModel):
    model_config = ConfigDict(extra="forbid")

    backend: str  # local | actions | modal | manual
    host: str = ""
    device: str = ""  # cpu, or the GPU's name
    sandbox: str = "none"  # "bubblewrap 0.8.0", or "none" (see sandboxed)
    detail: str = ""  # a backend's own reference: an Actions run URL, a Modal call id


class ResultSpec(BaseModel):
    """What a run produced. Only `value` from a result whose status is ok ever decides a merge."""

    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = PROTOCOL_VERSION
    task: str = Field(DEFAULT_TASK, min_length=1)
    run_id: int
    experiment_id: int | None = None
    # lost: a failure the run's code cannot be shown to have caused (killed from outside the run, not by its
    # limits; its task's evaluator raised): it runs again, and is charged as a crash only the second time in a row
    status: Literal["ok", "crash", "timeout", "rejected", "lost"]
    value: float | None = None  # the task's metric, measured by the harness
    val_bpb: float | None = None  # training's value under its own name (None for any other task)
    error: str | None = None  # why, for anything but ok
    metrics: dict[str, Any] = Field(default_factory=dict)  # steps, tokens, MFU, memory... (train.py's claims)
    log_tail: str = ""
    timings: Timings = Field(default_factory=Timings)
    hashes: Hashes
    runner: RunnerIdentity
    sandboxed: bool = False
    profile: str = ""
    seed: int = 0
    budget_fraction: float = Field(FULL_BUDGET, gt=0.0, le=1.0)  # the share of the budget it ran (the job's)

    def summary_block(self) -> str:
        """The reference's summary block, written after scoring: `grep "^val_bpb:" run.log` finds
        the scorer's number (another task's: its metric's name, `grep "^p95_ms:"`), and finds
        nothing when the run was not measured (as the reference's does after a crash). Training
        time is the supervisor's measurement; steps, tokens, memory and MFU are what train.py claims."""
        if self.task != DEFAULT_TASK:
            return self._task_summary_block()
        claims = self.metrics
        lines = ["---", self._score_line("val_bpb")]
        lines += [
            f"training_seconds: {float(claims.get('training_seconds') or self.timings.training):.1f}",
            f"total_seconds:    {self.timings.total:.1f}",
        ]
        for key, label, digits in (
            ("peak_vram_mb", "peak_vram_mb:    ", 1),
            ("mfu_percent", "mfu_percent:     ", 2),
            ("total_tokens_M", "total_tokens_M:  ", 1),
            ("num_steps", "num_steps:       ", 0),
            ("num_params_M", "num_params_M:    ", 1),
        ):
            value = claims.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                lines.append(f"{label} {value:.{digits}f}")
        depth = (claims.get("extra") or {}).get("depth") if isinstance(claims.get("extra"), dict) else None
        if depth is not None:
            lines.append(f"depth:            {depth}")
        return "\n".join(lines)

    def _task_summary_block(self) -> str:
        """A task's summary block: its metric's line, then the evaluator's and the run's seconds."""
        name = TASKS[self.task].metric.name if self.task in TASKS else "value"
        width = max(len(name), len("evaluation_seconds")) + 2
        return "\n".join(
            [
                "---",
                self._score_line(name, width),
                f"{'evaluation_seconds:':<{width}}{self.timings.evaluation:.1f}",
                f"{'total_seconds:':<{width}}{self.timings.total:.1f}",
            ]
        )

    def _score_line(self, name: str, width: int = 18) -> str:
        if self.status == "ok" and self.value is not None:
            return f"{name + ':':<{width}}{self.value:.6f}"
        why = (self.error or "").splitlines()[0][:200] if self.error else ""
        return f"{'status:':<{width}}{self.status} ({why})"

    @model_validator(mode="before")
    @classmethod
    def _value_is_val_bpb_for_training(cls, data: Any) -> Any:
        """A training result's value and val_bpb are one number: a result of the previous release
        carries val_bpb only. Any other task's result carries value only."""
        if not isinstance(data, dict):
            return data
        value, val_bpb = data.get("value"), data.get("val_bpb")
        if data.get("task", DEFAULT_TASK) != DEFAULT_TASK:
            if val_bpb is not None:
                raise ValueError(f"a {data['task']} result carries its number as value, not val_bpb")
            return data
        if value is not None and val_bpb is not None and float(value) != float(val_bpb):
            raise ValueError(f"a training result's value ({value}) and val_bpb ({val_bpb}) differ")
        number = value if value is not None else val_bpb
        return dict(data, value=number, val_bpb=number)

    @model_validator(mode="after")
    def _number_only_when_ok(self) -> ResultSpec:
        if self.status == "ok" and self.value is None:
            raise ValueError(
                f"an ok result must carry its value ({'val_bpb' if self.task == DEFAULT_TASK else 'value'})"
            )
        if self.status != "ok" and not self.error:
            raise ValueError(f"a {self.status} result must say why (error)")
        return self

    @model_serializer(mode="wrap")
    def _as_before_tasks(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = _without_full_budget(_without_training_task(handler(self), self.task))
        if self.task == DEFAULT_TASK:
            data.pop("value", None)  # val_bpb says it
        return data


def _without_training_task(data: dict[str, Any], task: str) -> dict[str, Any]:
    """A training document as the previous release wrote it: without `task`, which it did not know."""
    if task == DEFAULT_TASK:
        data.pop("task", None)
    return data


def _without_full_budget(data: dict[str, Any]) -> dict[str, Any]:
    """A full-budget document as the previous release wrote it: without `budget_fraction`."""
    if data.get("budget_fraction") == FULL_BUDGET:
        data.pop("budget_fraction")
    return data


def check_result(job: JobSpec, result: ResultSpec, *, harness: str) -> None:
    """Raise ResultRefused unless `result` answers `job`, measured by the harness `harness`."""
    if result.run_id != job.run_id:
        raise ResultRefused(f"the result is for run {result.run_id}, not run {job.run_id}")
    if result.task != job.task:
        raise ResultRefused(f"run {job.run_id}: the result is of the {result.task} task, the job's is {job.task}")
    if result.hashes.asset != job.asset_sha256:
        what = "train.py" if job.task == DEFAULT_TASK else f"{job.task} asset"
        raise ResultRefused(
            f"run {job.run_id}: the result measured another {what} (asset sha256 "
            f"{result.hashes.asset[:12]}, the job's is {job.asset_sha256[:12]})"
        )
    if result.hashes.harness != harness:
        raise ResultRefused(
            f"run {job.run_id}: the result was measured by harness {result.hashes.harness}, "
            f"not this bot's {harness}: update the runner to the bot's version"
        )
    if result.profile and result.profile != job.profile:
        raise ResultRefused(f"run {job.run_id}: the result ran profile {result.profile}, not {job.profile}")
    if result.budget_fraction != job.budget_fraction:
        raise ResultRefused(
            f"run {job.run_id}: the result ran {result.budget_fraction:g} of the budget, the job asked "
            f"{job.budget_fraction:g}: update the runner to the bot's version"
        )
