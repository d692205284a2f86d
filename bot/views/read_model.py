"""The read model: what people see of a store, computed in one place, by the loop's own rules.

`read_rows(db)` takes what is shown from one connection (the dashboard's read-only one, or a
Store's) in five queries, whatever the number of experiments; `build_view(rows, live)` is pure:
rows in, one frozen View out, with main's value, the loop's baseline, the noise margin now, each
experiment's numbers (a keep for simplicity told apart from a gain: kept_for_simplicity), the
chart's points and the agent's state. The numbers come from
bot.loop.measurement and bot.loop.judge, the functions the conductor decides with, so the
dashboard, `autoresearch status`, `autoresearch results` and results.tsv, the chart, the research
log and the demo's live display show the same baseline, margin and deltas: each of them reads a
View and computes no number of its own.

What only the conductor's process knows (its runs' latest progress, why it stopped, whether main
is blocked, the agent's budget) comes in as `live` (see Live; conductor_live builds it).

This is the out-edge of the task's metric. The store holds every number as the judge reads it, on
the loss scale (bot.runners.specs, the in-edge: the metric, or its negation where higher is
better), and build_view computes on that scale (main, the baseline, the margins, the running best);
the View hands the faces numbers on the metric's own terms, with the Metric itself (`View.metric`:
its name, unit and direction, from the loop's pinned task). Two functions convert, here and in
bot.github.render (which reads store records): `shown_value` a loss to the metric's value
(Metric.value), `shown_change` a difference of losses (a delta) to the change it means
(Metric.change: a difference in the metric's units, or on a log scale such as a latency's a relative
change, -0.5 for half main's value). A margin stays a magnitude on the loss scale: a face shows it
with Metric.format_margin, or draws it around main's value at loss +/- margin. What stays on the loss
scale: the rows (RunRow, StoreRows), the margins and `ExperimentView.experiment`, the store's record;
read an experiment's numbers through its ExperimentView.
"""

from __future__ import annotations

import json
import sqlite3
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from bot.core.records import full_budget
from bot.core.simplicity import Simplification
from bot.core.states import RunState, State, Status
from bot.loop import measurement
from bot.loop.judge import judge_config
from bot.loop.program import LoopSettings, loop_task
from bot.store import Experiment, LoopState, Store
from bot.store.runs import is_ahead
from runner.progress import last_progress
from runner.tasks import Metric, Task, get_task

EVENTS = 12  # recent events read, newest first
FROM_BASELINE_RUNS = "baseline runs"
FROM_KEPT_EXPERIMENT = "kept experiment, not re-measured yet"
_EXPERIMENT_COLUMNS = ", ".join(f.name for f in fields(Experiment) if f.name != "asset")  # train.py is heavy
_RUN_COLUMNS = (
    "id, experiment_id, purpose, code_hash, commit_sha, base_sha, state, status, val_bpb, profile, harness_hash, "
    "data_fingerprint, metrics, run_dir, started_at"
)

Live = Mapping[str, Any]
"""What the conductor's process knows beyond the store; every key optional: `progress` (run id ->
its latest progress line), `stop_reason`, `blocked`, `budget_usd` (the agent's)."""


# --- the rows ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunRow:
    """A run as the views read it: everything but its train.py, error and log."""

    id: int
    experiment_id: int | None
    purpose: str
    code_hash: str
    commit_sha: str
    base_sha: str  # the main it was measured on (bot.store.runs.is_ahead: queued ahead of a keep's merge)
    state: str
    status: str | None
    val_bpb: float | None
    profile: str
    harness_hash: str | None
    data_fingerprint: str | None
    metrics: dict[str, Any]
    run_dir: str | None
    started_at: float | None


@dataclass(frozen=True)
class LoopRow:
    """The loop's state that people see, as bot.store.LoopState reads it."""

    paused: bool
    identity: dict[str, Any]  # the measurement identity pinned ({} before the first start)
    spent_usd: float  # what the agent's answers cost so far
    program_settings: str | None  # program.md's settings as the conductor last read them (JSON)


@dataclass(frozen=True)
class EventRow:
    id: int
    at: float
    experiment_id: int | None
    kind: str
    message: str


@dataclass(frozen=True)
class StoreRows:
    loop: LoopRow
    experiments: tuple[Experiment, ...]  # in id order, without their train.py
    runs: tuple[RunRow, ...]  # in id order
    published: dict[int, dict[str, str]]  # experiment id -> what GitHub shows of it (store.published)
    events: tuple[EventRow, ...]  # the latest, newest first


