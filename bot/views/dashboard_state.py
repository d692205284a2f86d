"""What the dashboard's page shows, as JSON: the read model (bot.views.read_model) in the shape
the browser app (dashboard_static/app.js) reads, the running slots with their progress, and the
store's fingerprint that says when the state must be built again. The values keep the key
`val_bpb` whatever the task; they are on the task's metric's scale, which `metric` names."""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bot.core.states import Status
from bot.store import Experiment
from bot.store.writes import WriteLedger
from bot.views.read_model import (
    ExperimentView,
    RunRow,
    View,
    build_view,
    progress_of,
    read_loop,
    read_rows,
    read_runs,
    run_title,
)
from bot.views.text import places

log = logging.getLogger(__name__)

Links = Callable[[Experiment, dict[str, str]], dict[str, str]]
"""(experiment, what GitHub shows of it: store.published, "pr" among it) -> {label: URL}."""


def build_state(
    db: sqlite3.Connection, *, live: dict[str, Any] | None = None, links: Links | None = None
) -> dict[str, Any]:
    """Everything the page shows, from one connection (in a read transaction) and `live`:

    updated_at   seconds since the epoch
    metric       {name, unit, direction ("lower" | "higher": which is better), places (decimals shown),
                  scale ("linear" | "log": how deltas and margins read, below)}
    main         {val_bpb, source ("baseline runs" | "kept experiment, not re-measured yet" | null), runs,
                  commit, baseline_val_bpb (the loop's baseline), margin (the noise margin now, or null)}

    Values (val_bpb, the chart's) are the metric's. A delta (delta, remeasured_delta) is the change it
    means (read_model.shown_change): a difference in the metric's units, or on a log scale a relative
    change (-0.5: half main's value), where each experiment also carries delta_value, its value minus
    main's in the metric's units. A margin is the judge's, on its loss scale: the metric's units, or on
    a log scale the log of a ratio (exp(margin) - 1 is the relative change it allows).
    agent        {state: thinking | waiting | paused | stopped | blocked, detail, experiment (being
                  proposed), budget_usd, budget_left_usd}
    spent_usd    what the agent's answers cost so far
    queued       runs waiting for a slot
    counts       {keep, discard, crash, rejected, failed, cancelled (finished experiments), active,
                  kept_for_simplicity (of the keeps)}
    slots        [{run, experiment, title, purpose, started_at, step, loss, progress (0-1),
                  remaining_seconds, training_seconds}], one per running run
    chart        {points: [{x, id, title, val_bpb, status, kept, for_simplicity}] (the baseline at x 0, then each kept
                  or discarded experiment at its place among the finished ones), crashes: [{x, id,
                  title, status}] (crashed, rejected or failed), best: [[x, val_bpb], ...] (the running
                  best's step vertices), x_max}
    experiments  [{id, title, state, status, kept_for_simplicity (its words, or null), val_bpb, delta,
                  margin, remeasured_delta, runs (finished), in_flight (queued or running), cost_usd,
                  reason (first line), request, pr, links {label: url}, updated_at}] in id order; a
                  proposal in the making is no row
    events       the latest events, newest first: [{id, at, experiment, kind, message}]
    write_budget GitHub's writes (bot.store.writes): {windows: [{seconds, writes, limit}] (a minute,
                  then an hour), mode ("full" | "degraded"), since (when it was chosen, or null), why}
    """
    live = live or {}
    view = build_view(read_rows(db), live)
    main, metric = view.main, view.metric
    return {
        "updated_at": time.time(),
        "metric": {
            "name": metric.name,
            "unit": metric.unit,
            "direction": metric.direction,
            "places": places(metric),
            "scale": metric.scale,
        },
        "main": {
            "val_bpb": main.val_bpb,
            "source": main.source,
            "runs": main.runs,
            "commit": main.commit[:7] if main.commit else None,
            "baseline_val_bpb": view.baseline.val_bpb if view.baseline else None,
            "margin": main.margin,
        },
        "agent": vars(view.agent),
        "spent_usd": view.spent_usd,
        "queued": len(view.queued),
        "counts": {**view.counts, "kept_for_simplicity": view.kept_for_simplicity},
        "slots": [_slot(run, view.title_of(run), live) for run in view.running],
        "chart": _chart(view),
        "experiments": [_row(e, links) for e in view.experiments],
        "events": [
            {
                "id": e.id,
                "at": e.at,
                "experiment": e.experiment_id,
                "kind": e.kind,
                "message": _first_line(e.message, 240),
            }
            for e in view.events
        ],
        "write_budget": write_budget(db),
    }


