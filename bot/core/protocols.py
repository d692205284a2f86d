"""The four interfaces the loop speaks, side by side: Forge, Runner, Agent and Publisher.

Everything outside the loop implements one of them (bot.forge and bot.github.forge the Forge,
bot.runners the Runner, bot.agent the Agent, bot.github.publisher the Publisher), and the loop
(bot.loop) uses them without knowing which. Their errors live here too, so an implementation
never imports the loop and the loop never imports an implementation.

Forge: where experiment branches live and how improvements reach main. It reads files at a ref,
creates one branch (one commit) per hypothesis, re-grafts a branch onto a newer main,
squash-merges a winner into main with a compare-and-swap on main, and marks finished experiments
closed without deleting them. When an experiment's branch is made is a `BranchPolicy`'s to say:
by default at once, for every experiment; on GitHub, with a runner that carries the asset in its job,
only once a run of it has started, and while GitHub's write budget is degraded only for one that is
promising (bot.github.branches).

Runner: a job (run id, train.py text, profile, seed) goes in, a RunResult comes out.

One protocol for every place a run can happen: a local subprocess per slot, GitHub Actions on
self-hosted runners, or Modal. The conductor is the only one that chooses run ids and counts the
slots in use (from the store: runs in state running) against the runner's `slots` now; a runner
is asked, never waited on:

- `submit(job)` starts the job, or does nothing if a job with that run id was already submitted
  (so a conductor that died between writing "running" and submitting can simply submit again);
- `lookup(run_id)` says where it is: queued, running (with its latest progress line), finished
  (with its result: train.py's crash is a finished crash), lost (the runner has no trace of a
  result and never will: a preempted container, a runner taken offline, a worker killed from
  outside; the conductor runs it again), or unknown (never submitted here);
- `cancel(run_id)` stops it; it reports nothing afterwards.

Around those, what the app needs of every runner: `check_ready(identity)` once at the start (can
runs happen here, measured under that identity?), `on_change(callback)` and `notify()` (a job may
have changed: the runner tells the conductor's driver, or is told from outside, by a webhook), and
`close()` when the bot stops.

A result is checked by the conductor against its job (run id, asset sha256, profile, harness and
data identity) before it counts; a runner does not judge its own results.

Agent: whatever turns a `ProposalContext` into the next experiment's `Proposal`: a new full
asset, a short title and a plain-English hypothesis. Every failure an agent raises is an
`AgentError`, with a message meant for a human and `meta`, what the failed attempt cost: a proposal
that failed is asked for again later; `AgentStopped`, the agent can propose nothing more (it has
tried everything, or cannot work here), stops the loop asking it. The loop may ask several
questions at once, each on its own thread with its own context (bot.loop.agent_worker): an agent
that must answer one at a time says so with a class attribute `questions_at_once = 1` (an agent
without it is asked as many at once as the loop opens).

Publisher: shows the store's experiments to people (on GitHub: pull requests, checks, comments).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from bot.core.records import Job, Proposal, ProposalContext, RunStatus

__all__ = [
    "Agent",
    "AgentError",
    "AgentStopped",
    "BranchPolicy",
    "EveryBranch",
    "Forge",
    "ForgeError",
    "MainMoved",
    "MergeConflict",
    "Publisher",
    "Runner",
    "Snapshot",
]


# --- Forge ------------------------------------------------------------------------------------
class ForgeError(Exception):
    """A forge operation failed (unknown ref, bad path, git refused an update, ...)."""


class MainMoved(ForgeError):
    """Main is not at the expected sha, or the branch is not based on it: rebase and re-measure."""


class MergeConflict(ForgeError):
    """A 3-way merge of a branch's file onto a newer main conflicts."""


