"""The runner protocol: a job (run id, train.py text, profile, seed) goes in, a RunResult comes out.

One protocol for every place a run can happen: a local subprocess per slot here, GitHub Actions
self-hosted runners or Modal later. The conductor is the only one that chooses run ids and counts
slots (from the store: runs in state running); a runner is asked, never waited on:

- `submit(job)` starts the job, or does nothing if a job with that run id was already submitted
  (so a conductor that died between writing "running" and submitting can simply submit again);
- `lookup(run_id)` says where it is: queued, running (with its latest progress line), finished
  (with its result), lost (the runner has no trace of a result and never will), or unknown (never
  submitted here);
- `cancel(run_id)` stops it; it reports nothing afterwards.

A result is checked by the conductor against its job (run id, asset sha256, profile, harness and
data identity) before it counts; a runner does not judge its own results.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from bot.records import Job, RunStatus


class Runner(Protocol):
    slots: int  # jobs it can run at once

    def submit(self, job: Job) -> str:
        """Start `job` (idempotent by run id); returns where its files or logs are."""

    def lookup(self, run_id: int) -> RunStatus:
        """The job's state now. Cheap: called for every running job on every tick."""

    def cancel(self, run_id: int) -> None:
        """Stop the job; it reports nothing afterwards."""

    def on_change(self, callback: Callable[[], None]) -> None:
        """Ask to be told (from any thread) when a job may have changed state, so the conductor's
        driver can tick at once instead of on its timer. A runner that cannot tell ignores it."""
