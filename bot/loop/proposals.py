"""Proposals: asking the agent for the next experiment, and taking or refusing its answer.

The agent thinks on its own threads (bot.loop.agent_worker), so a tick never waits for it: one
tick asks, a later one collects the answer. It is asked while there is room: a proposal for every
slot and `lookahead` more prepared ahead, so a slot that frees never waits for the agent. Unless
the config sets it, the lookahead is paced (`paced_lookahead`): one more than the running runs due
to end before a proposal asked now would be ready (from its question to its first run queued, as
the latest took; a run as long as the latest), and one per slot until both are known. More would
only wait in the queue, and at 16 slots a keep then moves main under most of them: a rebase on
GitHub each, and proposals made without the results that came in meanwhile. As many
questions are open at once as that room needs, at most `max_open_questions` (None: one per slot,
so one slot asks one question at a time) and at most what the agent takes at once, each about its own experiment in state proposing, with
its own context: a ProposalContext (program.md's instructions, main's train.py and val_bpb, the
history with each experiment's lesson, people's feedback, the last unfixed crash, and the
proposals in flight with their diffs, "being tried now") that never shows the store. The store is
the truth: a conductor killed with questions open finds their experiments proposing and asks again,
one question each. While one question waits out a failure's backoff, no new one is opened. A tick
takes at most ANSWERS_PER_TICK answers (each makes a branch) and leaves the rest to the next tick,
which the driver starts at once, so the runs that end meanwhile are collected between them.

Proposals made at once do not repeat each other: each context lists the proposals in flight; the
offline explorer never hands out the same asset twice (bot.agent.explorer; the scripted agent,
whose queue has an order, takes one question at a time); and a repeat that still arrives (two LLM sessions that had the same idea) is
refused by the repeat check, and that refusal, of a proposal the question could not have known
of, is not counted toward `max_refusals`.

An answer is a Proposal, an AgentStopped (the agent has nothing more to propose: the loop stops
asking), or any other failure, an AgentError or not (asked again after a backoff; what the failed
attempt cost, AgentError.meta, is charged to the experiment). A proposal is refused, and the agent
asked again with the reason, when it repeats an earlier experiment or fails bot.core.validation;
`max_refusals` in a row stop the asking. An answer to a question asked on a main that has moved on
since (a keep, a push) is first carried onto main as it is now, merged as a rebase merges, so its
branch is made once, on the main it will run on (where the two changes overlap, it stays on the
old main, and its rebase ends it as a conflict, on record). A proposal taken becomes an
experiment and goes straight into the lifecycle. What answers cost
(Proposal.meta["cost_usd"]) adds up; once it reaches the budget, the agent is asked nothing more.
Questions in flight count against the budget at the highest cost of one answer so far (one at a
time until an answer has said what one costs): a question is asked only while what is spent plus
the others in flight stays under the budget, so the last one asked ends at most one question's
cost over it, as with one question at a time. A question abandoned at its time limit still counts
while its thread runs, and what its late answer cost is spent when it comes.

The history the agent is told of, and the code hashes a proposal must not repeat, are kept in
memory (bot.loop.history) and brought up to date with only what was written since the last
question.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from bot.core import validation
from bot.core.merge import merge_text
from bot.core.protocols import AgentError, AgentStopped, ForgeError, Runner
from bot.core.records import Proposal, ProposalContext, code_hash
from bot.core.states import RunState, State, Status
from bot.loop import measurement
from bot.loop.agent_worker import AgentWorker
from bot.loop.baseline import Baseline, Main
from bot.loop.history import History
from bot.loop.lifecycle import Backoff, Lifecycle
from bot.store import Experiment, Store
from runner.profiles import Profile

log = logging.getLogger(__name__)


IN_FLIGHT_DIFF_LINES = 40  # of one in-flight proposal's diff, in its context
# answers taken in one tick (each proposal makes a branch on the forge, a second or so): the rest
# wait for the next tick, which comes at once, so that runs ending meanwhile are collected and their
# slots filled between them instead of after a tick that makes sixteen branches
ANSWERS_PER_TICK = 2


@dataclass
class _Pending:
    """A proposal being prepared, and what the conductor told the agent about refusals."""

    exp_id: int
    notes: list[str] = field(default_factory=list)  # why earlier answers were refused, for the agent
    seen: set[str] = field(default_factory=set)  # code of the refused answers
    cost_usd: float = 0.0  # what the refused or skipped answers cost, charged to the experiment
    refusals: int = 0  # counted toward max_refusals: not those of a repeat it could not have known of
    told: set[str] = field(default_factory=set)  # the code hashes its last question was told of


PACING_SLACK = 1.5  # the time a proposal takes to be ready, counted half again: answers vary
PACED_FROM_RUN_S = 2.0  # runs shorter than this (a test's fakes, crashes at start) pace nothing


def paced_lookahead(slots: int, ready_s: float | None, run_s: float | None, ending: Callable[[float], int]) -> int:
    """Proposals to prepare beyond the free slots: one more than the running runs due to end
    before a proposal asked now is ready (`ending(horizon_s)`, the horizon `ready_s`, from a
    question to its first run queued, with PACING_SLACK), at most one per slot. Runs of one
    budget that started together end together, so the horizon sees a burst of them coming and
    prepares for each. One per slot while either time is unknown, or runs last less than
    PACED_FROM_RUN_S."""
    if ready_s is None or run_s is None or run_s < PACED_FROM_RUN_S:
        return slots
    return min(slots, ending(PACING_SLACK * ready_s) + 1)


class Proposals:
    def __init__(
        self,
        store: Store,
        worker: AgentWorker,
        baseline: Baseline,
        lifecycle: Lifecycle,
        runner: Runner,
        *,
        profile: Profile,
        max_experiments: int,
        max_refusals: int,
        lookahead: int | None,
        budget_usd: float | None,
        backoff: Backoff,
        clock: Callable[[], float],
        max_open_questions: int | None = None,
    ) -> None:
        if max_open_questions is not None and max_open_questions < 1:
            raise ValueError(
                f"max_open_questions must be at least 1 (got {max_open_questions}), or None for one per slot"
            )
        self.store = store
        self.worker = worker
        self.baseline = baseline
        self.lifecycle = lifecycle
        self.runner = runner
        self.profile = profile
        self.max_experiments = max_experiments  # 0: program.md's setting
        self.max_refusals = max_refusals
        self.lookahead = lookahead
        self.budget_usd = budget_usd
        self.backoff = backoff
        self.clock = clock
        self.max_open_questions = max_open_questions
        self.stopped = ""  # why the agent is asked nothing more: it gave up, was refused too often, or spent its budget
        self._pending: dict[int, _Pending] = {}  # experiment id -> its proposal being prepared
        self._history = History(store)
        # code -> validation.normal_hash of an experiment's asset: a history of a thousand is read
        # and parsed once, not at every proposal
        self._normal: dict[str, str | None] = {}
        self._answers_costed = 0  # answers whose cost was read (a free one included)
        self._most_usd = 0.0  # the highest cost of one answer so far: a question in flight counts at it
        self._diffs: dict[tuple[int, str, str], str] = {}  # (experiment, its code hash, main's) -> its diff

    @property
    def open_limit(self) -> int:
        """How many questions may be open at once: the setting, or one per slot, within what the
        agent takes at once (its `questions_at_once`, if it says)."""
        limit = self.max_open_questions or max(1, self.runner.slots)
        return min(limit, getattr(self.worker.agent, "questions_at_once", None) or limit)

    def _wanted(self, main: Main, stop_reason: str) -> int:
        """How many more questions to open: the free and soon-free slots' need (free slots plus the
        lookahead, less the runs waiting, the proposals not yet queued and the questions open),
        within the open-question limit and the target number of experiments."""
        if stop_reason or self.stopped or self.baseline.blocked:
            return 0
        target = self.max_experiments or main.settings.max_experiments
        left = target - self.store.experiments.count() if target else self.open_limit
        proposing = len(self.store.experiments.in_state(State.PROPOSING))
        waiting = self.store.runs.count(RunState.QUEUED, RunState.RUNNING)
        unqueued = sum(len(self.store.experiments.in_state(s)) for s in (State.PROPOSED, State.BRANCHED))
        if self.lookahead is not None:
            lookahead = self.lookahead
        else:
            runs, run_s = self.store.runs, self.store.runs.recent_length_s()
            lookahead = paced_lookahead(
                self.runner.slots, runs.recent_ready_s(), run_s, lambda horizon_s: runs.ending_within(horizon_s, run_s)
            )
        need = self.runner.slots + lookahead - waiting - unqueued - proposing
        return min(need, left, self.open_limit - proposing)

    def next_question_due_s(self, stop_reason: str) -> float | None:
        """Seconds until the paced lookahead grows by itself: a running run comes within the pacing
        horizon of its end, so a question should be open for the slot it will free. Nothing else
        announces that moment (no run ended, no answer came), so the driver wakes for it; waiting
        for its timer instead asked late and left the slot idle (bench/duty_cycle.py). None when
        the lookahead is not paced or nothing more will be asked."""
        if self.lookahead is not None or stop_reason or self.stopped or self.baseline.blocked:
            return None
        runs, run_s = self.store.runs, self.store.runs.recent_length_s()
        ready_s = runs.recent_ready_s()
        if ready_s is None or run_s is None or run_s < PACED_FROM_RUN_S:
            return None
        return runs.next_ending_within(PACING_SLACK * ready_s, run_s)

    def propose(self, main: Main, stop_reason: str) -> None:
        """Collect the answers there are (at most ANSWERS_PER_TICK; more waiting wake the driver
        again); ask again where an answer was refused or a backoff ran out; open new questions while
        there is room. An answer taken as a proposal makes room in the same tick: waiting for the
        next tick would leave the agent idle for up to the driver's timer, and with many slots the
        runners would wait for proposals (bench/duty_cycle.py)."""
        self._pay_for_late_answers()
        proposing = self.store.experiments.in_state(State.PROPOSING)
        taken = 0
        for exp in proposing:
            pending = self._pending.setdefault(exp.id, _Pending(exp.id))
            if taken >= ANSWERS_PER_TICK and self.worker.answered(exp.id):
                self.worker.remind()  # the next tick takes it, at once
                continue
            answer = self.worker.answer(exp.id)
            if answer is not None:
                self._take_answer(exp, pending, answer, main, stop_reason)
                taken += 1
            elif not self.worker.busy(exp.id) and (exp.retry_at or 0) <= self.clock() and not stop_reason:
                if not self.stopped:
                    self._ask(exp, main)
        still = {e.id: e for e in self.store.experiments.in_state(State.PROPOSING)} if proposing else {}
        self._pending = {exp_id: p for exp_id, p in self._pending.items() if exp_id in still}
        if any((e.retry_at or 0) > self.clock() for e in still.values()):
            return  # the agent failed: its backoff runs out before more questions are opened
        for _ in range(self._wanted(main, stop_reason)):
            if not self._affordable():
                return  # the questions in flight may spend what is left: their answers come first
            exp = self.store.experiments.start_proposing(main.sha)
            self._pending[exp.id] = _Pending(exp.id)
            if not self._ask(exp, main):
                return

    def _affordable(self) -> bool:
        """Whether one more question fits the budget, counting each answer not yet paid for (questions
        in flight, abandoned ones included: they may still be billed; answers not yet taken; late
        answers) at the highest cost of one answer so far; before any answer has said what one
        costs, only one question at a time."""
        if self.budget_usd is None:
            return True
        in_flight = self.worker.unpaid()
        if not in_flight:
            return True  # _ask stops at a spent budget
        if not self._answers_costed:
            return False
        return self.spent_usd() + in_flight * self._most_usd < self.budget_usd

    def _ask(self, exp: Experiment, main: Main) -> bool:
        """Ask about `exp` (proposing); False when nothing was asked: the budget is spent (the
        experiment is withdrawn), or the questions in flight or the open limit leave no room now
        (a later tick asks)."""
        budget, spent = self.budget_usd, self.spent_usd()
        if budget is not None and spent >= budget:
            reason = (
                f"the agent's budget of ${budget:.2f} is spent (${spent:.2f} so far); raise "
                "AUTORESEARCH_ANTHROPIC_BUDGET_USD (or --budget) to let it propose again"
            )
            self.store.experiments.withdraw_proposing(exp.id, reason)
            self._pending.pop(exp.id, None)
            self.stopped = reason
            log.warning("%s", reason)
            return False
        if not self._affordable():
            return False
        if exp.base_sha != main.sha:
            exp = self.store.experiments.update(exp.id, base_sha=main.sha)
        context = self.context(main, exp.id)
        asked = self.worker.ask(exp.id, context, limit=self.open_limit)
        if asked:
            self._pending.setdefault(exp.id, _Pending(exp.id)).told = context.seen_hashes
        return asked

    def _take_answer(
        self, exp: Experiment, pending: _Pending, answer: Proposal | BaseException, main: Main, stop_reason: str
    ) -> None:
        if isinstance(answer, AgentStopped):
            self.store.experiments.withdraw_proposing(exp.id, f"the agent has nothing more to propose ({answer})")
            self._pending.pop(exp.id, None)
            self.stopped = f"the agent has nothing more to propose ({answer})"
            return
        if isinstance(answer, BaseException):
            if isinstance(answer, AgentError):  # a skipped proposal was paid for
                pending.cost_usd += self._spend(answer.meta)
            failures = exp.failures + 1
            wait = self.backoff.after(failures)
            self.store.experiments.update(
                exp.id,
                failures=failures,
                retry_at=self.clock() + wait,
                event=f"the agent failed ({type(answer).__name__}: {answer}); "
                f"asking again in {wait:.0f}s (failure {failures})",
            )
            log.warning("agent failed (%s: %s); retrying in %.0fs", type(answer).__name__, answer, wait)
            return
        cost = self._spend(answer.meta)
        answer, base_sha = self._onto_main(exp, answer, main)
        problem = self.validate(answer, main, pending.seen)
        if problem is None:
            if base_sha != exp.base_sha:
                self.store.events.add(
                    exp.id,
                    "moved",
                    f"proposed on main {exp.base_sha[:7]}, which moved while the agent worked: "
                    f"its change merged onto main {main.sha[:7]}",
                )
            meta = (
                dict(answer.meta, cost_usd=round(cost + pending.cost_usd, 6))
                if cost or pending.cost_usd
                else answer.meta
            )
            exp = self.store.experiments.fill_proposal(
                exp.id,
                base_sha=base_sha,
                title=answer.title,
                hypothesis=answer.hypothesis,
                slug=answer.slug,
                code_hash=code_hash(answer.asset),
                asset=answer.asset,
                meta=meta,
            )
            if meta.get("fixes"):
                ended = "rejection" if meta.get("fixes_status") == "rejected" else "crash"
                self.store.events.add(exp.id, "fix", f"proposed as a fix of the {ended} of experiment {meta['fixes']}")
            log.info("experiment %s proposed: %s", exp.id, exp.title)
            self._pending.pop(exp.id, None)
            self.lifecycle.advance(exp, main)  # as far as its first run: a new experiment cannot merge yet
            # its run starts now if a slot is free: the other answers this tick takes (a branch each on
            # the forge) would hold it up until the tick's own dispatch
            self.lifecycle.runs.dispatch(main)
            return
        pending.cost_usd += cost
        digest = code_hash(answer.asset)
        crossed = self._crossed(answer.asset, pending, main)
        self.store.events.add(None, "refused", f"proposal {answer.title!r} refused: {problem}")
        log.warning("proposal %r refused: %s", answer.title, problem)
        pending.seen.add(digest)
        if crossed:
            problem += ", proposed while you worked on yours: propose something different"
        else:
            pending.refusals += 1
        pending.notes.append(f"(conductor) your proposal {answer.title!r} was refused: {problem}")
        if pending.refusals >= self.max_refusals:
            reason = f"the agent's last {pending.refusals} proposals were all refused"
            self.store.experiments.withdraw_proposing(exp.id, reason)
            self._pending.pop(exp.id, None)
            self.stopped = reason
            return
        if not stop_reason:
            self._ask(self.store.experiments.get(exp.id), main)

    def _onto_main(self, exp: Experiment, answer: Proposal, main: Main) -> tuple[Proposal, str]:
        """The answer and the main it is to be branched on: main as it is now, with the answer's
        change merged into main's asset as a rebase merges it, when main moved while the agent
        worked (the experiment's base is the main it was asked on); so its branch is made once, on
        the main it runs on, not on the old one and then rebased. The answer as it came, on the
        main it was asked on, where the merge cannot carry it: the two changes overlap (the rebase
        then ends it as a conflict, on record), or the merge failed."""
        if exp.base_sha == main.sha or self.baseline.code_at(exp.base_sha) == main.code_hash:
            return answer, main.sha  # main did not move, or only its other files did
        path = self.baseline.task.asset
        try:
            merged = merge_text(
                self.baseline.forge.read_file(exp.base_sha, path),
                main.asset,
                answer.asset,
                path=path,
                branch=f"the proposal {answer.title!r}",
            )
        except (ForgeError, OSError) as error:  # MergeConflict is a ForgeError
            log.info("proposal %r stays on main %s: %s", answer.title, exp.base_sha[:7], error)
            return answer, exp.base_sha
        return replace(answer, asset=merged), main.sha

    def validate(self, proposal: Proposal, main: Main, seen: set[str]) -> str | None:
        """Why the proposal cannot run, or None: it repeats no earlier experiment and passes
        bot.core.validation's checks."""
        self._history.refresh()
        digest = code_hash(proposal.asset)
        if digest in seen or (digest != main.code_hash and digest in self._history.seen_hashes()):
            earlier = self.store.experiments.by_code(digest)
            return f"it repeats experiment {earlier.id} ({earlier.title!r})" if earlier else "it repeats an earlier run"
        earlier = [(exp_id, title, self._normal_hash(code, exp_id)) for exp_id, title, code in self._history.codes()]
        return validation.problem(
            proposal.title, proposal.asset, main_asset=main.asset, earlier=earlier, task=self.baseline.task.name
        )

    def _crossed(self, asset: str, pending: _Pending, main: Main) -> bool:
        """Whether `asset` repeats (exactly, or up to comments and layout) a proposal made while its
        question was open, another question's answer: it could not have known of it, so its refusal
        is no fault of its own."""
        digest = code_hash(asset)
        if digest == main.code_hash:
            # main's own code: no change at all, where it was told of this main; otherwise a change
            # main took while it was asked (a keep of the same idea), its answer merged onto it
            return digest not in pending.told
        if digest in pending.told:
            return False
        if digest in self._history.seen_hashes():
            return True
        normal = validation.normal_hash(asset, self.baseline.task.name)
        return any(
            code not in pending.told and self._normal_hash(code, exp_id) == normal
            for exp_id, _, code in self._history.codes()
        )

    def _normal_hash(self, code: str, exp_id: int) -> str | None:
        if code not in self._normal:
            asset = self.store.experiments.get(exp_id).asset or ""
            self._normal[code] = validation.normal_hash(asset, self.baseline.task.name)
        return self._normal[code]

    def context(self, main: Main, exp_id: int | None = None) -> ProposalContext:
        """What the agent is told about experiment `exp_id`: everything it needs, nothing of the
        store itself."""
        self._history.refresh()
        crash = self._history.unfixed_crash()
        pending = self._pending.get(exp_id) if exp_id is not None else None
        notes = pending.notes if pending else []
        seen = pending.seen if pending else set()
        return ProposalContext(
            program_md=main.instructions,
            asset=main.asset,
            main_sha=main.sha,
            main_val_bpb=measurement.main_value(self.baseline.values(), main.code_hash),
            history=self._history.entries(),
            feedback=self.store.feedback.recent() + notes,
            last_crash=crash.error_tail if crash else None,
            last_crash_status=crash.status if crash else Status.CRASH,
            last_crash_id=crash.id if crash else None,
            seen_hashes=self._history.seen_hashes() | seen | {main.code_hash},
            profile=self.profile.name,
            device_kind=self.profile.device,
            spent_usd=self.spent_usd(),
            task=self.baseline.task.name,
            in_flight=self._in_flight(main),
        )

    def _in_flight(self, main: Main) -> dict[int, str]:
        """Each proposal not judged yet -> its change to main's asset ('' when made on another main)."""
        running = {e.id: (e.id, e.code_hash, main.code_hash) for e in self._history.entries() if e.status == "running"}
        unread = {exp_id for exp_id, key in running.items() if key not in self._diffs}
        if unread:
            for e in self.store.experiments.several(unread):
                diff = _diff(main.asset, e.asset) if e.base_sha == main.sha else ""
                self._diffs[(e.id, e.code_hash or "", main.code_hash)] = diff
            live = set(running.values())
            self._diffs = {key: diff for key, diff in self._diffs.items() if key in live}
        return {exp_id: self._diffs.get(key, "") for exp_id, key in running.items()}

    # --- what proposals cost (an LLM agent reports it in Proposal.meta["cost_usd"]) ----------------
    def spent_usd(self) -> float:
        return self.store.state.spent_usd

    def _pay_for_late_answers(self) -> None:
        """Spend what the answers of abandoned questions cost (a proposal's or a failed attempt's
        meta), with an event that says so: they are ignored, not free."""
        for answer in self.worker.late_answers():
            if not isinstance(answer, (Proposal, AgentError)):
                continue  # a failure that says nothing of what it cost: as when it is taken (_take_answer)
            cost = self._spend(answer.meta)
            if cost:
                what = f"proposal {answer.title!r}" if isinstance(answer, Proposal) else type(answer).__name__
                self.store.events.add(
                    None, "late", f"a question abandoned at its time limit answered later ({what}): ${cost:.4f} spent"
                )
                log.warning("an abandoned question answered late (%s): $%.4f spent", what, cost)

    def _spend(self, meta: dict[str, Any] | None) -> float:
        """Add what one answer cost to what is spent; it may raise what a question in flight counts."""
        cost = float((meta or {}).get("cost_usd") or 0.0)
        self._answers_costed += 1
        self._most_usd = max(self._most_usd, cost)
        if cost:
            self.store.state.spent_usd += cost
        return cost


def _diff(before: str, after: str | None, limit: int = IN_FLIGHT_DIFF_LINES) -> str:
    """A unified diff of an asset's change, cut to `limit` lines."""
    lines = list(difflib.unified_diff(before.splitlines(), (after or "").splitlines(), lineterm="", n=1))[2:]
    return "\n".join(lines if len(lines) <= limit else [*lines[:limit], f"... ({len(lines) - limit} more lines)"])
