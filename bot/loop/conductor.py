"""The conductor: the whole experiment lifecycle, in one place, one idempotent tick at a time.

`tick()` reads main once (sha, train.py, program.md), applies new inbox entries, collects
finished runs, advances every active experiment, queues measurements of main, asks the agent for
the next proposal (in the background), and dispatches queued runs to free slots. Nothing in a tick
waits: the agent thinks on its own thread, runners are asked with lookup(). A driver
(bot.loop.driver) calls tick() when something arrives and on a slow timer. The states and the moves
between them are in bot.core.states; each move is written to the store before its side effect, and
every side effect is safe to repeat, so a conductor killed anywhere resumes where it stopped.

Measurements count only under the identity pinned when the conductor starts (profile, harness
hash, data fingerprint). Main's val_bpb is the mean of main's own baseline runs: the first main is
measured `first_baseline_runs` times, every later main (after a keep) `baseline_runs` times
afresh; a kept experiment's runs were selected for coming out low, so they feed the noise estimate
but never main's mean. A step that keeps failing ends its experiment as `failed` and the loop goes
on. The agent only proposes; judging, merging and bookkeeping are this module's, from the store's
numbers alone.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bot.core.protocols import Agent, AgentError, Forge, MainMoved, MergeConflict, Publisher, Runner, Snapshot
from bot.core.records import HistoryEntry, Job, Proposal, ProposalContext, RunResult, code_hash
from bot.core.router import Router
from bot.core.states import Request, RunState, State, Status
from bot.loop import inbox, measurement, validation
from bot.loop.agent_worker import AgentWorker
from bot.loop.inbox import InboxHandler, apply_inbox
from bot.loop.judge import JudgeConfig, Noise, decide, main_runs_wanted, margin, pooled_noise
from bot.loop.program import LoopSettings, SettingsError, parse_program
from bot.store import Experiment, Run, Store
from bot.views import results
from runner.profiles import get_profile

log = logging.getLogger(__name__)

ASSET = "train.py"
PROGRAM = "program.md"
RUN_PRIORITY = {"baseline": 0, "remeasure": 1, "confirm": 2, "candidate": 3}
MAX_BASELINE_CRASHES = 2  # crashes of main's own train.py before the loop asks for a human
PAUSED_BY_INBOX = "paused (autoresearch pause)"
MAX_REFUSED_RESULTS = 3  # results of one code refused (wrong identity) before giving up on it
MAX_LOST_RUNS = 5  # runs of one code lost in a row (a machine gone, an answer refused) before giving up on it
# A run whose training process was killed from outside is lost and runs again; lost this many times in a
# row, it is charged as the crash it may be: a train.py can kill itself to look killed from outside.
MAX_KILLED_RUNS = 2


class ConductorError(RuntimeError):
    """The loop cannot go on without a human (for example main's train.py crashes)."""


@dataclass
class ConductorConfig:
    profile: str
    identity: dict[str, str]  # pinned measurement identity: profile, harness_hash, data_fingerprint[, threads]
    max_experiments: int = 0  # 0: take program.md's setting (whose 0 means no limit)
    max_refusals: int = 5  # invalid proposals in a row before the agent is given up on
    lookahead: int | None = None  # proposals prepared beyond the free slots (None: one per slot), so a slot
    # that frees never waits for the agent
    agent_timeout_s: float = 900.0  # one proposal; then it is abandoned and asked again
    step_retries: int = 3  # failed attempts at one step before its experiment ends as failed
    retry_base_s: float = 2.0  # backoff after the n-th failure: base * 2**(n-1), at most retry_max_s
    retry_max_s: float = 300.0
    disturbed_share: float = 0.75  # a CPU run that got less than this share of main's CPU is re-run
    agent_budget_usd: float | None = None  # proposals stop once the agent's answers cost this much


@dataclass(frozen=True)
class Main:
    """Main as read once per tick."""

    sha: str
    train_py: str
    code: str  # code_hash(train_py)
    instructions: str  # program.md without its front matter
    settings: LoopSettings


@dataclass
class Summary:
    experiments: int
    kept: int
    discarded: int
    crashed: int
    failed: int
    baseline_val_bpb: float | None
    best_val_bpb: float | None
    results_tsv: Path
    stop_reason: str


@dataclass
class _Pending:
    """The proposal being prepared, and what the conductor told the agent about refusals."""

    exp_id: int
    notes: list[str] = field(default_factory=list)  # why earlier answers were refused, for the agent
    seen: set[str] = field(default_factory=set)  # code of the refused answers
    cost_usd: float = 0.0  # what the refused or skipped answers cost, charged to the experiment


class Conductor:
    def __init__(self, store: Store, forge: Forge, runner: Runner, agent: Agent, config: ConductorConfig,
                 *, results_tsv: Path, clock: Callable[[], float] = time.time,
                 publisher: Publisher | None = None, router: Router[InboxHandler] = inbox.router) -> None:
        self.store = store
        self.router = router  # the inbox's handlers: the loop's own, or the app's join of it with others
        self.publisher = publisher or Publisher()
        self.forge = forge
        self.runner = runner
        self.config = config
        self.results_tsv = results_tsv
        self.clock = clock
        self.profile = get_profile(config.profile)
        self.worker = AgentWorker(agent, timeout_s=config.agent_timeout_s, clock=clock)
        self.stop_reason = ""
        self.blocked = ""  # set when main itself cannot be measured: a human must fix main
        self.progress: dict[int, dict[str, Any]] = {}  # run id -> latest progress line
        self._agent_stop = ""
        self._main_cache: dict[str, Main] = {}
        self._code_at: dict[str, str] = {}  # commit sha -> code_hash of its train.py
        self._values: list[tuple[str, int | None, str, float]] | None = None  # cache of counted values
        self._pending: _Pending | None = None
        self._started = False
        self._last_error = ""
        self._merged = False
        self._blocked_code = ""
        self._normal: dict[str, str | None] = {}  # code_hash -> validation.normal_hash

    # --- the tick --------------------------------------------------------------------------------
    def start(self) -> None:
        """Pin the measurement identity; called once, before the first tick."""
        for message in measurement.pin(self.store, self.config.identity):
            log.warning("%s", message)
        self._started = True
        for exp in self.store.experiments(state=State.DONE):  # a kill may have come between a run and this
            if exp.status == Status.KEEP and exp.remeasured_delta is None and exp.code_hash:
                self._note_remeasured_delta(exp.code_hash)

    def tick(self) -> None:
        """One pass over everything; safe to call at any time, as often as wanted. A phase that
        fails is logged and recorded, and the next tick tries again: nothing here ends the loop."""
        if not self._started:
            self.start()
        try:
            main = self.read_main()
        except Exception as error:  # noqa: BLE001 - the forge may be down for a while
            self._tick_error("reading main", error)
            return
        self._guard("applying the inbox", apply_inbox, self.store, self.router)
        self._guard("collecting runs", self.collect)
        # A slot freed by a run that just ended takes the next queued experiment run now, before the
        # rest of the tick (advancing, merging, proposing): that work is the idle gap between two
        # runs. Only runs measured on the main just read (one whose main moved is cancelled by
        # advancing, not started), and no baseline (main's crashes are judged after collecting).
        self._guard("dispatching runs", self.dispatch, main, True)
        self._guard("advancing experiments", self._advance_all, main)
        if self._merged:  # our own merge moved main: the rest of the tick works on the new one
            self._merged = False
            try:
                main = self.read_main()
            except Exception as error:  # noqa: BLE001
                self._tick_error("reading main after a merge", error)
                return
        self._guard("measuring main", self.schedule_baseline, main)
        self.stop_reason = self._why_stop(main)
        self._guard("proposing", self.propose, main)
        self._guard("dispatching runs", self.dispatch, main)
        self._guard("publishing", self.publisher.publish, self.snapshot(main))

    def snapshot(self, main: Main) -> Snapshot:
        values = self.main_values(main.code)
        noise = self.noise()
        band = margin(noise, 1, len(values), self._judge_config(main.settings)) if noise and values else None
        return Snapshot(main_sha=main.sha, main_val_bpb=statistics.fmean(values) if values else None,
                        margin=band, progress=dict(self.progress), budget_s=float(self.profile.time_budget_s))

    def _guard(self, phase: str, step: Callable[..., Any], *args: Any) -> None:
        """Run one phase of the tick; a failure is logged and recorded, and the others go on."""
        try:
            step(*args)
        except Exception as error:  # noqa: BLE001 - one failing phase must not stop the others
            self._tick_error(phase, error)

    def _advance_all(self, main: Main) -> None:
        for exp in self.store.requested():
            self._act_on_request(exp, main)
        for exp in self.store.experiments(active=True):
            if exp.state != State.PROPOSING:
                self._advance_safely(exp, main)

    # --- what people asked for (bot.core.states.Request), acted on before the lifecycle moves ---------
    def _act_on_request(self, exp: Experiment, main: Main) -> None:
        request, who = Request(exp.request), exp.request_by or "someone"
        done = exp.state == State.DONE
        if request in (Request.CANCEL, Request.DISCARD) and not done and exp.state not in (State.CLOSING,):
            status = Status.CANCELLED if request == Request.CANCEL else Status.DISCARD
            why = f"its pull request was closed by {who}" if request == Request.CANCEL else f"discarded by {who}"
            self._cancel_runs(exp, why)
            self.store.update_experiment(exp.id, state=State.CLOSING, status=status, reason=why, request=None,
                                         event=why)
            return
        if request in (Request.REOPEN, Request.RERUN, Request.KEEP) and done and exp.status != Status.KEEP:
            meta = dict(exp.meta, keep_anyway=who) if request == Request.KEEP else exp.meta
            self.store.update_experiment(exp.id, state=State.BRANCHED, status=None, reason=None, val_bpb=None,
                                         delta=None, margin=None, failures=0, retry_at=None, request=None,
                                         meta=meta, event=f"{request} by {who}: measured again")
            return
        if request == Request.RERUN and exp.state == State.MEASURING:
            self._requeue(exp, "confirm", f"/rerun by {who}")
        if request == Request.KEEP and not done:
            self.store.update_experiment(exp.id, meta=dict(exp.meta, keep_anyway=who))
        self.store.update_experiment(exp.id, request=None, event=f"{request} by {who}: "
                                     f"{'done' if not done else 'nothing to do, it is ' + str(exp.status)}")

    def _tick_error(self, phase: str, error: Exception) -> None:
        message = f"{phase} failed: {type(error).__name__}: {error}; trying again on the next tick"
        log.error("%s", message)
        if message != self._last_error:
            self._last_error = message
            try:
                self.store.event(None, "error", message)
            except Exception:  # noqa: BLE001 - the store itself may be what failed (a full disk)
                log.exception("could not record the error in the store")

    def finished(self) -> bool:
        """Nothing more will happen without a new input: stopped (or blocked on main), nothing in
        flight. A pause from the inbox is not an end: `autoresearch resume` must reach the loop."""
        if self.blocked:
            return not self.store.count_runs(RunState.RUNNING)  # queued runs wait for a fixed main
        if not self.stop_reason or self.stop_reason.startswith(PAUSED_BY_INBOX):
            return False
        busy = [e for e in self.store.experiments(active=True) if e.state != State.PROPOSING]
        return not busy and not self.store.count_runs(RunState.QUEUED, RunState.RUNNING)

    def wake_on(self, callback: Callable[[], None]) -> None:
        """Call `callback` (from any thread) when the agent answers or a runner has news."""
        self.worker.on_answer(callback)
        self.runner.on_change(callback)

    # --- main, its program and its measurements ----------------------------------------------------
    def read_main(self) -> Main:
        sha = self.forge.main_sha()
        if sha not in self._main_cache:
            text = self.forge.read_file(sha, ASSET)
            try:
                program_md = self.forge.read_file(sha, PROGRAM)
            except FileNotFoundError:
                program_md = ""
            instructions, settings = self._program(sha, program_md)
            self._main_cache = {sha: Main(sha, text, code_hash(text), instructions, settings)}
            self._code_at[sha] = code_hash(text)
        return self._main_cache[sha]

    def _program(self, sha: str, text: str) -> tuple[str, LoopSettings]:
        """program.md's instructions and settings; an invalid front matter keeps the last valid
        settings (stored, so a restart keeps them too) and records the error once per commit."""
        try:
            program = parse_program(text)
        except SettingsError as error:
            kept = self.store.get_setting("program.settings")
            settings = LoopSettings.model_validate_json(kept) if kept else LoopSettings()
            which = "the last valid settings stay" if kept else "the default settings are"
            self.store.event(None, "settings_error", f"program.md on main {sha[:7]} is invalid, so {which} in "
                             f"force until it is fixed: {error}")
            log.error("program.md on main %s: %s", sha[:7], error)
            return text, settings
        self.store.set_setting("program.settings", program.settings.model_dump_json())
        return program.instructions, program.settings

    def code_at(self, sha: str) -> str:
        if sha not in self._code_at:
            self._code_at[sha] = code_hash(self.forge.read_file(sha, ASSET))
        return self._code_at[sha]

    def _counted_values(self) -> list[tuple[str, int | None, str, float]]:
        """(code, experiment, purpose, val_bpb) of every ok run under the pinned identity; cached
        until a run finishes, so an idle tick reads nothing."""
        if self._values is None:
            ident = self.config.identity
            self._values = self.store.measured_values(profile=ident["profile"], harness_hash=ident["harness_hash"],
                                                      data_fingerprint=ident["data_fingerprint"],
                                                      threads=measurement.pinned_threads(ident))
        return self._values

    def main_values(self, code: str) -> list[float]:
        """Main's val_bpb values: its own baseline runs only."""
        return [v for c, e, purpose, v in self._counted_values() if c == code and purpose == "baseline"]

    def noise(self) -> Noise | None:
        """Pooled over groups of repeated runs: each main's own runs, each experiment's runs. A kept
        experiment's runs stay apart from its new main's: they were selected for coming out low."""
        groups: dict[tuple[str, int | None], list[float]] = {}
        for code, experiment, purpose, value in self._counted_values():
            groups.setdefault((code, None if purpose == "baseline" else experiment), []).append(value)
        return pooled_noise(list(groups.values()))

    def schedule_baseline(self, main: Main) -> None:
        if self.blocked:
            if self._blocked_code == main.code:
                return  # main needs a human; a new train.py on main clears it
            self.blocked = ""
        runs = [r for r in self.store.runs(code_hash=main.code) if r.purpose == "baseline"]
        crashed = []  # main's crashes since its last good run: one may be bad luck (an OOM, a NaN)
        for run in (r for r in runs if r.state == RunState.DONE):
            crashed = crashed + [run] if run.status == "crash" else []
        if len(crashed) >= MAX_BASELINE_CRASHES:
            self._block(main, f"train.py on main ({main.sha[:7]}) crashed in {len(crashed)} baseline runs in a row, so "
                        "nothing can be judged against it. Commit a fixed train.py to main in the research "
                        "repository (a new main gets a new baseline), then run the same command again. The last "
                        f"run said:\n{crashed[-1].error}")
            return
        pending = [r for r in runs if r.state in (RunState.QUEUED, RunState.RUNNING)]
        first = not any(c != main.code for c, _, purpose, _ in self._counted_values() if purpose == "baseline")
        wanted = main_runs_wanted(first, main.settings.first_baseline_runs, main.settings.baseline_runs)
        for _ in range(max(0, wanted - len(self.main_values(main.code)) - len(pending))):
            self._queue_main_run(main, f"measure main {main.sha[:7]}")

    def _queue_main_run(self, main: Main, reason: str) -> None:
        self.store.add_run(experiment_id=None, purpose="baseline", code_hash=main.code, commit_sha=main.sha,
                           base_sha=main.sha, asset=main.train_py, profile=self.profile.name, reason=reason)

    # --- proposing, in the background ------------------------------------------------------------
    def _why_stop(self, main: Main) -> str:
        settings = main.settings
        target = self.config.max_experiments or settings.max_experiments
        if self._agent_stop:
            return self._agent_stop
        if target and self.store.count_experiments() >= target and not self.store.experiments(state=State.PROPOSING):
            return f"reached {target} experiments"
        if settings.target_val_bpb is not None:
            values = self.main_values(main.code)
            if values and statistics.fmean(values) <= settings.target_val_bpb:
                return f"main reached the target val_bpb {settings.target_val_bpb}"
        if settings.paused:
            return "paused in program.md"
        if self.store.get_setting("paused") == "1":
            return f"{PAUSED_BY_INBOX}: waiting for `autoresearch resume`"
        return ""

    def room_for_proposal(self, main: Main) -> bool:
        target = self.config.max_experiments or main.settings.max_experiments
        if self.stop_reason or self.blocked or (target and self.store.count_experiments() >= target):
            return False
        waiting = self.store.count_runs(RunState.QUEUED, RunState.RUNNING)
        unqueued = sum(len(self.store.experiments(state=s)) for s in (State.PROPOSED, State.BRANCHED))
        lookahead = self.runner.slots if self.config.lookahead is None else self.config.lookahead
        return self.runner.slots + lookahead - waiting - unqueued > 0

    def propose(self, main: Main) -> None:
        """Collect the agent's answer if there is one; ask again or afresh when there is room. An
        answer taken as a proposal makes room for the next question in the same tick: waiting for
        the next tick would leave the agent idle for up to the driver's timer, and with many slots
        the runners would wait for proposals (bench/duty_cycle.py)."""
        proposing = self.store.experiments(state=State.PROPOSING)
        if proposing:
            exp = proposing[0]
            if self._pending is None or self._pending.exp_id != exp.id:
                self._pending = _Pending(exp.id)
            answer = self.worker.answer(exp.id)
            if answer is not None:
                self._take_answer(exp, answer, main)
                if self._pending is not None or self.store.experiments(state=State.PROPOSING):
                    return  # refused, failed or withdrawn: the next tick decides
            else:
                if not self.worker.busy(exp.id) and (exp.retry_at or 0) <= self.clock() and not self.stop_reason:
                    self._ask(exp, main)
                return
        if self.room_for_proposal(main):
            exp = self.store.start_proposing(main.sha)
            self._pending = _Pending(exp.id)
            self._ask(exp, main)

    def _ask(self, exp: Experiment, main: Main) -> None:
        budget, spent = self.config.agent_budget_usd, self.spent_usd()
        if budget is not None and spent >= budget:
            reason = (f"the agent's budget of ${budget:.2f} is spent (${spent:.2f} so far); raise "
                      "AUTORESEARCH_ANTHROPIC_BUDGET_USD (or --budget) to let it propose again")
            self.store.withdraw_proposing(exp.id, reason)
            self._agent_stop = reason
            log.warning("%s", reason)
            return
        if exp.base_sha != main.sha:
            exp = self.store.update_experiment(exp.id, base_sha=main.sha)
        self.worker.ask(exp.id, self.context(main))

    def _take_answer(self, exp: Experiment, answer: Proposal | BaseException, main: Main) -> None:
        pending = self._pending or _Pending(exp.id)
        if isinstance(answer, AgentError):
            self.store.withdraw_proposing(exp.id, f"the agent has nothing more to propose ({answer})")
            self._agent_stop = f"the agent has nothing more to propose ({answer})"
            return
        if isinstance(answer, BaseException):
            pending.cost_usd += self._spend(getattr(answer, "meta", None))  # a skipped proposal was paid for
            failures = exp.failures + 1
            wait = self._backoff(failures)
            self.store.update_experiment(exp.id, failures=failures, retry_at=self.clock() + wait,
                                         event=f"the agent failed ({type(answer).__name__}: {answer}); "
                                               f"asking again in {wait:.0f}s (failure {failures})")
            log.warning("agent failed (%s: %s); retrying in %.0fs", type(answer).__name__, answer, wait)
            return
        cost = self._spend(answer.meta)
        problem = self.validate(answer, main, pending.seen)
        if problem is None:
            meta = dict(answer.meta, cost_usd=round(cost + pending.cost_usd, 6)) if cost or pending.cost_usd \
                else answer.meta
            exp = self.store.fill_proposal(exp.id, title=answer.title, hypothesis=answer.hypothesis,
                                           slug=answer.slug, code_hash=code_hash(answer.train_py),
                                           train_py=answer.train_py, meta=meta)
            if meta.get("fixes"):
                self.store.event(exp.id, "fix", f"proposed as a fix of the crash of experiment {meta['fixes']}")
            log.info("experiment %s proposed: %s", exp.id, exp.title)
            self._pending = None
            self._advance_safely(exp, main)
            return
        pending.cost_usd += cost
        self.store.event(None, "refused", f"proposal {answer.title!r} refused: {problem}")
        log.warning("proposal %r refused: %s", answer.title, problem)
        pending.seen.add(code_hash(answer.train_py))
        pending.notes.append(f"(conductor) your proposal {answer.title!r} was refused: {problem}")
        refusals = len(pending.notes)
        if refusals >= self.config.max_refusals:
            reason = f"the agent's last {refusals} proposals were all refused"
            self.store.withdraw_proposing(exp.id, reason)
            self._agent_stop = reason
            return
        if not self.stop_reason:
            self._ask(self.store.experiment(exp.id), main)

    def validate(self, proposal: Proposal, main: Main, seen: set[str]) -> str | None:
        digest = code_hash(proposal.train_py)
        if digest in seen or (digest != main.code and digest in self.store.seen_code_hashes()):
            earlier = self.store.experiment_by_code(digest)
            return f"it repeats experiment {earlier.id} ({earlier.title!r})" if earlier else "it repeats an earlier run"
        earlier = [(exp_id, title, self._normal_hash(code, exp_id)) for exp_id, title, code in self.store.codes()]
        return validation.problem(proposal.title, proposal.train_py, main_train_py=main.train_py, earlier=earlier)

    def _normal_hash(self, code: str, exp_id: int) -> str | None:
        """validation.normal_hash of an experiment's train.py, remembered per code: a history of a
        thousand is read and parsed once, not at every proposal."""
        if code not in self._normal:
            self._normal[code] = validation.normal_hash(self.store.experiment(exp_id).train_py or "")
        return self._normal[code]

    def context(self, main: Main) -> ProposalContext:
        values = self.main_values(main.code)
        done = self.store.experiments()
        history = [HistoryEntry(id=e.id, title=e.title, hypothesis=e.hypothesis,
                                status=e.status or "running", val_bpb=e.val_bpb, delta=e.delta,
                                code_hash=e.code_hash or "", meta=e.meta, error_tail=e.error_tail,
                                margin=e.margin, lesson=_lesson(e.reason)) for e in done]
        crash = self._unfixed_crash(done)
        notes = self._pending.notes if self._pending else []
        seen = self._pending.seen if self._pending else set()
        return ProposalContext(program_md=main.instructions, train_py=main.train_py, main_sha=main.sha,
                               main_val_bpb=statistics.fmean(values) if values else None, history=history,
                               feedback=self.store.recent_feedback() + notes,
                               last_crash=crash.error_tail if crash else None, last_crash_id=crash.id if crash else None,
                               seen_hashes=self.store.seen_code_hashes() | seen | {main.code},
                               profile=self.profile.name, device_kind=self.profile.device, spent_usd=self.spent_usd())

    @staticmethod
    def _unfixed_crash(done: list[Experiment]) -> Experiment | None:
        """The latest finished experiment if it crashed and no experiment yet claims to fix it: its
        traceback goes to the agent, so that one fix is tried, once."""
        finished = [e for e in done if e.state == State.DONE]
        if not finished or finished[-1].status != Status.CRASH:
            return None
        crash = finished[-1]
        return None if any(e.meta.get("fixes") == crash.id for e in done) else crash

    # --- what proposals cost (an LLM agent reports it in Proposal.meta["cost_usd"]) ----------------
    def spent_usd(self) -> float:
        return float(self.store.get_setting("agent.spent_usd") or 0.0)

    def _spend(self, meta: dict[str, Any] | None) -> float:
        cost = float((meta or {}).get("cost_usd") or 0.0)
        if cost:
            self.store.set_setting("agent.spent_usd", repr(self.spent_usd() + cost))
        return cost

    # --- the state machine -----------------------------------------------------------------------
    def _advance_safely(self, exp: Experiment, main: Main) -> None:
        """Advance one experiment; a failure stays with it (retried with backoff, then failed)."""
        if exp.retry_at and exp.retry_at > self.clock():
            return
        try:
            self.advance(exp, main)
        except Exception as error:  # noqa: BLE001 - one experiment's failure must not stop the loop
            exp = self.store.experiment(exp.id)
            failures = exp.failures + 1
            what = f"{type(error).__name__}: {error}"
            if failures >= self.config.step_retries and exp.merged_sha:  # main holds it: it stays kept
                self.store.update_experiment(exp.id, state=State.DONE, failures=failures,
                                             reason=f"{exp.reason} (closing its branch failed: {what})",
                                             event=f"keep: merged, but closing its branch failed {failures} times "
                                                   f"({what})")
                return
            if failures >= self.config.step_retries:
                self._cancel_runs(exp, "its experiment failed")
                self.store.update_experiment(exp.id, state=State.DONE, status=Status.FAILED, failures=failures,
                                             reason=f"its {exp.state} step failed {failures} times; last: {what}",
                                             event=f"failed: the {exp.state} step failed {failures} times ({what})")
                log.error("experiment %s failed at %s: %s", exp.id, exp.state, what)
                return
            wait = self._backoff(failures)
            self.store.update_experiment(exp.id, failures=failures, retry_at=self.clock() + wait,
                                         event=f"the {exp.state} step failed ({what}); retrying in {wait:.0f}s")
            log.warning("experiment %s: %s step failed (%s); retrying in %.0fs", exp.id, exp.state, what, wait)

    def _backoff(self, failures: int) -> float:
        return min(self.config.retry_max_s, self.config.retry_base_s * 2 ** (failures - 1))

    def advance(self, exp: Experiment, main: Main) -> None:
        """Do the next step of one experiment (and the steps after it that need no waiting)."""
        while exp.state != State.DONE:
            step = getattr(self, f"_step_{exp.state}")
            after = step(exp, main)
            if after is None:
                return
            exp = after

    def _step_proposed(self, exp: Experiment, main: Main) -> Experiment:
        head = self.forge.create_branch(exp.branch, exp.base_sha, {ASSET: exp.train_py},
                                        f"{exp.title}\n\n{exp.hypothesis}\n\nautoresearch-experiment: {exp.id}")
        return self.store.update_experiment(exp.id, state=State.BRANCHED, head_sha=head,
                                            event=f"pushed {exp.branch} at {head[:7]}")

    def _step_branched(self, exp: Experiment, main: Main) -> Experiment:
        self.store.add_run(experiment_id=exp.id, purpose="candidate", code_hash=exp.code_hash,
                           commit_sha=exp.head_sha or "", base_sha=exp.base_sha, asset=exp.train_py,
                           profile=self.profile.name, experiment_fields={"state": State.MEASURING})
        return self.store.experiment(exp.id)

    def _step_measuring(self, exp: Experiment, main: Main) -> Experiment | None:
        runs = [r for r in self.store.runs(experiment_id=exp.id) if r.code_hash == exp.code_hash]
        waiting = [r for r in runs if r.state in (RunState.QUEUED, RunState.RUNNING)]
        if exp.base_sha != main.sha:
            if self.code_at(exp.base_sha) == main.code:  # main moved, its train.py did not (program.md)
                return self._follow_main(exp, main)
            if any(r.state == RunState.RUNNING for r in waiting):
                return None  # let it finish: the judge sends it to a re-measure
            self._cancel_runs(exp, f"main moved to {main.sha[:7]} before it ran")
            waiting = []
        if waiting:
            return None
        counted = [r for r in runs if r.state == RunState.DONE]
        crash = next((r for r in counted if r.status == "crash"), None)
        candidate = [r.val_bpb for r in counted if r.status == "ok" and r.val_bpb is not None and measurement.counts(r, self.config.identity)]
        if not candidate and crash is None and exp.base_sha == main.sha:
            self._requeue(exp, "candidate", "no run under the pinned harness and data")
            return None
        decision = decide(candidate=candidate, crash=(crash.error or "crashed") if crash else None,
                          main=self.main_values(main.code), noise=self.noise(), measured_on=exp.base_sha,
                          current_main=main.sha, config=self._judge_config(main.settings))
        if decision.action == "wait":
            return None
        who = exp.meta.get("keep_anyway")
        if who and decision.action in ("confirm", "discard") and decision.val_bpb is not None:
            decision = replace(decision, action="keep", reason=f"kept by {who} over the judge, who said: "
                                                               f"{decision.reason}")
        if decision.action == "confirm":
            self._requeue(exp, "confirm", decision.reason)
            for _ in range(decision.extra_main_runs):
                self._queue_main_run(main, f"beside the confirmation of experiment {exp.id}")
            return None
        if decision.action == "remeasure":
            return self.store.update_experiment(exp.id, state=State.REBASING, event=decision.reason)
        numbers = dict(val_bpb=decision.val_bpb, delta=decision.delta, margin=decision.margin, reason=decision.reason)
        if decision.action == "keep":
            meta = dict(exp.meta, main_code=main.code, main_val_bpb=statistics.fmean(self.main_values(main.code)),
                        runs=len(candidate))
            return self.store.update_experiment(exp.id, state=State.MERGING, meta=meta, event=decision.reason,
                                                **numbers)
        status = Status.CRASH if decision.action == "crash" else Status.DISCARD
        error_tail = _error_tail(crash) if crash else None
        return self.store.update_experiment(exp.id, state=State.CLOSING, status=status, error_tail=error_tail,
                                            event=decision.reason, **numbers)

    def _follow_main(self, exp: Experiment, main: Main) -> Experiment:
        """Move the branch onto a main whose train.py is the one it was measured against: its runs
        still count, since the judge compares train.py, not the commit around it."""
        head = self.forge.rebase_branch(exp.branch, main.sha, ASSET)
        return self.store.update_experiment(exp.id, base_sha=main.sha, head_sha=head,
                                            event=f"followed main to {main.sha[:7]} (train.py unchanged)")

    def _step_rebasing(self, exp: Experiment, main: Main) -> Experiment:
        if self.code_at(exp.base_sha) == main.code:
            return self.store.update_experiment(self._follow_main(exp, main).id, state=State.MEASURING)
        try:
            head = self.forge.rebase_branch(exp.branch, main.sha, ASSET)
        except MergeConflict as error:
            return self.store.update_experiment(
                exp.id, state=State.CLOSING, status=Status.DISCARD, val_bpb=None, delta=None,
                reason=f"its change to train.py conflicts with main {main.sha[:7]}: {error}", event="conflict")
        text = self.forge.read_file(head, ASSET)
        if code_hash(text) == main.code:
            return self.store.update_experiment(exp.id, state=State.CLOSING, status=Status.DISCARD, val_bpb=None,
                                                delta=None, reason="main already holds this change",
                                                event="already in main")
        self.store.add_run(experiment_id=exp.id, purpose="remeasure", code_hash=code_hash(text), commit_sha=head,
                           base_sha=main.sha, asset=text, profile=self.profile.name,
                           reason=f"rebased onto main {main.sha[:7]}",
                           experiment_fields={"state": State.MEASURING, "base_sha": main.sha, "head_sha": head,
                                              "train_py": text, "code_hash": code_hash(text)})
        return self.store.experiment(exp.id)

    def _step_merging(self, exp: Experiment, main: Main) -> Experiment | None:
        runs = exp.meta.get("runs", 1)
        message = (f"{exp.title} (val_bpb {exp.val_bpb:.6f}, {exp.delta:+.6f} vs main)\n\n{exp.hypothesis}\n\n"
                   f"{exp.reason}\n\nval_bpb is the mean of its {runs} run{'s' if runs != 1 else ''}; the new main "
                   f"is measured afresh, and that re-measured delta is the one to quote.\n\n"
                   f"autoresearch-experiment: {exp.id}\nautoresearch-val-bpb: {exp.val_bpb:.6f}")
        try:
            merged = self.forge.merge(exp.branch, exp.base_sha, message)
        except MainMoved as error:  # the tick's main is stale now: the next tick goes on with the new one
            now = self.read_main()
            if now.sha != exp.base_sha and self.code_at(exp.base_sha) == now.code:
                self._follow_main(exp, now)  # only program.md or the like moved: no re-measure
                return None
            self.store.update_experiment(exp.id, state=State.REBASING, event=f"main moved before the merge: {error}")
            return None
        self._merged = True
        return self.store.update_experiment(exp.id, state=State.CLOSING, status=Status.KEEP, merged_sha=merged,
                                            event=f"merged into main as {merged[:7]}")

    def _step_closing(self, exp: Experiment, main: Main) -> Experiment:
        self.forge.close(exp.branch, exp.status or Status.DISCARD)
        exp = self.store.update_experiment(exp.id, state=State.DONE, event=f"{exp.status}: {exp.reason}")
        log.info("experiment %s %s: %s", exp.id, exp.status, exp.reason)
        results.export_tsv(self.store, self.results_tsv)
        return exp

    def _requeue(self, exp: Experiment, purpose: str, reason: str) -> None:
        """Queue one more run of the experiment as it stands (its state stays measuring)."""
        self.store.add_run(experiment_id=exp.id, purpose=purpose, code_hash=exp.code_hash,
                           commit_sha=exp.head_sha or "", base_sha=exp.base_sha, asset=exp.train_py,
                           profile=self.profile.name, reason=reason)

    def _cancel_runs(self, exp: Experiment, why: str) -> None:
        for run in self.store.runs(experiment_id=exp.id):
            if run.state in (RunState.QUEUED, RunState.RUNNING):
                if run.state == RunState.RUNNING:
                    self.runner.cancel(run.id)
                self.store.set_aside_run(run.id, RunState.CANCELLED, why, rerun=False)

    def _judge_config(self, settings: LoopSettings) -> JudgeConfig:
        return JudgeConfig(noise_sigmas=settings.noise_sigmas, confirm_sigmas=settings.confirm_sigmas,
                           confirm_below=settings.confirm_below, min_margin=settings.min_margin,
                           confirm=settings.confirm)

    # --- runs ------------------------------------------------------------------------------------
    def dispatch(self, main: Main, on_main_only: bool = False) -> None:
        """Start queued runs on free slots: baselines first, then re-measures, confirmations, candidates.
        `on_main_only`: only experiment runs measured on main (early in a tick, before advancing)."""
        free = self.runner.slots - self.store.count_runs(RunState.RUNNING)
        if free <= 0 or self.blocked:  # nothing can be judged until main is fixed: spend no runs
            return
        queued = sorted(self.store.runs(state=RunState.QUEUED), key=lambda r: (RUN_PRIORITY[r.purpose], r.id))
        if on_main_only:
            queued = [r for r in queued if r.experiment_id is not None and r.base_sha == main.sha]
        for run in queued[:free]:
            try:
                handle = self.runner.submit(self._job(run))  # idempotent by run id: safe before the write
            except Exception as error:  # noqa: BLE001 - one run the runner refuses must not hold up the rest
                self._tick_error(f"starting run {run.id}", error)
                continue
            self.store.mark_run_started(run.id, handle)
            log.info("run %s (%s) started", run.id, run.purpose)

    def _job(self, run: Run) -> Job:
        return Job(run_id=run.id, asset=run.asset, profile=run.profile, seed=run.seed, commit=run.commit_sha,
                   experiment_id=run.experiment_id)

    def collect(self) -> None:
        """Ask the runner about every running run; record what finished, re-run what was lost."""
        for run in self.store.runs(state=RunState.RUNNING):
            try:
                status = self.runner.lookup(run.id)
            except Exception as error:  # noqa: BLE001 - one run the runner cannot answer for holds up no other
                self._tick_error(f"asking about run {run.id}", error)
                continue
            if status.state in ("queued", "running"):
                self.progress[run.id] = status.progress or self.progress.get(run.id, {})
                continue
            self.progress.pop(run.id, None)
            if status.state == "unknown":  # written as started, never submitted: submit it now
                self.store.mark_run_started(run.id, self.runner.submit(self._job(run)))
            elif status.state == "lost":
                self._lost(run, status.detail or "the runner lost it", charge=status.result)
            else:
                assert status.result is not None
                self._record(run, status.result)
            self._values = None

    def _lost(self, run: Run, why: str, *, charge: RunResult | None = None) -> None:
        """Run it again, unless this code's runs keep getting lost: a remote runner that refuses or
        drops every result (another harness deployed, a profile it lacks) must not loop forever.
        `charge`: the crash to record instead once MAX_KILLED_RUNS in a row were lost, for a run
        killed from outside (see MAX_KILLED_RUNS)."""
        streak = 0  # this code's runs lost since its last measured one
        for earlier in sorted(self.store.runs(code_hash=run.code_hash), key=lambda r: r.id):
            streak = 0 if earlier.state == RunState.DONE else streak + (earlier.state == RunState.LOST)
        if charge is not None and streak + 1 >= MAX_KILLED_RUNS:
            log.warning("run %s lost again (%s): charged as a crash of its train.py", run.id, why)
            self._record(run, replace(charge, error=f"{why}; lost {streak + 1} times in a row, so "
                                                     "charged as a crash of its train.py"))
            return
        again = streak + 1 < MAX_LOST_RUNS
        self.store.set_aside_run(run.id, RunState.LOST, why, rerun=again)
        log.warning("run %s lost: %s", run.id, why)
        if not again:
            self._give_up_on(run, f"{MAX_LOST_RUNS} runs of it were lost; the last: {why}")

    def _record(self, run: Run, result: RunResult) -> None:
        kept = dict(status=result.status, val_bpb=result.val_bpb, metrics=result.metrics, log_tail=result.log_tail)
        problem = measurement.refusal(run, result, self.config.identity)
        if problem is not None:
            refused = [r for r in self.store.runs(code_hash=run.code_hash) if r.state == RunState.REFUSED]
            again = len(refused) + 1 < MAX_REFUSED_RESULTS
            self.store.set_aside_run(run.id, RunState.REFUSED, f"result refused: {problem}", rerun=again, result=kept)
            log.error("run %s: result refused: %s", run.id, problem)
            if not again:
                self._give_up_on(run, f"{MAX_REFUSED_RESULTS} results for it were refused; the last: {problem}")
            return
        disturbed = measurement.disturbance(run, result, self.store.latest_ok_runs("baseline", 6),
                                            self.config.disturbed_share)
        if disturbed is not None:
            self.store.set_aside_run(run.id, RunState.DISTURBED, disturbed, result=kept)
            log.warning("run %s: %s; running it again", run.id, disturbed)
            return
        run = self.store.finish_run(run.id, status=result.status, val_bpb=result.val_bpb, metrics=result.metrics,
                                    error=result.error, log_tail=result.log_tail)
        log.info("run %s finished: %s %s", run.id, run.status,
                 f"val_bpb {run.val_bpb:.6f}" if run.val_bpb is not None else (run.error or ""))
        self._values = None
        if run.experiment_id is None:
            self._note_remeasured_delta(run.code_hash)

    def _give_up_on(self, run: Run, why: str) -> None:
        if run.experiment_id is None:
            self._block(self.read_main(), f"main's runs cannot be measured: {why}. The runner must run the "
                        "harness and data this conductor pinned when it started: update or re-prepare the runner, or "
                        "restart the conductor to pin what the runner has.")
            return
        exp = self.store.experiment(run.experiment_id)
        if exp.state != State.DONE:
            self._cancel_runs(exp, "its experiment failed")
            self.store.update_experiment(exp.id, state=State.DONE, status=Status.FAILED, reason=why,
                                         event=f"failed: {why}")

    def _note_remeasured_delta(self, code: str) -> None:
        """Once a kept experiment's new main has its fresh baseline, record the unselected delta."""
        values = self.main_values(code)
        if len(values) < self.read_main().settings.baseline_runs:
            return
        for exp in self.store.experiments(state=State.DONE):
            if exp.status == Status.KEEP and exp.code_hash == code and exp.remeasured_delta is None:
                old = self.main_values(exp.meta.get("main_code", ""))
                if old:
                    delta = statistics.fmean(values) - statistics.fmean(old)
                    self.store.update_experiment(exp.id, remeasured_delta=delta,
                                                 event=f"re-measured: the new main's fresh baseline is {delta:+.6f} "
                                                       f"against the old main's ({len(values)} run(s))")

    def _block(self, main: Main, message: str) -> None:
        self._blocked_code = main.code
        if self.blocked != message:
            self.blocked = message
            self.store.event(None, "blocked", message)
            log.error("%s", message)

    # --- reporting -------------------------------------------------------------------------------
    def in_flight(self) -> list[dict[str, Any]]:
        """The runs now running, with their latest progress, for a live display."""
        rows = []
        for run in self.store.runs(state=RunState.RUNNING):
            exp = self.store.experiment(run.experiment_id) if run.experiment_id else None
            rows.append({"run": run.id, "purpose": run.purpose, "experiment": exp.id if exp else None,
                         "title": exp.title if exp else "baseline of main", "progress": self.progress.get(run.id) or {}})
        return rows

    def summary(self) -> Summary:
        """Counts and main's numbers, from cached values: cheap enough for a live display."""
        counts = self.store.counts_by_status()
        main = self.read_main()
        values = self.main_values(main.code)
        counted = self._counted_values()
        first = next((code for code, _, purpose, _ in counted if purpose == "baseline"), None)
        baseline = [v for code, _, purpose, v in counted if code == first and purpose == "baseline"]
        return Summary(experiments=sum(counts.values()), kept=counts.get(Status.KEEP, 0),
                       discarded=counts.get(Status.DISCARD, 0), crashed=counts.get(Status.CRASH, 0),
                       failed=counts.get(Status.FAILED, 0),
                       baseline_val_bpb=statistics.fmean(baseline) if baseline else None,
                       best_val_bpb=statistics.fmean(values) if values else None, results_tsv=self.results_tsv,
                       stop_reason=self.blocked or self.stop_reason)


def _lesson(reason: str | None, limit: int = 160) -> str:
    """One line of why an experiment ended as it did: the first sentence of its reason."""
    line = (reason or "").strip().splitlines()[0] if (reason or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _error_tail(run: Run, lines: int = 20) -> str:
    text = (run.error or "").strip() or (run.log_tail or "").strip()
    return "\n".join(text.splitlines()[-lines:])
