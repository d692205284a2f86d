"""Loop settings a human writes in program.md's front matter, validated with clear errors.

program.md may start with a YAML block between two `---` lines holding an `autoresearch:` map:

    ---
    autoresearch:
      task: training           # what is edited and measured (runner.tasks): training, query-latency,
                               # ticket-routing; one per repository, fixed when its loop first starts
      max_experiments: 50      # stop proposing after this many experiments (0: no limit)
      target_val_bpb: 0.95     # training: stop once main reaches this val_bpb or lower
      target: 0.9              # any task: stop once main reaches this, in the metric's units, or
                               # is past it in the metric's direction (one of the two targets)
      first_baseline_runs: 6   # measurements of the first main: the noise estimate starts here
      baseline_runs: 2         # measurements of every later main (after a keep)
      noise_sigmas: 2.5        # a single run must beat main by this many standard errors (Student-t)
      confirm_sigmas: 2.1      # ... or, after a confirmation run, by this many
      confirm_below: 1.25      # a single run this many standard errors better gets a confirmation
      min_margin: 0.0          # absolute floor on the margin, in val_bpb
      confirm: true            # borderline improvements get one confirmation run
      remeasure_below: 0.0     # a run that ended on a main a keep has moved on from is measured
                               # again on the new main only if it beat the old main by more than
                               # this many standard errors (0: by anything); the rest are discarded
                               # (one the judge would confirm or keep there is always measured again)
      simplicity_sigmas: 1.0   # a smaller train.py is kept if its runs rule out a loss of more
                               # than this many sigma (0: simpler code gets no rule of its own)
      screening: false         # training: each new candidate gets a short run (a fifth of the
                               # budget) first, and full runs only when it looks promising
      screening_sigmas: 0.0    # ... promising: its short run minus main's short runs' mean below
                               # this many short standard errors (0: better than main's at all)
      paused: false            # true: finish what runs, propose nothing new
    ---

Everything is optional; the text after the block is the agent's instructions. The file is read
from main on every tick, so a commit to program.md steers the next experiment. A front matter
that does not validate raises SettingsError; the conductor then keeps the last valid settings
and records the error. So does a `task` other than the loop's (`parse_program(text, task=...)`):
a repository holds one task, and its measurements never compare with another's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from runner.tasks import DEFAULT_TASK, TASKS, Metric, Task, get_task


class LoopSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task: str = DEFAULT_TASK
    max_experiments: int = Field(0, ge=0)
    target_val_bpb: float | None = Field(None, gt=0)  # training's target, under its metric's name
    target: float | None = None  # any task's target, in its metric's units
    first_baseline_runs: int = Field(6, ge=1, le=50)
    baseline_runs: int = Field(2, ge=1, le=20)
    noise_sigmas: float = Field(2.5, ge=0)
    confirm_sigmas: float = Field(2.1, ge=0)
    confirm_below: float = Field(1.25, ge=0)
    min_margin: float = Field(0.0, ge=0)
    confirm: bool = True
    remeasure_below: float = Field(0.0, ge=0, le=10)
    simplicity_sigmas: float = Field(1.0, ge=0)
    screening: bool = False  # bot.loop.screening; on for no profile by default (docs/benchmarks.md)
    screening_sigmas: float = Field(0.0, ge=-5, le=5)
    paused: bool = False

    @field_validator("task")
    @classmethod
    def _known_task(cls, task: str) -> str:
        if task not in TASKS:
            raise ValueError(f"unknown task {task!r}: choose one of {', '.join(sorted(TASKS))}")
        return task

    @model_validator(mode="after")
    def _one_target(self) -> LoopSettings:
        if self.target is not None and self.target_val_bpb is not None:
            raise ValueError(
                "target and target_val_bpb both set a target: keep one (target is in the metric's units, "
                "target_val_bpb is training's val_bpb)"
            )
        if self.target_val_bpb is not None and self.task != DEFAULT_TASK:
            metric = self.metric
            raise ValueError(
                f"target_val_bpb is the training task's target; for the {self.task} task write "
                f"`target: {self.target_val_bpb}` in {metric.name}'s units ({metric.unit}, {metric.direction} is better)"
            )
        return self

    @property
    def metric(self) -> Metric:
        """The task's metric: its name, unit and direction (runner.tasks)."""
        return get_task(self.task).metric

    @property
    def metric_target(self) -> float | None:
        """The target in the task's metric's units: `target`, or training's `target_val_bpb`."""
        return self.target if self.target is not None else self.target_val_bpb

    def reached_target(self, main_loss: float) -> bool:
        """Whether main, measured at `main_loss` (the judge's scale, runner.tasks.Metric.loss), is at
        the target or past it in the metric's direction; never without a target."""
        target = self.metric_target
        return target is not None and main_loss <= self.metric.loss(target)

    @model_validator(mode="after")
    def _screening_is_training(self) -> LoopSettings:
        if self.screening and self.task != DEFAULT_TASK:
            raise ValueError(
                f"screening shortens training's time budget, and the {self.task} task has none: "
                "remove `screening: true`"
            )
        return self

    @model_validator(mode="after")
    def _noise_must_be_measurable(self) -> LoopSettings:
        if not self.confirm and min(self.baseline_runs, self.first_baseline_runs) < 2:
            raise ValueError(
                "with confirm: false, every main must be measured at least twice "
                "(first_baseline_runs and baseline_runs >= 2), or nothing tells a gain from "
                "run-to-run noise and pure noise would be kept; raise them or set confirm: true"
            )
        return self


