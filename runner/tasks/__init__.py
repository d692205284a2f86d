"""Tasks: what the loop edits and how it is measured.

The loop's three primitives are one editable asset, one scalar metric and a fixed evaluation.
A `Task` names them: the asset's path in the research repository, the `Metric` (its name, unit and
direction) and the module that prepares the task's fixed inputs and evaluates an asset. Training a
language model (`train.py`, val_bpb, lower is better) is one task and the default; the others are
registered in `TASKS` beside it.

Training keeps its own path, runner.isolated (train in one sandbox, score in another); every other
task's evaluator module (`Task.evaluator`, imported only when a run needs it) declares the profiles
it measures under, `PROFILES: tuple[str, ...]` (a loop or a run under another is refused, naming
them: runner.profiles.check_task_profile), and offers three functions:

    prepare(profile: str, *, progress: bool = False) -> str
        Make the task's fixed inputs (a generated database, a downloaded labelled set) once,
        deterministically, in the cache (runner.data.cache_dir()); later calls find them and do
        no work. Returns their fingerprint (a sha256 the results carry, as training's data does).

    fingerprint(profile: str) -> str
        The prepared inputs' fingerprint, doing no work: what a run's result and the loop's pinned
        identity carry. Raises runner.data.DataMissing, naming `autoresearch prepare --task T
        --profile P`, when they are not prepared (or not whole).

    evaluate(asset: str, profile: str, seed: int, workdir: Path) -> Evaluation
        Measure one asset text under one profile. The asset never reports its own number: a
        trusted process measures it, any code of the asset runs sandboxed (runner.sandbox) with
        only what the task allows it to see, and a correctness gate runs before the metric. An
        asset that fails the gate, or reaches for what it may not, is `rejected` with the reason.
        `workdir` is a private directory for the run's files; the function must not raise for a
        bad asset (only for a broken machine: missing prepared inputs raise runner.data.DataMissing).

An evaluator that can measure a data source the user names (ticket routing: a CSV or JSONL file,
or a URL pinned by its sha256) says what it accepts in `DATA_SOURCES: str` and takes a keyword
`data: str | None = None` on all three functions (the CLI's --data); one that cannot is refused a
data source.

Profiles name a scale: "smoke" is small and fast (tests, a first try), "cpu" is the task's real
size on one machine. Tasks other than training define what each means in their module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

Direction = Literal["lower", "higher"]
Scale = Literal["linear", "log"]
LOG_FLOOR = 1e-9  # the smallest value a log-scale metric is taken to have (a latency of 0 is a timer's rounding)
# "lost": the evaluator itself failed, most likely the machine's fault, not the asset's: the run runs
# again, and is charged as the asset's crash only the second time in a row (bot.loop.runs, MAX_KILLED_RUNS)
EvaluationStatus = Literal["ok", "crash", "timeout", "rejected", "lost"]


@dataclass(frozen=True)
class Metric:
    """A task's number: its name, unit and direction, and the scale the judge compares it on.

    The store and the judge work on the metric's loss, the scale where lower is better and a
    difference means the same wherever it is measured: the metric itself (val_bpb), its negation
    (accuracy, higher is better), or for a metric whose noise grows with it (a latency: a 2 s query
    spreads by hundreds of milliseconds, a 20 ms one by a few) its logarithm, so that a change is
    judged by its ratio and main's noise pooled over a slow and a fast main means one thing.
    `loss` and `value` convert between the two; `change` and `format_change` say what a difference
    of losses is on the metric's own terms (a difference in its units, or a relative change)."""

    name: str  # "val_bpb", "p95_ms", "accuracy": the check's and the tables' name for the number
    unit: str  # in words, for texts: "bits per byte", "milliseconds", "fraction correct"
    direction: Direction
    digits: int = 4  # decimals shown
    scale: Scale = "linear"  # "log": the judge compares logarithms (ratios), see above

    @property
    def lower_is_better(self) -> bool:
        return self.direction == "lower"

    @property
    def relative(self) -> bool:
        return self.scale == "log"

    def loss(self, value: float) -> float:
        """The value on the scale the judge minimises."""
        if self.relative:
            value = math.log(max(value, LOG_FLOOR))
        return value if self.lower_is_better else -value

    def value(self, loss: float) -> float:
        """The metric's value of a loss: `loss` undone."""
        plain = loss if self.lower_is_better else -loss
        return math.exp(plain) if self.relative else plain + 0.0  # + 0.0: never a -0.0 that prints "-0.00"

    def change(self, delta: float) -> float:
        """A difference of losses (a candidate's minus main's) on the metric's terms: its change in the
        metric's units, or, on a log scale, its relative change (-0.5: half main's value)."""
        plain = delta if self.lower_is_better else -delta
        return math.expm1(plain) if self.relative else plain + 0.0

    def format(self, value: float) -> str:
        return f"{value:.{self.digits}f}"

    def format_change(self, delta: float, digits: int | None = None) -> str:
        """A difference of losses, signed, as people read it: "+0.0163" or "-98.6%"."""
        if self.relative:
            return f"{100 * self.change(delta):+.1f}%"
        return f"{self.change(delta):+.{self.digits if digits is None else digits}f}"

    def format_margin(self, margin: float, digits: int | None = None) -> str:
        """A margin (a magnitude on the loss scale), as people read it: "0.0104", or on a log scale the
        relative gain it asks of a candidate ("29.3%": a p95 at least 29.3% below main's), the words
        the judge's reasons use."""
        if self.relative:
            return f"{100 * abs(self.change(-margin)):.1f}%"
        return f"{margin:.{self.digits if digits is None else digits}f}"


