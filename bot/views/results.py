"""Results out of the read model (bot.views.read_model): the reference's results.tsv, a table's
rows for people, JSON for tools.

results.tsv has the reference's columns, tab-separated:
    commit  val_bpb  memory_gb  status  description
with the loop's baseline (its first main, as the judge last compared against it) as its first row
(status keep), then one row per finished experiment (status keep, discard, crash, rejected or
failed; a crash or failure shows val_bpb 0.000000 and memory 0.0, as the reference's do; a rejected
run an empty val_bpb: it was refused a number, not measured at zero; and so does a discard that was
never measured, such as a proposal that no longer applied to a main that moved under it). A keep for simplicity keeps status keep; its
description says `<title>; kept for simplicity, 1 fewer line of code (3 fewer code tokens)`. The
richer rows (delta, margin, re-measured delta, steps, tokens/s, kept_for_simplicity) and one row
per run are for `autoresearch results`.

A task other than training has the same columns with its metric's name in val_bpb's place (`commit
accuracy memory_gb status description`), its values on the metric's own scale with the decimals of
bot.views.text.places; the rows' dicts keep the key `val_bpb` for the value, whatever the task.
A row's delta and remeasured_delta are the changes they mean (bot.views.read_model.shown_change): a
difference in the metric's units, or for a log-scale metric (query latency) a relative change, where
the row also carries delta_value, its value minus main's in the metric's units; margin stays the
judge's, on its loss scale (Metric.format_margin says it as people read it).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bot.core.protocols import Publisher, Snapshot
from bot.core.records import full_budget
from bot.core.simplicity import Simplification
from bot.store import Store
from bot.views.read_model import RunRow, View, metric_of, read_loop, shown_value, view_of
from bot.views.text import places
from runner import files
from runner.tasks import Metric

TSV_COLUMNS = ["commit", "val_bpb", "memory_gb", "status", "description"]  # training's, the reference's


def tsv_columns(metric: Metric) -> list[str]:
    """results.tsv's columns: the reference's, with the task's metric named where val_bpb is."""
    return [metric.name if column == "val_bpb" else column for column in TSV_COLUMNS]


def rows(view: View) -> list[dict[str, Any]]:
    """One dict per row: the baseline, then every finished experiment, in order."""
    out: list[dict[str, Any]] = []
    baseline = view.baseline
    if baseline is not None:
        out.append(
            {
                "id": 0,
                "commit": baseline.commit[:7],
                "val_bpb": baseline.val_bpb,
                "delta": None,
                "margin": None,
                "remeasured_delta": None,
                **({"delta_value": None} if view.metric.relative else {}),
                "memory_gb": _memory_gb(baseline.runs),
                "status": "keep",
                "runs": len(baseline.runs),
                "steps": _mean_metric(baseline.runs, "num_steps"),
                "tokens_per_second": _mean_metric(baseline.runs, "tokens_per_second"),
                "description": "baseline",
                "reason": "main as it was before any experiment",
                "cost_usd": None,
                "kept_for_simplicity": None,
            }
        )
    for finished in view.finished:
        exp = finished.experiment
        ok = [r for r in finished.runs if r.status == "ok" and full_budget(r.purpose)]  # as its val_bpb
        simpler = finished.kept_for_simplicity
        out.append(
            {
                "id": exp.id,
                "commit": (exp.head_sha or "")[:7],
                "val_bpb": finished.val_bpb,
                "delta": finished.delta,
                "margin": exp.margin,
                "remeasured_delta": finished.remeasured_delta,
                **({"delta_value": finished.delta_value} if view.metric.relative else {}),
                "memory_gb": 0.0 if finished.failed else _memory_gb(finished.runs),
                "status": exp.status,
                "runs": len(finished.runs),
                "steps": _mean_metric(ok, "num_steps"),
                "tokens_per_second": _mean_metric(ok, "tokens_per_second"),
                "description": exp.title,
                "reason": exp.reason,
                "cost_usd": exp.meta.get("cost_usd"),
                # a keep for simplicity: how much smaller, the loss its runs ruled out (else None)
                "kept_for_simplicity": None
                if simpler is None
                else {
                    "lines": simpler.smaller.lines,
                    "tokens": simpler.smaller.tokens,
                    "loss_margin": simpler.loss_margin,
                },
            }
        )
    return out


