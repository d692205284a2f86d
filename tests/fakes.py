"""Small stand-ins for the conductor's collaborators, so the state machine can be driven through
every path in milliseconds, with results chosen by the test instead of by training noise.

- `FakeRunner`: the runner protocol in memory; a job finishes when the test says so (or at once,
  with `auto=True`) with a val_bpb the test chose for its code.
- `FileRunner`: the same protocol persisted in a directory, so a conductor killed with SIGKILL and
  started again finds its jobs (for the kill tests, which run the conductor in a child process).
- `SlowAgent`, `FailingAgent`: agents that block until released, or raise first.
- `SMALL_TRAIN_PY`: a train.py for the fake runners, which never run it.

The forge in these tests is the real LocalForge (git on disk is fast and real); the agent is the
real ScriptedAgent wherever a fixed list of proposals will do.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bot.core.records import Job, Proposal, ProposalContext, RunResult, RunStatus

IDENTITY = {"profile": "smoke", "harness_hash": "harness-1", "data_fingerprint": "data-1"}
EFFECT = re.compile(r'^_fake_effect = \(([-+0-9.e]+), ".*"\)$', re.M)
BASE_VAL_BPB = 2.0
CRASH_MARK = '\n_fake_crash = "boom"\n'  # a train.py holding this line crashes in the fake runners

# A train.py with what the conductor and the agents check of one (it compiles, imports the harness
# and uses each part of its interface) and two constants to edit, a few lines apart. The fake
# runners never run it, and the loop parses every train.py it is given: the real one costs tens of
# milliseconds a proposal.
SMALL_TRAIN_PY = """
import math

from runner import harness

MATRIX_LR = 0.04
DEPTH = 4
WARMDOWN_RATIO = 0.5

h = harness.session()
batches = h.train_batches(8)
while not h.time_up():
    x, y = next(batches)
    h.step_done(math.log(MATRIX_LR * DEPTH))
