"""The research log's text: a summary of the research so far, read from the read model (the best
value of the task's metric and its gain over the loop's baseline, the kept changes in order, those
kept for simplicity said so, counts, pace, agent spend, what is running), in Markdown, the metric
named and its numbers on its own scale. bot.github.research_log keeps it as one issue's body.

The "Updated ..." line at its end says when it was written; content_digest leaves it out, so a
summary whose content did not change is never written again just because the time moved.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

from bot.core.states import Status
from bot.views.read_model import View
from bot.views.text import bpb, cell, change_text, cut_to, one_line, places, plural, signed
from runner.tasks import TRAINING, Metric

DAY_S = 24 * 3600
RUNNING_SHOWN = 20
INTRO = (
    "The bot edits this summary in place as the research goes on; each experiment is a pull request. "
    "Closing this issue does not stop the bot: it keeps the summary current."
)
UPDATED = "\n\n---\n*Updated "  # starts the one line left out of the digest
_OUTCOMES = [
    ("keep", "kept"),
    ("discard", "discarded"),
    ("crash", "crashed"),
    ("rejected", "rejected"),
    ("failed", "failed"),
    ("cancelled", "cancelled"),
]


# --- what the log says, from the read model ---------------------------------------------------------


@dataclass(frozen=True)
class Kept:
    id: int
    title: str
    val_bpb: float | None  # the metric
    delta: float | None  # its change from main at the decision (read_model.shown_change)
    remeasured_delta: float | None  # the new main's fresh baseline's change from the old main's
    pull: int | None
    for_simplicity: bool = False  # kept for simplicity (a smaller train.py), not for a gain


@dataclass(frozen=True)
class Running:
    run_id: int
    purpose: str
    experiment_id: int | None  # None: a run of main itself (a baseline)
    title: str
    pull: int | None
    started_at: float | None


@dataclass(frozen=True)
class Facts:
    baseline: float | None  # the loop's baseline (read_model.Baseline)
    kept: list[Kept]  # in experiment order
    finished: dict[str, int]  # finished experiments per status
    in_progress: int
    finished_last_day: int
    spent_usd: float
    running: list[Running]
    queued: int  # runs waiting for a runner
    kept_for_simplicity: int = 0  # of the keeps, those kept for simplicity
    metric: Metric = TRAINING.metric  # the task's: the numbers above are on its scale


def facts(view: View, now: float) -> Facts:
    """Everything the log shows, from the read model. `now` is on the store's clock (time.time):
    experiments count as finished in the last 24 h by their last update."""
    done = view.finished
    kept = [
        Kept(
            e.experiment.id,
            e.experiment.title,
            e.val_bpb,
            e.delta,
            e.remeasured_delta,
            e.pull,
            e.kept_for_simplicity is not None,
        )
        for e in done
        if e.experiment.status == Status.KEEP
    ]
    pulls = {e.experiment.id: e.pull for e in view.experiments}
    running = [
        Running(
            r.id,
            r.purpose,
            r.experiment_id,
            view.title_of(r) if r.experiment_id is not None else "",
            pulls.get(r.experiment_id) if r.experiment_id is not None else None,
            r.started_at,
        )
        for r in view.running
    ]
    finished = {status: n for status, n in view.counts.items() if status != "active" and n}
    proposing = 1 if view.agent.experiment is not None else 0
    return Facts(
        baseline=view.baseline.val_bpb if view.baseline else None,
        kept=kept,
        finished=finished,
        kept_for_simplicity=view.kept_for_simplicity,
        in_progress=view.counts["active"] + proposing,
        finished_last_day=sum(e.experiment.updated_at >= now - DAY_S for e in done),
        spent_usd=view.spent_usd,
        running=running,
        queued=len(view.queued),
        metric=view.metric,
    )


# --- the text -----------------------------------------------------------------------------------------


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(ts))


def _standing(f: Facts) -> list[str]:
    rows = ["| | |", "| --- | --- |"]
    name, n, loss = f.metric.name, places(f.metric), f.metric.loss
    measured = [k for k in f.kept if k.val_bpb is not None]
    best = min(measured, key=lambda k: loss(k.val_bpb or 0.0), default=None)
    if best is not None and (f.baseline is None or loss(best.val_bpb or 0.0) < loss(f.baseline)):
        where = f"experiment {best.id}" + (f", #{best.pull}" if best.pull else "")
        rows.append(f"| Best {name} | **{bpb(best.val_bpb, n)}** ({where}) |")
        if f.baseline is not None and best.val_bpb is not None:
            gain = best.val_bpb - f.baseline  # on the metric's scale: its sign is the direction's
            rows.append(
                f"| Gain over the first baseline | {signed(gain, n)} ({100 * gain / f.baseline:+.2f}%) "
                f"from {bpb(f.baseline, n)} |"
            )
    elif f.baseline is not None:
        rows.append(f"| Best {name} | **{bpb(f.baseline, n)}** (the first baseline) |")
    else:
        rows.append(f"| Best {name} | not measured yet: main's baseline runs have not finished |")
    total = sum(f.finished.values())
    outcomes = [
        f"{f.finished.get(status, 0)} {word}"
        + (f" ({f.kept_for_simplicity} for simplicity)" if status == "keep" and f.kept_for_simplicity else "")
        for status, word in _OUTCOMES
        if status in ("keep", "discard", "crash") or f.finished.get(status)
    ]
    rows.append(f"| Experiments | {total} finished: {', '.join(outcomes)}; {f.in_progress} in progress |")
    rows.append(f"| Pace | {f.finished_last_day} finished in the last 24 h ({f.finished_last_day / 24:.2f} per hour) |")
    rows.append(f"| Agent spend | ${f.spent_usd:,.2f} |")
    return rows


def _running(f: Facts) -> list[str]:
    lines = []
    for r in f.running[:RUNNING_SHOWN]:
        what = (
            f"Experiment {r.experiment_id} *{cell(one_line(r.title, 100))}*" + (f" (#{r.pull})" if r.pull else "")
            if r.experiment_id is not None
            else "Main"
        )
        since = f", since {_when(r.started_at)}" if r.started_at else ""
        lines.append(f"- {what}: {r.purpose} run {r.run_id}{since}")
    if len(f.running) > RUNNING_SHOWN:
        lines.append(f"- and {plural(len(f.running) - RUNNING_SHOWN, 'more run')}")
    if not lines:
        lines.append("Nothing is running.")
    if f.queued:
        lines.append(f"\n{plural(f.queued, 'run')} queued.")
    return lines


def _kept_row(k: Kept, metric: Metric) -> str:
    change = cell(one_line(k.title, 120)) + (" (kept for simplicity)" if k.for_simplicity else "")
    n = places(metric)
    return (
        f"| {k.id} | {change} | {bpb(k.val_bpb, n)} | {change_text(metric, k.delta, n)} "
        f"| {change_text(metric, k.remeasured_delta, n)} | {f'#{k.pull}' if k.pull else '—'} |"
    )


def log_text(f: Facts, now: float, limit: int) -> str:
    """The summary in Markdown, within `limit` (characters and UTF-8 bytes) however many changes
    were kept (the oldest ones are left out first, saying so); titles are defanged, so the text
    holds no marker of its own."""
    head = "\n".join(
        [
            "# Research log",
            "",
            INTRO,
            "",
            "## Where it stands",
            "",
            *_standing(f),
            "",
            "## Running now",
            "",
            *_running(f),
            "",
            "## Kept changes",
            "",
            "",
        ]
    )
    tail = f"{UPDATED}{_when(now)}.*"
    if not f.kept:
        return cut_to(f"{head}No change has been kept yet.{tail}", limit)
    header = (
        f"| Experiment | Change | {f.metric.name} | Δ vs main | Δ re-measured | Pull request |\n"
        "| --- | --- | --- | --- | --- | --- |"
    )
    note_room = 200
    room = limit - len(f"{head}{header}{tail}".encode()) - note_room
    shown: list[str] = []
    for k in reversed(f.kept):  # the newest first, so the oldest are the ones left out
        row = _kept_row(k, f.metric)
        if len(row.encode()) + 1 > room:
            break
        shown.append(row)
        room -= len(row.encode()) + 1
    shown.reverse()
    left_out = len(f.kept) - len(shown)
    note = (
        f"\n\n*The first {plural(left_out, 'kept change')} are not listed (GitHub shows at most "
        f"{limit:,} characters here); `autoresearch results` lists them all.*"
        if left_out
        else ""
    )
    return cut_to(f"{head}{header}\n" + "\n".join(shown) + note + tail, limit)


def content_digest(body: str) -> str:
    """What identifies a body's content: its text without the "Updated ..." line."""
    return hashlib.sha256(body.split(UPDATED)[0].encode()).hexdigest()