def read_rows(db: sqlite3.Connection, *, events: int = EVENTS) -> StoreRows:
    """The rows a View is built from, in a few queries whatever the number of experiments; call it
    inside one read transaction for a consistent picture."""
    experiments = []
    for row in db.execute(f"SELECT {_EXPERIMENT_COLUMNS} FROM experiments ORDER BY id"):
        data = dict(zip(_EXPERIMENT_COLUMNS.split(", "), row, strict=True))
        experiments.append(Experiment(**data | {"asset": None, "meta": json.loads(data["meta"] or "{}")}))
    runs = read_runs(db)
    published: dict[int, dict[str, str]] = {}
    for exp_id, key, value in db.execute("SELECT experiment_id, key, value FROM published"):
        published.setdefault(exp_id, {})[key] = value
    latest = [
        EventRow(*row)
        for row in db.execute(
            "SELECT id, at, experiment_id, kind, message FROM events ORDER BY id DESC LIMIT ?", (events,)
        )
    ]
    return StoreRows(
        loop=read_loop(db), experiments=tuple(experiments), runs=runs, published=published, events=tuple(latest)
    )


def read_loop(db: sqlite3.Connection) -> LoopRow:
    """The loop's state, one settings row each; a spend that is no number reads as nothing spent."""
    state = LoopState(db)
    try:
        spent = state.spent_usd
    except ValueError:
        spent = 0.0
    return LoopRow(
        paused=state.paused, identity=state.identity, spent_usd=spent, program_settings=state.program_settings
    )


def read_runs(db: sqlite3.Connection, where: str = "1") -> tuple[RunRow, ...]:
    """The runs matching `where` (an SQL condition of the code's own, never a value from outside), in
    id order."""
    rows = db.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE {where} ORDER BY id")
    return tuple(
        RunRow(**data | {"metrics": json.loads(data["metrics"] or "{}")})
        for data in (dict(zip(_RUN_COLUMNS.split(", "), row, strict=True)) for row in rows)
    )


# --- the view ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KeptForSimplicity:
    """Why a keep for simplicity was kept: how much smaller it made train.py, and the loss its runs
    ruled out (bot.loop.judge's simplicity rule)."""

    smaller: Simplification
    loss_margin: float

    def words(self) -> str:
        """`kept for simplicity, 1 fewer line of code (3 fewer code tokens)`."""
        return f"kept for simplicity, {self.smaller.words()}"


def kept_for_simplicity(exp: Experiment) -> KeptForSimplicity | None:
    """What made a keep a keep for simplicity (bot.loop.lifecycle records it in the experiment's meta
    as `kept_for_simplicity`: lines, tokens, loss_margin); None for any other experiment, and for a
    record that does not read as one."""
    found = exp.meta.get("kept_for_simplicity") if exp.status == Status.KEEP else None
    if not isinstance(found, dict):
        return None
    lines, tokens, loss = found.get("lines"), found.get("tokens"), found.get("loss_margin")
    if not isinstance(lines, int) or not isinstance(tokens, int):
        return None
    if isinstance(loss, bool) or not isinstance(loss, (int, float)):
        return None
    return KeptForSimplicity(Simplification(lines=lines, tokens=tokens), float(loss))


@dataclass(frozen=True)
class MainView:
    """Main now: the latest main queued for measuring, as the judge compares against it."""

    commit: str | None
    val_bpb: (
        float | None
    )  # the metric: the mean of its own runs; until it has one, the latest keep's (flattering) number
    source: str | None  # FROM_BASELINE_RUNS | FROM_KEPT_EXPERIMENT | None
    runs: int  # its own runs behind val_bpb
    margin: float | None  # the noise margin now: what one candidate run must improve on it by


@dataclass(frozen=True)
class Baseline:
    """The loop's baseline: the first main measured under the pinned identity."""

    commit: str
    val_bpb: float  # the metric, measurement.baseline_value: as the judge last compared against it
    runs: tuple[RunRow, ...]  # its runs that count


