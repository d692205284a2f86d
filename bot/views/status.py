"""`autoresearch status`: a work directory at a glance, read from its store alone (whether a
conductor is running there or not): what runs and waits, the experiments done (the keeps for
simplicity said apart), main's value of the task's metric beside the loop's baseline and the noise
margin, the agent, GitHub's write budget (the writes of the last minute and hour against GitHub's
limits, and the publisher's mode: bot.store.writes), recent events. The numbers are the read
model's (bot.views.read_model), as on the dashboard."""

from __future__ import annotations

import time

from rich.console import Group
from rich.table import Table
from rich.text import Text

from bot.store.writes import WriteSummary
from bot.views.read_model import FROM_KEPT_EXPERIMENT, View, progress_of
from bot.views.terminal import kept_count
from bot.views.text import margin_text, places

EVENTS = 8  # recent events shown


def render_workdir_status(view: View, writes: WriteSummary | None = None) -> Group:
    """The work directory of `view` at a glance (read it with events=EVENTS), with its GitHub
    `writes` when it has a ledger (store.writes.summary)."""
    parts: list = []
    identity, counts = view.identity, view.counts
    parts.append(
        Text(
            f"profile {identity.get('profile', '?')}  harness {identity.get('harness_hash', '?')}  "
            f"data {identity.get('data_fingerprint', '?')}"
        )
    )
    done = sum(n for status, n in counts.items() if status != "active")
    parts.append(
        Text(
            f"experiments done {done}: kept {kept_count(view)}, discarded {counts['discard']}, "
            f"crashed {counts['crash']}, rejected {counts['rejected']}, failed {counts['failed']}"
        )
    )
    main = main_line(view)
    if main:
        parts.append(Text(main))
    spent = view.spent_usd
    parts.append(Text(f"agent: {_agent_words(view)}" + (f"; its answers have cost ${spent:.2f}" if spent else "")))
    if writes is not None:
        parts.append(Text(write_budget_line(writes)))

    table = Table(title="runs in flight and queued", box=None, padding=(0, 2))
    for column in ("run", "for", "purpose", "state", "step", "loss", "left"):
        table.add_column(column)
    for run in view.running + view.queued:
        progress = progress_of(run)
        table.add_row(
            str(run.id),
            f"#{run.experiment_id}" if run.experiment_id else "main",
            run.purpose,
            run.state,
            str(progress.get("step", "-")),
            f"{progress['loss']:.3f}" if "loss" in progress else "-",
            f"{progress['remaining_seconds']:.0f}s" if "remaining_seconds" in progress else "-",
        )
    parts.append(table if table.row_count else Text("nothing running or queued"))
    recent = list(reversed(view.events[:EVENTS]))
    if recent:
        parts.append(Text("recent events:", style="bold"))
        for event in recent:
            stamp = time.strftime("%H:%M:%S", time.localtime(event.at))
            where = f"#{event.experiment_id} " if event.experiment_id is not None else ""
            parts.append(Text(f"  {stamp} {where}{event.kind}: {event.message.splitlines()[0][:160]}"))
    return Group(*parts)


def main_line(view: View) -> str | None:
    """Main's value of the metric, how it was measured, the noise margin now and the loop's baseline."""
    main, n = view.main, places(view.metric)
    if main.val_bpb is None or main.commit is None:
        return None
    how = FROM_KEPT_EXPERIMENT if main.source == FROM_KEPT_EXPERIMENT else f"mean of {main.runs} run(s)"
    line = f"main {main.commit[:7]}: {view.metric.name} {main.val_bpb:.{n}f} ({how})"
    if main.margin is not None:
        line += f", noise margin {margin_text(view.metric, main.margin, n)}"
    if view.baseline is not None:
        metric = view.metric
        change = metric.format_change(metric.loss(main.val_bpb) - metric.loss(view.baseline.val_bpb), n)
        line += f"; baseline {view.baseline.val_bpb:.{n}f} ({change})"
    return line


def _agent_words(view: View) -> str:
    agent = view.agent
    if agent.state == "paused":
        return "paused (autoresearch resume to go on)"
    if agent.state == "thinking":
        return f"thinking about experiment {agent.experiment}"
    if agent.state == "waiting":
        return "idle: no proposal in progress"
    return f"{agent.state}: {agent.detail}"


def write_budget_line(writes: WriteSummary) -> str:
    """GitHub writes: 130 in the last hour / 500, 4 in the last minute / 80; degraded since 14:02 (why)."""
    counts = ", ".join(
        f"{n} in the last {'hour' if window == 3600 else 'minute' if window == 60 else f'{window:.0f} s'} / {most}"
        for window, n, most in sorted(writes.counts, reverse=True)
    )
    mode = writes.mode
    since = f" since {time.strftime('%H:%M', time.localtime(mode.since))}" if mode.since else ""
    why = f" ({mode.why})" if mode.why else ""
    return f"GitHub writes: {counts}; {mode.mode}{since}{why}"
