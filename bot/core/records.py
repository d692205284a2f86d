"""The plain records passed between the conductor and its three collaborators.

The agent turns a `ProposalContext` into a `Proposal`; the runner turns a `Job` into a `RunResult`.
Which runs train the whole budget (`full_budget`: a screening's short run does not) is here too, the
one rule the store's seeds, the loop's numbers and every view read. Nothing here talks to git, a GPU
or a network.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any


def code_hash(text: str) -> str:
    """Identity of a train.py: sha256 of its text with trailing whitespace of each line removed."""
    normal = "\n".join(line.rstrip() for line in text.strip().splitlines())
    return hashlib.sha256(normal.encode("utf-8")).hexdigest()


def slugify(title: str, max_len: int = 40) -> str:
    """A branch-safe slug: lowercase ascii words joined by '-'."""
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
    return (slug[:max_len].rstrip("-")) or "experiment"


@dataclass
class Proposal:
    """One hypothesis from an agent: a new full train.py and why it should help."""

    title: str
    hypothesis: str
    asset: str
    # Free-form, agent-specific facts kept with the experiment (the explorer stores its edits here:
    # {"changes": [{"name": "MATRIX_LR", "old": 0.04, "new": 0.05}]}).
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def slug(self) -> str:
        return slugify(self.title)


@dataclass
class HistoryEntry:
    """What the agent is told about one earlier experiment."""

    id: int
    title: str
    hypothesis: str
    status: str  # keep | discard | crash | rejected | running
    val_bpb: float | None
    delta: float | None  # val_bpb minus main's val_bpb at the time it was judged; negative is better
    code_hash: str
    meta: dict[str, Any] = field(default_factory=dict)
    error_tail: str | None = None
    margin: float | None = None  # the noise margin it was judged with
    lesson: str = ""  # one line: why it was kept, discarded or crashed


@dataclass
class ProposalContext:
    """Everything an agent may read to propose the next experiment."""

    program_md: str
    asset: str  # the task's asset (train.py for training) on the current main
    main_val_bpb: float | None
    history: list[HistoryEntry]
    feedback: list[str] = field(default_factory=list)  # recent human comments, oldest first
    last_crash: str | None = None  # traceback tail of the most recent crash, if any
    seen_hashes: set[str] = field(default_factory=set)  # code_hash of every train.py tried so far
    profile: str = "cpu"
    device_kind: str = "cpu"  # "cpu" or "cuda": which size constants of train.py are live
    main_sha: str = ""  # the main commit asset was read from: the experiment's base
    last_crash_id: int | None = None  # the experiment whose traceback last_crash is
    last_crash_status: str = "crash"  # or "rejected": last_crash is then the reason it was rejected
    spent_usd: float = 0.0  # what proposals have cost so far (an LLM agent's budget counts it)
    # runner.tasks: what asset is (train.py, router.py, query.sql) and how it is measured; main_val_bpb
    # and the history's numbers are on the loss scale (Metric.loss: the metric, or its negation)
    task: str = "training"
    # the experiments proposed but not judged yet (history entries whose status is running), by id:
    # each one's change to main's asset as a unified diff ('' when it was made on an older main), so
    # that questions open at once propose something other than what is already being tried
    in_flight: dict[int, str] = field(default_factory=dict)


def asset_sha256(text: str) -> str:
    """The exact bytes' identity of a train.py, as the harness records it in result.json."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass
class Job:
    """One time-boxed training run of one train.py under one profile. The run id is the
    conductor's: submitting the same id twice starts one run."""

    run_id: int
    asset: str  # the train.py text to run (another task's asset: runner.tasks)
    profile: str
    seed: int
    commit: str = ""  # the git commit the asset came from, for the record
    experiment_id: int | None = None  # None for a baseline run of main
    task: str = "training"  # runner.tasks: what the asset is and how it is measured
    budget_fraction: float = 1.0  # of the profile's time budget: a screening's short run (bot.loop.screening)

    @property
    def asset_sha256(self) -> str:
        return asset_sha256(self.asset)


@dataclass
class RunResult:
    """What a runner reports for a job: the harness's own measurement, never train.py's printout.
    `metrics` holds everything result.json said (profile, harness_hash, data_fingerprint,
    asset_sha256, steps, tokens/s, cpu_share...)."""

    run_id: int
    status: str  # ok | crash | rejected (a timed-out run is a crash; metrics["outcome"] says which)
    val_bpb: float | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    log_tail: str = ""
    error: str | None = None


@dataclass
class RunStatus:
    """A runner's answer to lookup(run_id)."""

    state: str  # queued | running | finished | lost | unknown
    progress: dict[str, Any] | None = None  # running: the latest progress line (step, loss, ...)
    result: RunResult | None = None  # finished: what it reported; lost: the crash it is charged as if lost again
    detail: str = ""  # lost or unknown: why


SCREEN = "screen"  # the purpose of a screening's short run (bot.loop.screening)


def full_budget(purpose: str) -> bool:
    """Whether a run of `purpose` trains the profile's whole budget. A screening's short run does
    not: its value is another measurement, so it never counts beside a full run's (main's value, the
    noise, the pairs, an experiment's mean, a check's numbers), and its seed pairs with main's short
    runs' seeds, never with its full runs' (bot.store.runs)."""
    return purpose != SCREEN
