"""The conductor: one idempotent tick at a time over main, proposals, the experiment lifecycle and runs.

`tick()` is the one page to read: it reads main once (bot.loop.baseline), applies new inbox
entries (bot.loop.inbox), collects finished runs (bot.loop.runs), queues main's own baseline runs,
gives the judge's verdicts (bot.loop.lifecycle: the judge needs no forge), then starts the next
queued run on a freed slot, advances every other experiment up to its merge and close (a merge
moved main, so main is read again, its baselines start and what ran on the old one follows it),
dispatches what that queued, asks the agent for the next proposal in the background
(bot.loop.proposals), dispatches queued runs to free slots, and shows the result to the
publishers. The order serves the judge: the runs a verdict waits for come before it, a new main's
baseline runs first, and no run starts on a main about to move; while a keep is merged, what the
new main will run (its own runs, the changes queued on the old main re-grafted onto the kept
train.py) is queued ahead of the merge and starts at once. Nothing in a tick waits: the agent
thinks on its own thread, runners are asked with lookup(), and GitHub is told on the publishing
worker's thread (bot.loop.publishing): the tick only hands it the snapshot. A driver
(bot.loop.driver) calls tick() when something arrives and on a slow timer. A phase that fails is
logged and recorded, and the next tick tries again; a conductor killed anywhere resumes where it
stopped.

Measurements count only under the identity pinned when the conductor starts (profile, harness
hash, data fingerprint). The agent only proposes; judging, merging and bookkeeping are the loop's,
from the store's numbers alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bot.core import simplicity
from bot.core.protocols import Agent, BranchPolicy, Forge, Publisher, Runner, Snapshot
from bot.core.router import Router
from bot.core.states import RunState, State, Status
from bot.loop import inbox, judge, measurement
from bot.loop.agent_worker import AgentWorker
from bot.loop.baseline import Baseline, Main
from bot.loop.errors import RepeatedErrors
from bot.loop.forge_calls import ForgeWorker
from bot.loop.inbox import InboxHandler, apply_inbox
from bot.loop.judge import judge_config
from bot.loop.lifecycle import Backoff, Lifecycle
from bot.loop.merge_gate import Gate
from bot.loop.proposals import Proposals
from bot.loop.publishing import PublishWorker
from bot.loop.runs import Runs
from bot.store import Store
from runner.profiles import get_profile

log = logging.getLogger(__name__)

PAUSED_BY_INBOX = "paused (autoresearch pause)"


class ConductorError(RuntimeError):
    """The loop cannot go on without a human (for example main's train.py crashes)."""


@dataclass
class ConductorConfig:
    profile: str
    identity: dict[str, str]  # pinned measurement identity: profile, harness_hash, data_fingerprint[, threads]
    max_experiments: int = 0  # 0: take program.md's setting (whose 0 means no limit)
    max_refusals: int = 5  # invalid proposals in a row before the agent is given up on
    lookahead: int | None = None  # proposals prepared beyond the free slots, so a slot that frees never
    # waits for the agent (None: paced by how long a proposal takes to be ready and a run lasts, bot.loop.proposals)
    agent_timeout_s: float = 900.0  # one proposal; then it is abandoned and asked again
    step_retries: int = 3  # failed attempts at one step before its experiment ends as failed
    retry_base_s: float = 2.0  # backoff after the n-th failure: base * 2**(n-1), at most retry_max_s
    retry_max_s: float = 300.0
    disturbed_share: float = 0.75  # a CPU run that got less than this share of main's CPU is re-run
    agent_budget_usd: float | None = None  # proposals stop once the agent's answers cost this much
    max_open_questions: int | None = None  # agent questions open at once (None: one per slot)


@dataclass
class Summary:
    """What a run of the loop came to, for people: counts by verdict, main's numbers, why it stopped."""

    experiments: int
    kept: int
    discarded: int
    crashed: int
    failed: int
    baseline_val_bpb: float | None
    best_val_bpb: float | None
    stop_reason: str
    rejected: int = 0  # runs refused a number by the evaluator's gate or training's harness


class Conductor:
    def __init__(
        self,
        store: Store,
        forge: Forge,
        runner: Runner,
        agent: Agent,
        config: ConductorConfig,
        *,
        clock: Callable[[], float] = time.time,
        publishers: Sequence[Publisher] = (),
        publishing: PublishWorker | None = None,
        router: Router[InboxHandler] = inbox.router,
        merge_gate: Gate | None = None,
        forge_worker: ForgeWorker | None = None,
        branches: BranchPolicy | None = None,
    ) -> None:
        self.store = store
        self.forge = forge
        self.runner = runner
        self.config = config
        self.clock = clock
        # Shown the snapshot at the end of the tick, on this thread: fast, local ones (results.tsv,
        # built from this store's connection at no cost when the tick wrote nothing, and read by the
        # demo right after the tick). Those that wait on someone else (GitHub, its write limits) go on
        # `publishing`, which the tick only hands the snapshot to.
        self.publishers = list(publishers)
        self.publishing = publishing
        self.router = router  # the inbox's handlers: the loop's own, or the app's join of it with others
        self.profile = get_profile(config.profile)
        backoff = Backoff(config.retry_base_s, config.retry_max_s)
        self.baseline = Baseline(store, forge, identity=config.identity, profile=self.profile.name)
        self.runs = Runs(
            store,
            runner,
            self.baseline,
            identity=config.identity,
            profile=self.profile.name,
            disturbed_share=config.disturbed_share,
            report=self._tick_error,
        )
        self.lifecycle = Lifecycle(
            store,
            forge,
            self.baseline,
            self.runs,
            identity=config.identity,
            profile=self.profile.name,
            step_retries=config.step_retries,
            backoff=backoff,
            clock=clock,
            merge_gate=merge_gate,  # what people should see of a keep before main takes it (serve: its pull request)
            calls=forge_worker,  # None: branches and rebases made on this thread, at once
            branches=branches,  # None: every experiment's branch pushed when it is proposed
        )
        self.proposals = Proposals(
            store,
            AgentWorker(agent, timeout_s=config.agent_timeout_s, clock=clock),
            self.baseline,
            self.lifecycle,
            runner,
            profile=self.profile,
            max_experiments=config.max_experiments,
            max_refusals=config.max_refusals,
            lookahead=config.lookahead,
            budget_usd=config.agent_budget_usd,
            backoff=backoff,
            clock=clock,
            max_open_questions=config.max_open_questions,
        )
        self.stop_reason = ""  # why the loop proposes nothing more, as the last tick saw it ('' while it goes on)
        self._started = False  # tick() starts the conductor itself when nobody called start()
        self._errors = RepeatedErrors(store)  # one that repeats at every tick is recorded once
        self._sized: set[str] = set()  # code hashes of the assets in flight that idle() has sized

    def start(self) -> None:
        """Pin the measurement identity; called once, before the first tick."""
        for message in measurement.pin(self.store, self.config.identity):
            log.warning("%s", message)
        self._started = True
        judge.warm()
        for exp in self.store.experiments.in_state(State.DONE):  # a kill may have come between a run and this
            if exp.status == Status.KEEP and exp.remeasured_delta is None and exp.code_hash:
                self.baseline.note_remeasured_delta(exp.code_hash, self.baseline.read())

    # --- the tick --------------------------------------------------------------------------------
    def tick(self) -> None:
        """One pass over everything; safe to call at any time, as often as wanted. A phase that
        fails is logged and recorded, and the next tick tries again: nothing here ends the loop."""
        if not self._started:
            self.start()
        main = self._read_main("reading main")
        if main is None:
            return
        self._guard("applying the inbox", apply_inbox, self.store, self.router)
        self._guard("collecting runs", self.runs.collect, main)
        # Main's runs first: those it still wants are queued (a main that keeps crashing blocks here,
        # before a run of it could start). Then the judge, who needs no forge: a verdict's runs (a
        # confirmation, main's run beside it) are queued, and a keep stops runs on the main it is
        # about to move and queues the new main's runs ahead of its merge, before a slot freed by a
        # run that just ended is filled. Then that slot takes the next queued run at once, before the
        # rest of the tick (pushing, merging, closing, proposing): that work is the idle gap between
        # two runs.
        self._guard("measuring main", self.baseline.schedule, main)
        self._guard("judging experiments", self.lifecycle.judge_all, main)
        self._guard("dispatching runs", self.runs.dispatch, main)
        # a keep waits to be merged: the changes queued on the main it moves, re-grafted onto it, start now too
        if self._guard("re-grafting ahead of a merge", self.lifecycle.regraft_ahead, main):
            self._guard("dispatching runs", self.runs.dispatch, main)
        merged = self._guard("advancing experiments", self.lifecycle.advance_all, main)
        while merged:  # our own merge moved main: the new main's runs, and what ran on the old one follows it
            main = self._read_main("reading main after a merge")
            if main is None:
                return
            self._guard("measuring main", self.baseline.schedule, main)
            self._guard("dispatching runs", self.runs.dispatch, main)  # its baselines start on the slots the keep freed
            merged = self._guard("advancing experiments", self.lifecycle.advance_all, main)
        # what advancing queued (a re-measure, a proposal's first run) starts before the agent is asked
        self._guard("dispatching runs", self.runs.dispatch, main)
        self.stop_reason = self._why_stop(main)
        self._guard("proposing", self.proposals.propose, main, self.stop_reason)
        self._guard("dispatching runs", self.runs.dispatch, main)
        self._guard("publishing", self._publish, main)

    def _read_main(self, phase: str) -> Main | None:
        try:
            return self.baseline.read()
        except Exception as error:  # noqa: BLE001 - the forge may be down for a while
            self._tick_error(phase, error)
            return None

    def _guard(self, phase: str, step: Callable[..., Any], *args: Any) -> Any:
        """Run one phase of the tick and return what it returns; a failure is logged and recorded
        (then None), and the other phases go on."""
        try:
            return step(*args)
        except Exception as error:  # noqa: BLE001 - one failing phase must not stop the others
            self._tick_error(phase, error)
            return None

    def _tick_error(self, phase: str, error: Exception) -> None:
        self._errors.record(f"{phase} failed: {type(error).__name__}: {error}; trying again on the next tick")

    def _why_stop(self, main: Main) -> str:
        settings = main.settings
        target = self.config.max_experiments or settings.max_experiments
        if self.proposals.stopped:
            return self.proposals.stopped
        if target and self.store.experiments.count() >= target and not self.store.experiments.in_state(State.PROPOSING):
            return f"reached {target} experiments"
        if settings.metric_target is not None:
            value = measurement.main_value(self.baseline.values(), main.code_hash)
            if value is not None and settings.reached_target(value):
                return f"main reached the target {settings.metric.name} {settings.metric_target}"
        if settings.paused:
            return "paused in program.md"
        if self.store.state.paused:
            return f"{PAUSED_BY_INBOX}: waiting for `autoresearch resume`"
        return ""

    def _publish(self, main: Main) -> None:
        snapshot = self.snapshot(main)
        for publisher in self.publishers:  # one that fails holds up none of the others
            self._guard("publishing", publisher.publish, snapshot)
        if self.publishing is not None:
            self.publishing.hand_over(snapshot)

    def snapshot(self, main: Main) -> Snapshot:
        """What the publishers show beside the store's rows: main's numbers and the live progress."""
        values = self.baseline.values()
        return Snapshot(
            main_sha=main.sha,
            main_val_bpb=measurement.main_value(values, main.code_hash),
            margin=measurement.main_margin(values, main.code_hash, judge_config(main.settings)),
            progress=dict(self.runs.progress),
            budget_s=float(self.profile.time_budget_s),
        )

    # --- for the driver and the displays -----------------------------------------------------------
    @property
    def blocked(self) -> str:
        """Why main cannot be measured ('' while it can): the loop waits for a human to fix main."""
        return self.baseline.blocked

    @property
    def progress(self) -> dict[int, dict[str, Any]]:
        """Run id -> the latest progress line of each running run."""
        return self.runs.progress

    def finished(self) -> bool:
        """Nothing more will happen without a new input: stopped (or blocked on main), nothing in
        flight. A pause from the inbox is not an end: `autoresearch resume` must reach the loop."""
        if self.blocked:
            return not self.store.runs.count(RunState.RUNNING)  # queued runs wait for a fixed main
        if not self.stop_reason or self.stop_reason.startswith(PAUSED_BY_INBOX):
            return False
        busy = [e for e in self.store.experiments.active() if e.state != State.PROPOSING]
        return not busy and not self.store.runs.count(RunState.QUEUED, RunState.RUNNING)

    def close_publishing(self, timeout: float | None = None) -> bool:
        """Flush, then end the publishing worker's thread (a later tick starts it again)."""
        return self.publishing is None or self.publishing.close(timeout)

    def idle(self, busy: Callable[[], bool]) -> None:
        """Work that can wait, done while the driver has nothing else for the conductor, until
        `busy()`: the size of each train.py in flight (bot.core.simplicity, about 20 ms each, cached),
        which the verdict on it will ask for. Sized here, it is not sized in the tick that collects
        its run, while the slots that run freed wait for that tick (bench/duty_cycle.py)."""
        try:
            in_flight = self.store.experiments.active_code()
        except Exception as error:  # noqa: BLE001 - nothing here is needed: the verdict sizes what is not
            log.warning("work ahead while idle failed: %s", error)
            return
        self._sized &= {code for _, code in in_flight}
        for exp_id, code in in_flight:
            if code in self._sized:
                continue
            if busy():
                return
            self._sized.add(code)  # tried once, whatever comes of it: one text that fails holds up no other
            try:
                simplicity.size(self.store.experiments.get(exp_id).asset or "")
            except Exception as error:  # noqa: BLE001 - the verdict sizes it again, and says what fails
                log.warning("sizing experiment %s's %s ahead failed: %s", exp_id, self.baseline.task.asset, error)

    def next_due_s(self) -> float | None:
        """Seconds until something is due that nobody will announce (a question the paced lookahead
        will want), or None: the driver ticks then rather than at its timer."""
        try:
            return self.proposals.next_question_due_s(self.stop_reason)
        except Exception as error:  # noqa: BLE001 - the timer still catches it
            log.warning("could not tell when the next question is due: %s", error)
            return None

    def wake_on(self, callback: Callable[[], None]) -> None:
        """Call `callback` (from any thread) when the agent answers, a runner has news or a forge call ends."""
        self.proposals.worker.on_answer(callback)
        self.runner.on_change(callback)
        self.lifecycle.calls.on_done(callback)

    def summary(self) -> Summary:
        """Counts and main's numbers, main as the last tick read it (no git): the baseline is the
        one results.tsv and the dashboard show (measurement.baseline_value)."""
        counts = self.store.experiments.counts_by_status()
        values = self.baseline.values()
        kept = [e for e in self.store.experiments.in_state(State.DONE) if e.status == Status.KEEP]
        main = self.baseline.main
        return Summary(
            experiments=sum(counts.values()),
            kept=counts.get(Status.KEEP, 0),
            discarded=counts.get(Status.DISCARD, 0),
            crashed=counts.get(Status.CRASH, 0),
            failed=counts.get(Status.FAILED, 0),
            baseline_val_bpb=measurement.baseline_value(values, kept),
            best_val_bpb=measurement.main_value(values, main.code_hash) if main else None,
            stop_reason=self.blocked or self.stop_reason,
            rejected=counts.get(Status.REJECTED, 0),
        )