class SettingsError(ValueError):
    """program.md's front matter is malformed; the message says where and how to fix it."""


@dataclass
class Program:
    settings: LoopSettings
    instructions: str  # program.md without its front matter


def loop_task(identity: Mapping[str, str]) -> Task:
    """The task a loop runs: the one its measurement identity names (training when it names none,
    as every identity pinned before tasks)."""
    return get_task(identity.get("task", DEFAULT_TASK))


def parse_program(text: str, *, task: str | None = None) -> Program:
    """program.md's settings and instructions. `task`: the loop's task, when it runs one already;
    program.md naming another (or none, for a loop of another task than training) is refused."""
    program = _parse(text)
    if task is not None and program.settings.task != task:
        raise SettingsError(
            f"program.md names the task {program.settings.task!r}, but this repository's loop runs {task!r}: "
            f"a repository holds one task. Put `task: {task}` back in program.md's front matter, "
            f"or start a new repository (or work directory) for {program.settings.task!r}"
        )
    return program


def _parse(text: str) -> Program:
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        return Program(LoopSettings(), text)
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    except StopIteration:
        raise SettingsError(
            "program.md starts a front-matter block with '---' but never closes it: "
            "add a second '---' line after the settings"
        ) from None
    body = "\n".join(lines[end + 1 :]).lstrip("\n")
    try:
        data = yaml.safe_load("\n".join(lines[1:end])) or {}
    except yaml.YAMLError as error:
        raise SettingsError(f"program.md front matter is not valid YAML: {error}") from None
    if not isinstance(data, dict):
        raise SettingsError("program.md front matter must be a YAML map with an 'autoresearch:' key")
    unknown = set(data) - {"autoresearch"}
    if unknown:
        raise SettingsError(
            f"program.md front matter has unknown keys {sorted(map(str, unknown))}; "
            "put loop settings under 'autoresearch:'"
        )
    try:
        settings = LoopSettings.model_validate(data.get("autoresearch") or {})
    except ValidationError as error:
        problems = "; ".join(
            f"autoresearch{''.join('.' + str(part) for part in e['loc'])}: {e['msg'].removeprefix('Value error, ')}"
            for e in error.errors()
        )
        raise SettingsError(f"program.md front matter: {problems}") from None
    return Program(settings, body)