h.finish(None)
""".lstrip()


def with_effect(text: str, effect: float, tag: str = "") -> str:
    """A train.py whose fake val_bpb is main's plus `effect` (the fakes read the marker line). The
    marker is code, not a comment: a change to comments alone is no experiment (bot.core.validation)."""
    text = EFFECT.sub("", text).rstrip("\n")
    return f"{text}\n_fake_effect = ({effect}, {json.dumps(tag)})\n"


def fake_value(asset: str, run_id: int) -> float:
    """val_bpb of a fake run: the sum of the asset's effect markers plus a tiny wobble determined by
    the run id (so repeats differ and the noise is small and known: at most 0.0005)."""
    effects = sum(float(m) for m in EFFECT.findall(asset))
    wobble = ((run_id * 7919) % 11 - 5) / 10_000
    return round(BASE_VAL_BPB + effects + wobble, 6)


def result_for(
    job: Job,
    *,
    identity: dict[str, str] | None = None,
    crash: str | None = None,
    rejected: str | None = None,
    **metrics: Any,
) -> RunResult:
    ident = dict(IDENTITY if identity is None else identity)
    if rejected is not None:  # refused a number by the evaluator's gate (or training's harness), as specs records it
        return RunResult(
            run_id=job.run_id,
            status="rejected",
            error=rejected,
            metrics=dict(ident, asset_sha256=job.asset_sha256, outcome="rejected"),
        )
    if crash is not None or CRASH_MARK in job.asset:
        return RunResult(
            run_id=job.run_id,
            status="crash",
            error=crash or "Traceback: RuntimeError: boom",
            metrics={"asset_sha256": job.asset_sha256},
        )
    value = metrics.pop("val_bpb", None) or fake_value(job.asset, job.run_id)
    data = dict(
        ident,
        asset_sha256=job.asset_sha256,
        val_bpb=value,
        num_steps=100,
        tokens_per_second=1000.0,
        clock="cpu",
        cpu_share=0.95,
        threads=2,
    )
    data.update(metrics)
    return RunResult(run_id=job.run_id, status="ok", val_bpb=value, metrics=data, log_tail="fake log")


class FakeRunner:
    """The runner protocol in memory. `finish(run_id, ...)` ends a job; `auto` ends each one at its
    first lookup. `submissions` counts submit() calls per run id (to check idempotency); `notified`
    counts notify() calls, `closed` says whether close() was called."""

    def __init__(self, slots: int = 1, *, auto: bool = True, outcome: Callable[[Job], RunResult] | None = None) -> None:
        self.slots = slots
        self.auto = auto
        self.outcome = outcome or result_for
        self.jobs: dict[int, Job] = {}
        self.finished: dict[int, RunResult] = {}
        self.cancelled: list[int] = []
        self.submissions: dict[int, int] = {}
        self.lost: set[int] = set()
        self.notified = 0
        self.closed = False
        self._notify: Callable[[], None] | None = None

    def check_ready(self, identity: dict[str, str]) -> None:
        pass

    def on_change(self, callback: Callable[[], None]) -> None:
        self._notify = callback

    def notify(self) -> None:
        self.notified += 1
        if self._notify:
            self._notify()

    def close(self) -> None:
        self.closed = True

    def submit(self, job: Job) -> str:
        self.submissions[job.run_id] = self.submissions.get(job.run_id, 0) + 1
        self.jobs.setdefault(job.run_id, job)
        return f"fake://{job.run_id}"

    def lookup(self, run_id: int) -> RunStatus:
        if run_id in self.lost:
            return RunStatus("lost", detail="the fake machine vanished")
        if run_id not in self.jobs:
            return RunStatus("unknown")
        if run_id not in self.finished and self.auto:
            self.finished[run_id] = self.outcome(self.jobs[run_id])
        if run_id in self.finished:
            return RunStatus("finished", result=self.finished[run_id])
        return RunStatus("running", progress={"step": 1, "loss": 5.0, "progress": 0.5})

    def cancel(self, run_id: int) -> None:
        self.cancelled.append(run_id)

    def finish(self, run_id: int, result: RunResult | None = None) -> None:
        self.finished[run_id] = result or self.outcome(self.jobs[run_id])
        if self._notify:
            self._notify()

    def running(self) -> list[int]:
        return [i for i in self.jobs if i not in self.finished and i not in self.cancelled]


class FileRunner:
    """The runner protocol over a directory: a job is a JSON file, finished `seconds` after it was
    submitted, with the fake value of its code. Survives the conductor's death."""

    def __init__(self, root: Path, slots: int = 1, seconds: float = 0.3) -> None:
        self.root = root
        self.slots = slots
        self.seconds = seconds
        root.mkdir(parents=True, exist_ok=True)

    def check_ready(self, identity: dict[str, str]) -> None:
        pass

    def on_change(self, callback: Callable[[], None]) -> None:
        pass  # the driver's timer finds finished jobs

    def notify(self) -> None:
        pass

    def close(self) -> None:
        pass  # the jobs are files: they survive the conductor

    def submit(self, job: Job) -> str:
        path = self.root / f"{job.run_id}.json"
        if not path.exists():
            path.write_text(
                json.dumps(
                    {
                        "run_id": job.run_id,
                        "asset": job.asset,
                        "profile": job.profile,
                        "seed": job.seed,
                        "commit": job.commit,
                        "at": time.time(),
                    }
                )
            )
        return str(path)

    def lookup(self, run_id: int) -> RunStatus:
        path = self.root / f"{run_id}.json"
        if not path.exists():
            return RunStatus("unknown")
        data = json.loads(path.read_text())
        if time.time() - data["at"] < self.seconds:
            return RunStatus("running", progress={"step": 1})
        job = Job(run_id=data["run_id"], asset=data["asset"], profile=data["profile"], seed=data["seed"])
        return RunStatus("finished", result=result_for(job))

    def cancel(self, run_id: int) -> None:
        (self.root / f"{run_id}.json").unlink(missing_ok=True)


class SlowAgent:
    """Proposes from a list, but only after the test calls release() for each proposal."""

    def __init__(self, proposals: list[Proposal]) -> None:
        self.proposals = list(proposals)
        self.gate = threading.Semaphore(0)
        self.asked = 0

    def release(self, n: int = 1) -> None:
        for _ in range(n):
            self.gate.release()

    def propose(self, ctx: ProposalContext) -> Proposal:
        self.asked += 1
        self.gate.acquire()
        return self.proposals.pop(0)


class FailingAgent:
    """Raises `error` for its first `failures` calls, then proposes from a list."""

    def __init__(self, proposals: list[Proposal], failures: int, error: BaseException | None = None) -> None:
        self.proposals = list(proposals)
        self.failures = failures
        self.error = error or ConnectionError("the model's API answered 529 overloaded")
        self.calls = 0

    def propose(self, ctx: ProposalContext) -> Proposal:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        if not self.proposals:
            from bot.core.protocols import AgentStopped

            raise AgentStopped("no more proposals")
        return self.proposals.pop(0)