def run_rows(store: Store) -> list[dict[str, Any]]:
    """One dict per run, set-aside runs included, with what the harness measured (the value on the
    metric's scale, as in the View)."""
    metric = metric_of(read_loop(store.db))
    return [
        {
            "run": r.id,
            "experiment": r.experiment_id,
            "purpose": r.purpose,
            "state": r.state,
            "status": r.status,
            "val_bpb": shown_value(metric, r.val_bpb),
            "steps": r.metrics.get("num_steps"),
            "tokens_per_second": r.metrics.get("tokens_per_second"),
            "cpu_share": r.metrics.get("cpu_share"),
            "seconds": r.metrics.get("total_seconds"),
            "commit": r.commit_sha[:7],
            "note": r.note or r.error,
        }
        for r in store.runs.all()
    ]


def to_tsv(view: View) -> str:
    lines = ["\t".join(tsv_columns(view.metric))]
    n = places(view.metric)
    for row in rows(view):
        description = " ".join(described(row).split())  # no tabs or line breaks inside a field
        value = "" if _unmeasured(row) else f"{row['val_bpb'] or 0.0:.{n}f}"
        lines.append("\t".join([row["commit"], value, f"{row['memory_gb']:.1f}", row["status"], description]))
    return "\n".join(lines) + "\n"


def _unmeasured(row: dict[str, Any]) -> bool:
    """A row with no number to show: refused one (rejected), or discarded before any run."""
    return row["status"] == "rejected" or (row["status"] == "discard" and row["val_bpb"] is None)


def described(row: dict[str, Any]) -> str:
    """A row's description, and for a keep for simplicity `; kept for simplicity, 1 fewer line of
    code (3 fewer code tokens)` after it."""
    simpler = row["kept_for_simplicity"]
    if simpler is None:
        return row["description"]
    smaller = Simplification(lines=simpler["lines"], tokens=simpler["tokens"])
    return f"{row['description']}; kept for simplicity, {smaller.words()}"


def export_tsv(store: Store, path: Path) -> None:
    files.write_text(path, to_tsv(view_of(store)))


def _mean_metric(runs: Sequence[RunRow], key: str) -> float | None:
    values = [r.metrics[key] for r in runs if isinstance(r.metrics.get(key), (int, float))]
    return statistics.fmean(values) if values else None


def _memory_gb(runs: Sequence[RunRow]) -> float:
    peaks = [r.metrics.get("peak_vram_mb", 0.0) or 0.0 for r in runs if r.status == "ok"]
    return max(peaks, default=0.0) / 1024


class ResultsFile(Publisher):
    """results.tsv at `path`, rewritten (by export_tsv) at the end of every tick that changed what it
    shows: an experiment finished or was reopened, or a run finished. `store` must be the conductor's
    own: a tick that wrote nothing to it costs nothing here, one that did costs two counts, and the
    table is built again only when they moved."""

    def __init__(self, store: Store, path: Path) -> None:
        self.store = store
        self.path = path
        self._changes = -1  # the store connection's count of rows written when the file was last looked at
        self._shown: tuple[dict[str, int], int] | None = None  # (finished experiments by status, finished runs)

    def publish(self, snapshot: Snapshot) -> None:
        changes = self.store.db.total_changes
        if changes == self._changes:
            return
        shown = (self.store.experiments.counts_by_status(), self.store.runs.count("done"))
        if shown != self._shown:
            export_tsv(self.store, self.path)
            self._shown = shown
        self._changes = changes