@dataclass(frozen=True)
class ExperimentView:
    experiment: Experiment  # the store's record: its numbers on the loss scale (read them below)
    runs: tuple[RunRow, ...]  # its finished runs (ok, crash or rejected)
    in_flight: int  # its runs queued or running
    published: dict[str, str]
    metric: Metric

    @property
    def failed(self) -> bool:
        """Crashed, rejected or failed: its numbers mean nothing (as in results.tsv)."""
        return self.experiment.status in (Status.CRASH, Status.REJECTED, Status.FAILED)

    @property
    def val_bpb(self) -> float | None:
        """Its value of the metric (None when it failed)."""
        return None if self.failed else shown_value(self.metric, self.experiment.val_bpb)

    @property
    def delta(self) -> float | None:
        """Its change from main's value at the decision (shown_change)."""
        return None if self.failed else shown_change(self.metric, self.experiment.delta)

    @property
    def delta_value(self) -> float | None:
        """Its value minus main's at the decision, in the metric's units (on a linear scale the same
        as `delta`; on a log scale `delta` is relative and this says how many units that was)."""
        loss, delta = self.experiment.val_bpb, self.experiment.delta
        if self.failed or loss is None or delta is None:
            return None
        return self.metric.value(loss) - self.metric.value(loss - delta)

    @property
    def remeasured_delta(self) -> float | None:
        """The new main's fresh baseline's change from the old main's (shown_change)."""
        return shown_change(self.metric, self.experiment.remeasured_delta)

    @property
    def pull(self) -> int | None:
        number = self.published.get("pr")
        return int(number) if number and number.isdigit() else None

    @property
    def kept_for_simplicity(self) -> KeptForSimplicity | None:
        return kept_for_simplicity(self.experiment)


@dataclass(frozen=True)
class Point:
    x: int  # 0: the baseline; then the position among finished experiments
    id: int  # the experiment's id (0 for the baseline)
    title: str
    val_bpb: float  # the metric
    status: str  # "baseline", keep, discard, or cancelled (after it was measured)
    for_simplicity: bool = False  # a keep for simplicity, not for a gain


@dataclass(frozen=True)
class Mark:
    """A finished experiment without a val_bpb to draw: a crash or a failure."""

    x: int
    id: int
    title: str
    status: str


@dataclass(frozen=True)
class Chart:
    points: tuple[Point, ...]  # the baseline, then every finished experiment with a val_bpb
    crashes: tuple[Mark, ...]
    main_steps: tuple[tuple[int, float], ...]  # (x, main's metric from then on): the baseline, then each keep
    best: tuple[
        tuple[int, float], ...
    ]  # the running best's step vertices (best in the metric's direction), up to x_max
    x_max: int  # finished experiments


@dataclass(frozen=True)
class AgentView:
    state: str  # thinking | waiting | paused | stopped | blocked
    detail: str
    experiment: int | None  # the one being proposed
    budget_usd: float | None
    budget_left_usd: float | None


@dataclass(frozen=True)
class View:
    identity: dict[str, Any]
    metric: Metric  # the loop's task's: the numbers below are on its scale (the module docstring)
    main: MainView
    baseline: Baseline | None
    agent: AgentView
    counts: dict[str, int]  # finished experiments per status (each Status), and "active" (not done nor proposing)
    kept_for_simplicity: int  # of the keeps counted, those kept for simplicity
    spent_usd: float  # what the agent's answers cost so far
    running: tuple[RunRow, ...]
    queued: tuple[RunRow, ...]  # runs waiting for a slot
    experiments: tuple[ExperimentView, ...]  # in id order; a proposal in the making is none
    chart: Chart
    events: tuple[EventRow, ...]  # the latest, newest first

    @property
    def finished(self) -> list[ExperimentView]:
        return [e for e in self.experiments if e.experiment.state == State.DONE]

    def title_of(self, run: RunRow) -> str:
        found = next((e for e in self.experiments if e.experiment.id == run.experiment_id), None)
        return run_title(run, found.experiment.title if found else None)


def run_title(run: RunRow, experiment_title: str | None) -> str:
    """What a run measures, in words: its experiment's title, or main's baseline."""
    return (
        experiment_title
        if run.experiment_id is not None and experiment_title
        else f"baseline of main {run.commit_sha[:7]}"
        if not is_ahead(run.base_sha)
        else "baseline of the kept change, main once it is merged"
    )


