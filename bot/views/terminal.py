"""What the terminal shows of a loop besides `autoresearch status` (bot.views.status): the demo's
live progress line and its runs in flight, and the tables of `autoresearch results`. The numbers
are the read model's (bot.views.read_model), as on the dashboard; a keep for simplicity is counted
among the keeps and said apart (`kept 3 (1 for simplicity)`; its description as in results.tsv). The
task's metric names the value's column, and its digits set the decimals shown (bot.views.text.places)."""

from __future__ import annotations

import time

from rich.console import Group
from rich.table import Table
from rich.text import Text

from bot.store import Store
from bot.views import results
from bot.views.read_model import Live, View, metric_of, progress_of, read_loop
from bot.views.text import change_text, margin_text, places

COLOURS = {
    "keep": "green",
    "discard": "yellow",
    "crash": "red",
    "rejected": "red",
    "failed": "red",
    "cancelled": "yellow",
}


def render_live_progress(view: View, live: Live, experiments: int, started: float) -> Group:
    """One line of where the loop stands (of `experiments` wanted, since `started`), and a row per
    run in flight with its latest progress."""
    table = Table(title=None, expand=False, box=None, padding=(0, 2))
    for column in ("run", "experiment", "step", "loss", "budget", "left"):
        table.add_column(column)
    for run in view.running:
        progress = progress_of(run, live)
        title = view.title_of(run) if run.experiment_id is None else f"#{run.experiment_id} {view.title_of(run)}"
        table.add_row(
            str(run.id),
            f"{title} [{run.purpose}]",
            str(progress.get("step", "-")),
            f"{progress['loss']:.3f}" if "loss" in progress else "-",
            f"{100 * progress.get('progress', 0):.0f}%",
            f"{progress['remaining_seconds']:.0f}s" if "remaining_seconds" in progress else "-",
        )
    counts = view.counts
    done = sum(n for status, n in counts.items() if status != "active")
    line = Text.assemble(
        ("experiments ", "bold"),
        f"{done}/{experiments} done  ",
        ("kept ", "green"),
        f"{kept_count(view)}  ",
        ("discarded ", "yellow"),
        f"{counts['discard']}  ",
        ("crashed ", "red"),
        f"{counts['crash']}  ",
        ("rejected ", "red"),
        f"{counts['rejected']}  ",
        ("baseline ", "bold"),
        _fmt(view.baseline.val_bpb if view.baseline else None, places(view.metric)),
        ("  best ", "bold"),
        _fmt(view.main.val_bpb, places(view.metric)),
        f"  elapsed {time.time() - started:.0f}s",
    )
    return Group(line, table) if table.row_count else Group(line)


def results_table(view: View) -> Table:
    """`autoresearch results`: the baseline and each finished experiment."""
    table = Table(title="experiments")
    rows = results.rows(view)
    priced = any(row["cost_usd"] is not None for row in rows)  # an LLM agent: its cost per proposal
    n = places(view.metric)
    for column in ("#", view.metric.name, "delta", "margin", "re-measured", "steps", "tok/s", "runs", "status"):
        table.add_column(column, no_wrap=True)
    if priced:
        table.add_column("cost", no_wrap=True)
    table.add_column("description", ratio=1)
    for row in rows:
        cost = [] if not priced else ["-" if row["cost_usd"] is None else f"${row['cost_usd']:.3f}"]
        table.add_row(
            str(row["id"]),
            _fmt(row["val_bpb"], n),
            change_text(view.metric, row["delta"], n, missing=""),
            margin_text(view.metric, row["margin"], n, missing="-"),
            change_text(view.metric, row["remeasured_delta"], n, missing=""),
            _whole(row["steps"]),
            _whole(row["tokens_per_second"]),
            str(row["runs"]),
            f"[{COLOURS.get(row['status'], 'white')}]{row['status']}[/]",
            *cost,
            results.described(row),
        )
    return table


def runs_table(store: Store) -> Table:
    """`autoresearch results --runs`: every run, set-aside ones included."""
    table = Table(title="runs")
    metric = metric_of(read_loop(store.db))
    for column in ("run", "exp", "purpose", "state", metric.name, "steps", "tok/s", "cpu share", "seconds", "note"):
        table.add_column(column)
    for row in results.run_rows(store):
        share = row["cpu_share"]
        table.add_row(
            str(row["run"]),
            str(row["experiment"] or "main"),
            row["purpose"],
            row["state"],
            _fmt(row["val_bpb"], places(metric)),
            _whole(row["steps"]),
            _whole(row["tokens_per_second"]),
            "-" if share is None else f"{share:.0%}",
            _whole(row["seconds"]),
            (row["note"] or "").strip().splitlines()[-1][:80] if row["note"] else "",
        )
    return table


def kept_count(view: View) -> str:
    """`3`, or `3 (1 for simplicity)` when some keeps were kept for simplicity."""
    simpler = f" ({view.kept_for_simplicity} for simplicity)" if view.kept_for_simplicity else ""
    return f"{view.counts['keep']}{simpler}"


def _whole(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _fmt(value: float | None, places: int) -> str:
    return "-" if value is None else f"{value:.{places}f}"
