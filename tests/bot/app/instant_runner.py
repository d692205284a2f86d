"""The local runner's stand-in for the tests of what builds one (`autoresearch demo`, the service's
local_parts), where the wiring and the loop are under test and real training is not."""

from __future__ import annotations

from pathlib import Path

from fakes import FakeRunner

from bot.core.records import Job


class InstantRunner(FakeRunner):
    """bot.runners.local.LocalRunner's constructor over tests/fakes.py's FakeRunner: a job is
    finished once submitted, with the val_bpb the fakes give its train.py, and the driver is told
    at once. `made_with` holds the arguments it was made with."""

    threads = 2

    def __init__(
        self,
        root: Path,
        *,
        slots: int = 1,
        data: str | None = None,
        warm: bool = True,
        slots_file: Path | None = None,
    ) -> None:
        super().__init__(slots)
        self.made_with = {"root": root, "slots": slots, "data": data, "warm": warm, "slots_file": slots_file}

    def submit(self, job: Job) -> str:
        handle = super().submit(job)
        self.finish(job.run_id)
        return handle
