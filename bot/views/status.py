"""`autoresearch status`: a work directory at a glance, read from its store alone (whether a
conductor is running there or not): what runs and waits, main's val_bpb, the agent, recent events."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from rich.console import Group
from rich.table import Table
from rich.text import Text

from bot.core.states import RunState, State
from bot.loop import measurement
from bot.runners.local import last_progress
from bot.store import Store


def render_status(store: Store, events: int = 8) -> Group:
    parts: list = []
    identity = store.identity()
    counts = store.counts_by_status()
    parts.append(Text(f"profile {identity.get('profile', '?')}  harness {identity.get('harness_hash', '?')}  "
                      f"data {identity.get('data_fingerprint', '?')}"))
    parts.append(Text(f"experiments done {sum(counts.values())}: kept {counts.get('keep', 0)}, discarded "
                      f"{counts.get('discard', 0)}, crashed {counts.get('crash', 0)}, failed {counts.get('failed', 0)}"))
    main = _main_line(store)
    if main:
        parts.append(Text(main))
    spent = float(store.get_setting("agent.spent_usd") or 0.0)
    parts.append(Text(f"agent: {_agent_state(store)}" + (f"; its answers have cost ${spent:.2f}" if spent else "")))

    table = Table(title="runs in flight and queued", box=None, padding=(0, 2))
    for column in ("run", "for", "purpose", "state", "step", "loss", "left"):
        table.add_column(column)
    for run in store.runs(state=RunState.RUNNING) + store.runs(state=RunState.QUEUED):
        progress = last_progress(Path(run.run_dir)) if run.run_dir else None
        progress = progress or {}
        table.add_row(str(run.id), f"#{run.experiment_id}" if run.experiment_id else "main", run.purpose,
                      run.state, str(progress.get("step", "-")),
                      f"{progress['loss']:.3f}" if "loss" in progress else "-",
                      f"{progress['remaining_seconds']:.0f}s" if "remaining_seconds" in progress else "-")
    parts.append(table if table.row_count else Text("nothing running or queued"))
    recent = store.events()[-events:]
    if recent:
        parts.append(Text("recent events:", style="bold"))
        for event in recent:
            stamp = time.strftime("%H:%M:%S", time.localtime(event["at"]))
            where = f"#{event['experiment_id']} " if event["experiment_id"] is not None else ""
            parts.append(Text(f"  {stamp} {where}{event['kind']}: {event['message'].splitlines()[0][:160]}"))
    return Group(*parts)


def _main_line(store: Store) -> str | None:
    identity = store.identity()
    latest = [r for r in store.latest_ok_runs("baseline", 20) if not identity or measurement.counts(r, identity)]
    if not latest:
        return None
    values = [r.val_bpb for r in store.runs(code_hash=latest[0].code_hash)
              if r.purpose == "baseline" and r.state == RunState.DONE and r.status == "ok" and r.val_bpb is not None
              and (not identity or measurement.counts(r, identity))]
    mean = statistics.fmean(values)
    return f"main {latest[0].commit_sha[:7]}: val_bpb {mean:.6f} (mean of {len(values)} run(s))"


def _agent_state(store: Store) -> str:
    if store.get_setting("paused") == "1":
        return "paused (autoresearch resume to go on)"
    proposing = store.experiments(state=State.PROPOSING)
    if proposing:
        return f"thinking about experiment {proposing[0].id}"
    return "idle: no proposal in progress"
