"""Proposals: asking the agent for the next experiment, and taking or refusing its answer.

The agent thinks on its own thread (bot.loop.agent_worker), so a tick never waits for it: one tick
asks, a later one collects the answer. It is asked while there is room: a proposal for every slot
and `lookahead` more prepared ahead, so a slot that frees never waits for the agent. It gets a
ProposalContext (program.md's instructions, main's train.py and val_bpb, the history with each
experiment's lesson, people's feedback, the last unfixed crash) and never sees the store.

An answer is a Proposal, an AgentStopped (the agent has nothing more to propose: the loop stops
asking), or any other failure, an AgentError or not (asked again after a backoff; what the failed
attempt cost, AgentError.meta, is charged to the experiment). A proposal is refused, and the agent
asked again with the reason, when it repeats an earlier experiment or fails bot.core.validation;
`max_refusals` in a row stop the asking. A proposal taken becomes an experiment and goes straight
into the lifecycle. What answers cost (Proposal.meta["cost_usd"]) adds up; once it reaches the
budget, the agent is asked nothing more.

The history the agent is told of, and the code hashes a proposal must not repeat, are kept in
memory (_History) and brought up to date with only the experiments and runs written since the last
question: asking costs about the same at experiment 1000 as at 10.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bot.core import validation
from bot.core.protocols import AgentError, AgentStopped, Runner
from bot.core.records import HistoryEntry, Proposal, ProposalContext, code_hash
from bot.core.states import RunState, State, Status
from bot.loop import measurement
from bot.loop.agent_worker import AgentWorker
from bot.loop.baseline import Baseline, Main
from bot.loop.lifecycle import Backoff, Lifecycle
from bot.store import Experiment, Store
from runner.profiles import Profile

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    """The proposal being prepared, and what the conductor told the agent about refusals."""

    exp_id: int
    notes: list[str] = field(default_factory=list)  # why earlier answers were refused, for the agent
    seen: set[str] = field(default_factory=set)  # code of the refused answers
    cost_usd: float = 0.0  # what the refused or skipped answers cost, charged to the experiment


@dataclass(frozen=True)
class _Known:
    """One proposed experiment as the agent is told of it, with what the proposal checks need."""

    entry: HistoryEntry
    state: str
    code_hash: str | None
    has_asset: bool
    fixes: object  # meta["fixes"]: the crashed experiment it claims to fix, if any


def _known(e: Experiment) -> _Known:
    entry = HistoryEntry(
        id=e.id,
        title=e.title,
        hypothesis=e.hypothesis,
        status=e.status or "running",
        val_bpb=e.val_bpb,
        delta=e.delta,
        code_hash=e.code_hash or "",
        meta=e.meta,
        error_tail=e.error_tail,
        margin=e.margin,
        lesson=_lesson(e.reason),
    )
    return _Known(entry, e.state, e.code_hash, e.asset is not None, e.meta.get("fixes"))


class _History:
    """Every proposed experiment (not those the agent is still proposing) and every run's code
    hash, held in memory. refresh() reads only what was written since it last did: the experiments
    bot.store.experiments counts as written since, and the runs with higher ids. Its entries are
    shared by the contexts given to the agent, which only reads them."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._version: int | None = None  # the experiments' write count it reflects; None: read them all
        self._known: dict[int, _Known] = {}
        self._last_run = 0  # the highest run id whose code hash is in _run_hashes
        self._run_hashes: set[str] = set()

    def refresh(self) -> None:
        experiments = self.store.experiments
        version = experiments.version
        if self._version is None:
            self._known = {e.id: _known(e) for e in experiments.all()}
            self._last_run, self._run_hashes = 0, set()
        else:
            changed = experiments.changed_since(self._version)
            fresh = {e.id: e for e in experiments.several(changed) if e.state != State.PROPOSING}
            top = next(reversed(self._known), 0)
            unordered = any(exp_id < top and exp_id not in self._known for exp_id in fresh)
            for exp_id in changed - fresh.keys():
                self._known.pop(exp_id, None)
            for exp_id in sorted(fresh):
                self._known[exp_id] = _known(fresh[exp_id])
            if unordered:  # a new entry below the highest id: put it in its place
                self._known = dict(sorted(self._known.items()))
        for run_id, code in experiments.run_code_hashes(after=self._last_run):
            self._run_hashes.add(code)
            self._last_run = run_id
        # what is read inside a transaction may yet be rolled back: read it all again next time
        self._version = None if self.store.db.in_transaction else version

    def entries(self) -> list[HistoryEntry]:
        """In id order."""
        return [k.entry for k in self._known.values()]

    def seen_hashes(self) -> set[str]:
        """The hash of every train.py proposed or run."""
        return {k.code_hash for k in self._known.values() if k.code_hash is not None} | self._run_hashes

    def codes(self) -> list[tuple[int, str, str]]:
        """(id, title, code_hash) of every experiment with a proposed train.py, in id order."""
        return [
            (k.entry.id, k.entry.title, k.code_hash)
            for k in self._known.values()
            if k.code_hash is not None and k.has_asset
        ]

    def unfixed_crash(self) -> HistoryEntry | None:
        """The latest finished experiment if it crashed (or was rejected) and no experiment yet
        claims to fix it: its traceback (or the rejection's reason) goes to the agent, so that one
        fix is tried, once."""
        last = next((k for k in reversed(self._known.values()) if k.state == State.DONE), None)
        if last is None or last.entry.status not in (Status.CRASH, Status.REJECTED):
            return None
        return None if any(k.fixes == last.entry.id for k in self._known.values()) else last.entry


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
    ) -> None:
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
        self.stopped = ""  # why the agent is asked nothing more: it gave up, was refused too often, or spent its budget
        self._pending: _Pending | None = None
        self._history = _History(store)
        # code -> validation.normal_hash of an experiment's asset: a history of a thousand is read
        # and parsed once, not at every proposal
        self._normal: dict[str, str | None] = {}

    def room(self, main: Main, stop_reason: str) -> bool:
        """Whether to start preparing another proposal: the loop goes on, and the slots with the
        proposals prepared ahead are not yet all spoken for."""
        target = self.max_experiments or main.settings.max_experiments
        if stop_reason or self.baseline.blocked or (target and self.store.experiments.count() >= target):
            return False
        waiting = self.store.runs.count(RunState.QUEUED, RunState.RUNNING)
        unqueued = sum(len(self.store.experiments.in_state(s)) for s in (State.PROPOSED, State.BRANCHED))
        lookahead = self.runner.slots if self.lookahead is None else self.lookahead
        return self.runner.slots + lookahead - waiting - unqueued > 0

    def propose(self, main: Main, stop_reason: str) -> None:
        """Collect the agent's answer if there is one; ask again or afresh when there is room. An
        answer taken as a proposal makes room for the next question in the same tick: waiting for
        the next tick would leave the agent idle for up to the driver's timer, and with many slots
        the runners would wait for proposals (bench/duty_cycle.py)."""
        proposing = self.store.experiments.in_state(State.PROPOSING)
        if proposing:
            exp = proposing[0]
            if self._pending is None or self._pending.exp_id != exp.id:
                self._pending = _Pending(exp.id)
            answer = self.worker.answer(exp.id)
            if answer is not None:
                self._take_answer(exp, answer, main, stop_reason)
                if self._pending is not None or self.store.experiments.in_state(State.PROPOSING):
                    return  # refused, failed or withdrawn: the next tick decides
            else:
                if not self.worker.busy(exp.id) and (exp.retry_at or 0) <= self.clock() and not stop_reason:
                    self._ask(exp, main)
                return
        if self.room(main, stop_reason):
            exp = self.store.experiments.start_proposing(main.sha)
            self._pending = _Pending(exp.id)
            self._ask(exp, main)

    def _ask(self, exp: Experiment, main: Main) -> None:
        budget, spent = self.budget_usd, self.spent_usd()
        if budget is not None and spent >= budget:
            reason = (
                f"the agent's budget of ${budget:.2f} is spent (${spent:.2f} so far); raise "
                "AUTORESEARCH_ANTHROPIC_BUDGET_USD (or --budget) to let it propose again"
            )
            self.store.experiments.withdraw_proposing(exp.id, reason)
            self.stopped = reason
            log.warning("%s", reason)
            return
        if exp.base_sha != main.sha:
            exp = self.store.experiments.update(exp.id, base_sha=main.sha)
        self.worker.ask(exp.id, self.context(main))

    def _take_answer(self, exp: Experiment, answer: Proposal | BaseException, main: Main, stop_reason: str) -> None:
        pending = self._pending or _Pending(exp.id)
        if isinstance(answer, AgentStopped):
            self.store.experiments.withdraw_proposing(exp.id, f"the agent has nothing more to propose ({answer})")
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
        problem = self.validate(answer, main, pending.seen)
        if problem is None:
            meta = (
                dict(answer.meta, cost_usd=round(cost + pending.cost_usd, 6))
                if cost or pending.cost_usd
                else answer.meta
            )
            exp = self.store.experiments.fill_proposal(
                exp.id,
                title=answer.title,
                hypothesis=answer.hypothesis,
                slug=answer.slug,
                code_hash=code_hash(answer.asset),
                asset=answer.asset,
                meta=meta,
            )
            if meta.get("fixes"):
                self.store.events.add(exp.id, "fix", f"proposed as a fix of the crash of experiment {meta['fixes']}")
            log.info("experiment %s proposed: %s", exp.id, exp.title)
            self._pending = None
            self.lifecycle.advance(exp, main)  # as far as its first run: a new experiment cannot merge yet
            return
        pending.cost_usd += cost
        self.store.events.add(None, "refused", f"proposal {answer.title!r} refused: {problem}")
        log.warning("proposal %r refused: %s", answer.title, problem)
        pending.seen.add(code_hash(answer.asset))
        pending.notes.append(f"(conductor) your proposal {answer.title!r} was refused: {problem}")
        refusals = len(pending.notes)
        if refusals >= self.max_refusals:
            reason = f"the agent's last {refusals} proposals were all refused"
            self.store.experiments.withdraw_proposing(exp.id, reason)
            self.stopped = reason
            return
        if not stop_reason:
            self._ask(self.store.experiments.get(exp.id), main)

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

    def _normal_hash(self, code: str, exp_id: int) -> str | None:
        if code not in self._normal:
            asset = self.store.experiments.get(exp_id).asset or ""
            self._normal[code] = validation.normal_hash(asset, self.baseline.task.name)
        return self._normal[code]

    def context(self, main: Main) -> ProposalContext:
        """What the agent is told: everything it needs, nothing of the store itself."""
        self._history.refresh()
        crash = self._history.unfixed_crash()
        notes = self._pending.notes if self._pending else []
        seen = self._pending.seen if self._pending else set()
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
        )

    # --- what proposals cost (an LLM agent reports it in Proposal.meta["cost_usd"]) ----------------
    def spent_usd(self) -> float:
        return self.store.state.spent_usd

    def _spend(self, meta: dict[str, Any] | None) -> float:
        cost = float((meta or {}).get("cost_usd") or 0.0)
        if cost:
            self.store.state.spent_usd += cost
        return cost


def _lesson(reason: str | None, limit: int = 160) -> str:
    """One line of why an experiment ended as it did: the first sentence of its reason."""
    line = (reason or "").strip().splitlines()[0] if (reason or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"