def write_budget(db: sqlite3.Connection) -> dict[str, Any]:
    """build_state's `write_budget`, from the store's write ledger."""
    summary = WriteLedger(db).summary(time.time())
    return {
        "windows": [{"seconds": s, "writes": n, "limit": most} for s, n, most in summary.counts],
        "mode": summary.mode.mode,
        "since": summary.mode.since,
        "why": summary.mode.why,
    }


def running_slots(db: sqlite3.Connection, live: dict[str, Any]) -> list[dict[str, Any]]:
    """The running slots alone (build_state's `slots`), in two small queries: progress moves while
    the store stays the same."""
    running = read_runs(db, "state = 'running'")
    titles = dict(
        db.execute(
            "SELECT id, title FROM experiments WHERE id IN (SELECT experiment_id FROM runs WHERE state = 'running')"
        ).fetchall()
    )
    slots = []
    for run in running:
        slots.append(_slot(run, run_title(run, titles.get(run.experiment_id)), live))
    return slots


def fingerprint(db: sqlite3.Connection) -> tuple[Any, ...]:
    """Changes whenever build_state's store part would: an event, an experiment's update, a run
    queued, started or ended, the loop's state (read_loop) or a pull request shown; one cheap query
    and the loop's few settings rows."""
    return (
        *db.execute(
            "SELECT (SELECT COALESCE(MAX(id), 0) FROM events),"
            " (SELECT COUNT(*) || ':' || COALESCE(MAX(updated_at), 0) FROM experiments),"
            " (SELECT group_concat(id || ':' || state || ':' || COALESCE(run_dir, '')) FROM runs"
            "  WHERE state IN ('queued', 'running')),"
            " (SELECT COUNT(*) || ':' || COALESCE(MAX(id), 0) FROM runs),"
            " (SELECT COUNT(*) FROM published WHERE key = 'pr')"
        ).fetchone(),
        read_loop(db),
    )


@dataclass(frozen=True)
class Look:
    """One read of the store and of live(): what a page or a stream shows, already encoded."""

    key: str | None  # the store key (the state event's id); None when the store could not be read
    slots: list[dict[str, Any]] | None
    body: bytes  # the whole state as JSON, or {"error": ...}
    progress: bytes = b""  # {"slots", "updated_at"} as JSON
    error: str | None = None
    generation: int = 0  # which look of a stream feed this is


def encode(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()


def _slot(run: RunRow, title: str, live: dict[str, Any]) -> dict[str, Any]:
    line = progress_of(run, live)
    return {
        "run": run.id,
        "experiment": run.experiment_id,
        "purpose": run.purpose,
        "title": title,
        "started_at": run.started_at,
        "step": line.get("step"),
        "loss": line.get("loss"),
        "progress": line.get("progress"),
        "remaining_seconds": line.get("remaining_seconds"),
        "training_seconds": line.get("training_seconds"),
    }


def _chart(view: View) -> dict[str, Any]:
    """The read model's chart as the page draws it: the baseline, kept and discarded points."""
    chart = view.chart
    return {
        "points": [
            {
                "x": p.x,
                "id": p.id,
                "title": p.title,
                "val_bpb": p.val_bpb,
                "status": p.status,
                "kept": p.status in ("baseline", Status.KEEP),
                "for_simplicity": p.for_simplicity,
            }
            for p in chart.points
            if p.status in ("baseline", Status.KEEP, Status.DISCARD)
        ],
        "crashes": [{"x": m.x, "id": m.id, "title": m.title, "status": m.status} for m in chart.crashes],
        "best": [[x, value] for x, value in chart.best],
        "x_max": chart.x_max,
    }


def _row(view: ExperimentView, links: Links | None) -> dict[str, Any]:
    e = view.experiment
    simpler = view.kept_for_simplicity
    found: dict[str, str] = {}
    if links is not None:
        try:
            found = {str(k): str(v) for k, v in (links(e, view.published) or {}).items() if v}
        except Exception:  # noqa: BLE001 - a broken link helper must not take the page down
            log.exception("links() failed for experiment %s", e.id)
    return {
        "id": e.id,
        "title": e.title,
        "state": e.state,
        "status": e.status,
        "kept_for_simplicity": simpler.words() if simpler else None,
        "val_bpb": view.val_bpb,
        "delta": view.delta,
        "margin": e.margin,
        "remeasured_delta": view.remeasured_delta,
        **({"delta_value": view.delta_value} if view.metric.relative else {}),
        "runs": len(view.runs),
        "in_flight": view.in_flight,
        "cost_usd": e.meta.get("cost_usd"),
        "reason": _first_line(e.reason, 240),
        "request": e.request,
        "pr": view.pull,
        "links": found,
        "updated_at": e.updated_at,
    }


def _first_line(text: str | None, limit: int) -> str | None:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else None
    return line if line is None or len(line) <= limit else line[: limit - 1] + "…"