@dataclass(frozen=True)
class Task:
    name: str  # "training", "query-latency", "ticket-routing": program.md's `task:` and the CLI's --task
    asset: str  # the editable file's path in the research repository
    metric: Metric
    evaluator: str  # the module with prepare() and evaluate()
    summary: str  # one line: what is edited, what is measured
    # Runs under one seed share their evaluation's random draw whatever the asset (ticket routing's
    # hold-out is drawn from the seed), so a candidate is compared with main seed for seed. Training's
    # runs share a seed's draw only where the model keeps main's parameters (the scorer says which).
    seed_pairs: bool = False


@dataclass
class Evaluation:
    """What evaluating one asset found. Only `value` of an ok evaluation ever decides anything."""

    status: EvaluationStatus
    value: float | None = None
    error: str | None = None  # why, for anything but ok: the gate's reason for a rejection
    metrics: dict[str, Any] = field(default_factory=dict)  # informational: rows, batches, percentiles...
    setup_s: float = 0.0  # wall seconds before measuring (copying the database, starting the sandbox)
    evaluation_s: float = 0.0  # wall seconds measuring
    sandboxed: bool = False
    log_tail: str = ""  # the end of what the asset's process printed, for the person reading the run

    def __post_init__(self) -> None:
        if self.status == "ok" and self.value is None:
            raise ValueError("an ok evaluation must carry its value")
        if self.status != "ok" and not self.error:
            raise ValueError(f"a {self.status} evaluation must say why (error)")


TRAINING = Task(
    name="training",
    asset="train.py",
    metric=Metric("val_bpb", "bits per byte", "lower", digits=4),
    evaluator="runner.isolated",
    summary="train a small language model for a fixed time budget; validation bits per byte",
)
QUERY_LATENCY = Task(
    name="query-latency",
    asset="query.sql",
    metric=Metric("p95_ms", "milliseconds", "lower", digits=2, scale="log"),
    evaluator="runner.tasks.query_latency",
    summary="make a slow SQL query fast; p95 latency over repeated executions, same rows as the reference",
)
TICKET_ROUTING = Task(
    name="ticket-routing",
    asset="router.py",
    metric=Metric("accuracy", "fraction of hold-out tickets routed to their queue", "higher", digits=4),
    evaluator="runner.tasks.ticket_routing",
    summary="route support tickets to queues; accuracy on a hold-out set the router never sees labelled",
    seed_pairs=True,
)
TASKS: dict[str, Task] = {task.name: task for task in (TRAINING, QUERY_LATENCY, TICKET_ROUTING)}
DEFAULT_TASK = TRAINING.name


def get_task(name: str) -> Task:
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}: choose one of {', '.join(sorted(TASKS))}") from None
