"""The runner interface: a job (train.py text, profile, seed) goes in, a RunResult comes out.

One protocol for every place a run can happen: a local subprocess here, a self-hosted runner
daemon or Modal later. A runner has a number of slots; the conductor never starts more jobs
than there are free slots.
"""

from __future__ import annotations

from typing import Any, Protocol

from bot.records import Job, RunResult


class Runner(Protocol):
    slots: int

    def free_slots(self) -> int:
        """How many more jobs can start now."""

    def handle(self, run_id: int) -> str:
        """Where a job's files will live: known before it starts, so the store can hold it first."""

    def start(self, job: Job) -> str:
        """Start a job; returns its handle."""

    def poll(self) -> list[RunResult]:
        """Results of the jobs that finished since the last poll."""

    def reattach(self, run_id: int, handle: str) -> bool:
        """After a restart: follow a job started before. False if it is gone without a result."""

    def progress(self, run_id: int) -> dict[str, Any] | None:
        """The job's latest progress line (step, loss, progress, remaining_seconds), if any."""

    def cancel(self, run_id: int) -> None:
        """Stop a job; it reports nothing afterwards."""