def build_view(rows: StoreRows, live: Live | None = None) -> View:
    """What people see of `rows` (and of `live`), by the loop's rules."""
    live = live or {}
    identity = rows.loop.identity
    metric = metric_of(rows.loop)
    values = measurement.counted([r for r in rows.runs if full_budget(r.purpose)], identity)  # short runs apart
    kept = [e for e in rows.experiments if e.state == State.DONE and e.status == Status.KEEP]
    done: dict[int, list[RunRow]] = {}
    waiting: dict[int, int] = {}
    for run in rows.runs:
        if run.experiment_id is not None and run.state == RunState.DONE:
            done.setdefault(run.experiment_id, []).append(run)
        elif run.experiment_id is not None and run.state in (RunState.QUEUED, RunState.RUNNING):
            waiting[run.experiment_id] = waiting.get(run.experiment_id, 0) + 1
    experiments = tuple(
        ExperimentView(e, tuple(done.get(e.id, ())), waiting.get(e.id, 0), rows.published.get(e.id, {}), metric)
        for e in rows.experiments
        if e.state != State.PROPOSING
    )
    baseline = _baseline(rows, identity, values, kept, metric)
    counts = {s.value: 0 for s in Status}
    for e in rows.experiments:
        if e.state == State.DONE and e.status in counts:
            counts[e.status] += 1
    counts["active"] = sum(1 for e in rows.experiments if e.state not in (State.DONE, State.PROPOSING))
    spent = rows.loop.spent_usd
    return View(
        identity=identity,
        metric=metric,
        main=_main(rows, values, kept, metric),
        baseline=baseline,
        agent=_agent(rows, live, spent),
        counts=counts,
        kept_for_simplicity=sum(
            1 for e in experiments if e.experiment.state == State.DONE and e.kept_for_simplicity is not None
        ),
        spent_usd=spent,
        running=tuple(r for r in rows.runs if r.state == RunState.RUNNING),
        queued=tuple(r for r in rows.runs if r.state == RunState.QUEUED),
        experiments=experiments,
        chart=_chart(experiments, baseline, metric),
        events=rows.events,
    )


def read_view(db: sqlite3.Connection, live: Live | None = None, *, events: int = EVENTS) -> View:
    """build_view over the rows read from `db` now."""
    return build_view(read_rows(db, events=events), live)


def view_of(store: Store, live: Live | None = None, *, events: int = EVENTS) -> View:
    """The View of a Store this process holds open (its rows read through its own connection)."""
    return read_view(store.db, live, events=events)


def progress_of(run: RunRow, live: Live | None = None) -> dict[str, Any]:
    """How far a running run got, for display: the freshest (by step) of the conductor's last
    report (as old as its last tick) and the run's own progress.jsonl (a local run's, read now)."""
    reported = (live or {}).get("progress") or {}
    lines = [reported.get(run.id) or reported.get(str(run.id)), last_progress(run.run_dir) if run.run_dir else None]
    return max((x for x in lines if isinstance(x, dict)), key=lambda x: x.get("step") or -1, default={})


def shown_value(metric: Metric, loss: float | None) -> float | None:
    """A value on the judge's loss scale as the metric's value (Metric.value; never -0.0)."""
    return None if loss is None else metric.value(loss)


def shown_change(metric: Metric, delta: float | None) -> float | None:
    """A difference of losses (a candidate's minus main's) as the change it means: in the metric's
    units, or on a log scale a relative change (Metric.change; never -0.0)."""
    return None if delta is None else metric.change(delta)


def task_of(loop: LoopRow) -> Task:
    """The loop's task: the one its pinned identity names, or before it was pinned the one program.md
    names (training, as every loop before tasks)."""
    return loop_task(loop.identity) if loop.identity else get_task(loop_settings(loop).task)


def metric_of(loop: LoopRow) -> Metric:
    """The metric of the loop's task (task_of)."""
    return task_of(loop).metric


def loop_settings(loop: LoopRow) -> LoopSettings:
    """program.md's settings as the conductor last read them (the defaults before it did)."""
    if loop.program_settings is None:
        return LoopSettings()
    try:
        return LoopSettings.model_validate_json(loop.program_settings)
    except ValueError:
        return LoopSettings()


def _main(rows: StoreRows, values: list[measurement.Value], kept: list[Experiment], metric: Metric) -> MainView:
    baselines = [r for r in rows.runs if r.purpose == "baseline" and not is_ahead(r.base_sha)]  # not main's yet
    code = baselines[-1].code_hash if baselines else None
    own = measurement.main_values(values, code) if code else []
    value, source = (statistics.fmean(own), FROM_BASELINE_RUNS) if own else (None, None)
    measured = [e for e in kept if e.val_bpb is not None]
    if value is None and measured:
        value, source = measured[-1].val_bpb, FROM_KEPT_EXPERIMENT
    band = measurement.main_margin(values, code, judge_config(loop_settings(rows.loop))) if code else None
    return MainView(
        commit=baselines[-1].commit_sha if baselines else None,
        val_bpb=shown_value(metric, value),
        source=source,
        runs=len(own),
        margin=band,
    )