@runtime_checkable
class Forge(Protocol):
    """What the conductor needs from a git host. Every mutating call is safe to retry."""

    def main_sha(self) -> str:
        """The sha of main's head."""
        ...

    def read_file(self, ref: str, path: str) -> str:
        """The text of `path` at `ref` (a sha or branch name); FileNotFoundError if absent."""
        ...

    def branch_head(self, branch: str) -> str | None:
        """The head sha of `branch`, or None if there is no such branch."""
        ...

    def create_branch(self, branch: str, base_sha: str, files: dict[str, str], message: str) -> str:
        """Point `branch` at one commit on `base_sha` with `files` (path -> text) written; return it.

        Idempotent: an existing branch whose head already is exactly that (parent `base_sha`, same
        tree) is returned as is; an existing branch that differs is force-moved to a fresh commit.
        Never touches main, HEAD or a working tree.
        """
        ...

    def rebase_branch(self, branch: str, onto_sha: str, path: str) -> str:
        """Re-create `branch` as one commit on `onto_sha` carrying only its change to `path`.

        `path` becomes the 3-way merge of (base: the branch's parent, ours: onto_sha, theirs: the
        branch); everything else is onto_sha's. Keeps the commit message. Raises MergeConflict on a
        conflicting merge. A branch already based on onto_sha is returned unchanged.
        """
        ...

    def merge(self, branch: str, expected_main: str, message: str, *, measured: str | None = None) -> str:
        """Squash-merge `branch` into main as one commit on `expected_main`; return main's new sha.

        Raises MainMoved if main is not at `expected_main` or the branch is not based on it, and
        ForgeError if `measured` (the commit the judge's runs were of) is given and the branch has
        moved off it since: what lands on main is what was measured, or nothing.
        Idempotent: if main already is a commit with this message on `expected_main`, return it.
        """
        ...

    def close(self, branch: str, label: str) -> None:
        """Mark the experiment on `branch` finished with `label`, keeping the branch. Idempotent."""
        ...

    def closed_label(self, branch: str) -> str | None:
        """The label `branch` was closed with, or None if it is still open."""
        ...

    def list_branches(self, prefix: str = "autoresearch/") -> list[str]:
        """The names of the branches that start with `prefix`."""
        ...


class BranchPolicy(Protocol):
    """When an experiment gets its branch (bot.loop.lifecycle asks, each tick, for each active
    experiment that has none). One without is measured from the asset its runs carry, re-grafted onto
    a newer main in memory (no forge call), and given its branch the first tick this says yes; a
    keep always gets one before main takes it."""

    def wanted(self, experiment_id: int, *, started: bool, promising: bool) -> bool:
        """Whether the experiment should have its branch now: `started`, a run of it has started;
        `promising`, the judge asked to confirm it."""
        ...


class EveryBranch:
    """Every experiment gets its branch as soon as it is proposed (a local forge, the tests)."""

    def wanted(self, experiment_id: int, *, started: bool, promising: bool) -> bool:
        return True


# --- Runner -----------------------------------------------------------------------------------
class Runner(Protocol):
    @property
    def slots(self) -> int:
        """Jobs it can hold at once now: read before each dispatch, it may change while the bot runs
        (bot.runners.capacity); a slot taken away finishes its job and takes no new one."""

    def check_ready(self, identity: dict[str, str]) -> None:
        """At the bot's start: raise, saying what to do, when runs cannot happen here or would not be
        measured under `identity` (every result would be refused). Asked once; it may take seconds."""

    def submit(self, job: Job) -> str:
        """Start `job` (idempotent by run id); returns where its files or logs are."""

    def lookup(self, run_id: int) -> RunStatus:
        """The job's state now. Cheap: called for every running job on every tick."""

    def cancel(self, run_id: int) -> None:
        """Stop the job; it reports nothing afterwards."""

    def on_change(self, callback: Callable[[], None]) -> None:
        """Ask to be told (from any thread) when a job may have changed state, so the conductor's
        driver can tick at once instead of on its timer. A runner that cannot tell ignores it."""

    def notify(self) -> None:
        """Told from outside (a workflow_run webhook, from any thread) that a job may have changed:
        forget what was asked before and call the on_change callback. A runner that watches its
        jobs itself ignores it."""

    def close(self) -> None:
        """The bot is stopping: end what this process started and holds for its jobs. Jobs that
        run elsewhere go on, and the next bot finds them."""


# --- Agent ------------------------------------------------------------------------------------
@runtime_checkable
class Agent(Protocol):
    """Anything that proposes the next experiment."""

    def propose(self, ctx: ProposalContext) -> Proposal:
        """Return a new train.py (never one whose code_hash is in ctx.seen_hashes) and why."""
        ...


class AgentError(Exception):
    """The agent could not produce this proposal; asking again later may succeed. The message says
    why, in words for a person; `meta` is what the attempt cost, as a Proposal's meta says it
    (model, turns, usage, cost_usd), empty when it cost nothing."""

    def __init__(self, message: str, meta: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.meta: dict[str, Any] = meta or {}


class AgentStopped(AgentError):
    """The agent can propose nothing more: it has tried everything, or cannot work here (no key, a
    key the API refuses, settings to fix). The message says what to do about it."""


# --- Publisher --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Snapshot:
    """What a publisher shows beside the store's rows: main's numbers and the live progress."""

    main_sha: str
    main_val_bpb: float | None
    margin: float | None  # the noise margin a change must beat now
    progress: dict[int, dict[str, Any]]  # run id -> its latest progress line
    budget_s: float  # the profile's training budget


class Publisher:
    """Shows the store's experiments to people (GitHub: pull requests, checks, comments). The
    default shows nothing: the local loop's record is the repository and results.tsv."""

    def publish(self, snapshot: Snapshot) -> None:
        return None