def _baseline(
    rows: StoreRows, identity: dict[str, Any], values: list[measurement.Value], kept: list[Experiment], metric: Metric
) -> Baseline | None:
    first = measurement.first_main(values)
    value = measurement.baseline_value(values, kept)
    if first is None or value is None:
        return None
    own = tuple(
        r for r in measurement.counted_runs(rows.runs, identity) if r.purpose == "baseline" and r.code_hash == first
    )
    return Baseline(commit=own[0].commit_sha, val_bpb=metric.value(value), runs=own)


def _agent(rows: StoreRows, live: Live, spent: float) -> AgentView:
    budget = live.get("budget_usd")
    stop, blocked = live.get("stop_reason") or "", live.get("blocked") or ""
    proposing = next((e.id for e in rows.experiments if e.state == State.PROPOSING), None)
    if blocked:
        state, detail = "blocked", blocked
    elif rows.loop.paused or stop.startswith("paused"):
        state, detail = "paused", stop or "paused: `autoresearch resume` (or /resume) lets it go on"
    elif stop:
        state, detail = "stopped", stop
    elif budget is not None and spent >= budget:
        state, detail = "stopped", f"its budget of ${budget:.2f} is spent"
    elif proposing is not None:
        state, detail = "thinking", f"proposing experiment {proposing}"
    else:
        state, detail = "waiting", "for runs to finish or a slot to free"
    return AgentView(
        state=state,
        detail=detail,
        experiment=proposing,
        budget_usd=budget,
        budget_left_usd=None if budget is None else max(0.0, budget - spent),
    )


def _chart(experiments: tuple[ExperimentView, ...], baseline: Baseline | None, metric: Metric) -> Chart:
    """x is the position among finished experiments (the baseline at 0): a measured one is a
    point, a crash, rejection or failure a mark; main steps to each keep's value; `best` is the running best,
    found on the loss scale and drawn, as every number here, on the metric's."""
    points: list[Point] = []
    crashes: list[Mark] = []
    steps: list[tuple[int, float]] = []
    best: list[tuple[int, float]] = []  # on the loss scale until the end
    if baseline is not None:
        points.append(Point(x=0, id=0, title="baseline", val_bpb=baseline.val_bpb, status="baseline"))
        steps.append((0, baseline.val_bpb))
        best.append((0, metric.loss(baseline.val_bpb)))
    x = 0
    for view in experiments:
        e = view.experiment
        if e.state != State.DONE:
            continue
        x += 1
        if view.failed:
            crashes.append(Mark(x=x, id=e.id, title=e.title, status=e.status or ""))
            continue
        if e.val_bpb is None:  # cancelled before it was measured: a place on the axis, nothing drawn
            continue
        value = metric.value(e.val_bpb)
        points.append(
            Point(
                x=x,
                id=e.id,
                title=e.title,
                val_bpb=value,
                status=e.status or "",
                for_simplicity=view.kept_for_simplicity is not None,
            )
        )
        if e.status == Status.KEEP:
            steps.append((x, value))
            if not best or e.val_bpb < best[-1][1]:
                if best:
                    best.append((x, best[-1][1]))
                best.append((x, e.val_bpb))
    if best and best[-1][0] < x:
        best.append((x, best[-1][1]))
    return Chart(
        points=tuple(points),
        crashes=tuple(crashes),
        main_steps=tuple(steps),
        best=tuple((at, metric.value(loss)) for at, loss in best),
        x_max=x,
    )


def conductor_live(get: Callable[[], Any], budget_usd: float | None = None) -> Callable[[], dict[str, Any]]:
    """live() over the conductor `get()` returns (None until there is one), read from other threads:
    copies of plain attributes only, never a call that reads the forge or the store."""

    def live() -> dict[str, Any]:
        conductor = get()
        if conductor is None:
            return {"budget_usd": budget_usd}
        return {
            "progress": dict(conductor.progress),
            "stop_reason": conductor.stop_reason,
            "blocked": conductor.blocked,
            "budget_usd": conductor.config.agent_budget_usd if budget_usd is None else budget_usd,
        }

    return live
