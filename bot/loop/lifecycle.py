"""The experiment lifecycle: each experiment moved from its proposal to its end, one state at a time.

The states and the moves between them are bot.core.states'; each move is written to the store
before its side effect, and every side effect is safe to repeat, so a conductor killed anywhere
resumes where it stopped. First what people asked for (a Request: cancel, discard, reopen, rerun,
keep anyway), then every active experiment as far as it goes without waiting:

    proposed   push its branch (one commit on main); this and the rebase below may be made off the
               conductor's thread (bot.loop.forge_calls), the step then waits for a later tick.
               Where the branch policy says it can wait (bot.loop.branching: on GitHub, with a
               runner that carries the asset, until a run of it starts), it goes on without one and
               gets it on the first tick the policy wants it; a keep gets it before its merge
    branched   queue its candidate run (with screening on, a short run first: bot.loop.screening)
    measuring  wait for its runs and main's runs queued before them (main's first runs, those
               beside its confirmation), then the judge (bot.loop.judge) decides from the numbers
               alone: keep, discard, crash, rejected, one confirmation run more, or a re-measure on a newer
               main; a change that makes train.py smaller (bot.core.simplicity) may be kept for
               simplicity; one that keeps main's parameters (any, where the task's seeds pair) is
               also compared with main seed for seed (its confirmation then queues main's run
               under its seed when main lacks it). Measured on a main that has moved on since, a
               change that came out no better than that main is discarded there; one that
               improved on it is re-measured
    rebasing   re-graft its change onto the new main and queue a re-measure (or follow a main whose
               train.py did not change: its runs still count); without a branch yet, in memory: the
               same 3-way merge, no forge call (a proposal overtaken by a keep before it ran)
    merging    its train.py's runs as the next main are queued first and start on the slots the
               keep frees (bot.loop.baseline.Baseline.queue_ahead; set aside if the merge fails);
               fast-forward main to its measured commit (pushed now if it has no branch yet),
               compare-and-swap on the main it was measured against; where a merge gate says
               people should see it first (full mode on GitHub: its pull request, which GitHub
               refuses for a branch main already holds), it waits for that, for a bounded time
               (bot.loop.merge_gate)
    closing    mark its branch closed with its verdict (one never pushed: pushed first if the
               policy wants it, else nothing to mark); done

`judge_all()` does what needs no forge (people's requests, the verdicts on main) early in the tick,
`advance_all()` the rest. A step that fails is retried with backoff; after `step_retries` failures
the experiment ends as `failed` and the loop goes on. `advance()` says when a merge moved main, so
the tick reads it again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

from bot.core import simplicity
from bot.core.protocols import BranchPolicy, EveryBranch, Forge, MainMoved, MergeConflict
from bot.core.records import code_hash, full_budget
from bot.core.states import Request, RunState, State, Status
from bot.loop import measurement, screening
from bot.loop.baseline import Baseline, Main
from bot.loop.branching import Branching
from bot.loop.forge_calls import PENDING, ForgeWorker, InlineCalls
from bot.loop.judge import decide, judge_config, standard_error
from bot.loop.merge_gate import Gate, MergeWait
from bot.loop.runs import Runs
from bot.store import Experiment, Run, Store, failpoint
from bot.store.runs import ahead_of, is_ahead

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Backoff:
    """The wait after the n-th failure in a row: base * 2**(n-1) seconds, at most `max_s`."""

    base_s: float
    max_s: float

    def after(self, failures: int) -> float:
        return min(self.max_s, self.base_s * 2 ** (failures - 1))


class Lifecycle:
    def __init__(
        self,
        store: Store,
        forge: Forge,
        baseline: Baseline,
        runs: Runs,
        *,
        identity: dict[str, str],
        profile: str,
        step_retries: int,
        backoff: Backoff,
        clock: Callable[[], float],
        merge_gate: Gate | None = None,
        calls: InlineCalls | ForgeWorker | None = None,
        branches: BranchPolicy | None = None,
    ) -> None:
        self.store = store
        self.forge = forge
        self.baseline = baseline
        self.runs = runs
        self.identity = identity
        self.profile = profile
        self.step_retries = step_retries
        self.backoff = backoff
        self.clock = clock
        self.calls = calls or InlineCalls(forge)  # the branch and rebase writes (bot.loop.forge_calls)
        self.branching = Branching(  # when an experiment's branch is pushed, and what it does without one
            store,
            forge,
            self.calls,
            branches or EveryBranch(),
            asset=baseline.task.asset,
            backoff=backoff,
            clock=clock,
        )
        self.merge_wait = MergeWait(store, merge_gate, clock=clock)  # what people see of a keep first
        self.screening = screening.Screening(store, baseline, runs, identity=identity, profile=profile)

    def judge_all(self, main: Main) -> None:
        """Act on what people asked for, then give the judge's verdict to every experiment measured
        on main whose runs are in. Neither needs the forge, so the tick does this before it fills a
        freed slot: the runs a verdict asks for (a confirmation, main's run beside it) are queued
        before the slot goes to the next candidate, and a keep stops runs on a main about to move."""
        for exp in self.store.experiments.requested():
            self._act_on_request(exp, main)
        measuring = [e for e in self.store.experiments.in_state(State.MEASURING) if e.base_sha == main.sha]
        waiting = self.store.runs.waiting_experiments([e.id for e in measuring])  # their own runs are not in
        measuring = [e for e in measuring if e.id not in waiting]
        if not measuring:
            return
        runs = self.store.runs.of_experiments([e.id for e in measuring])  # one read for all of them
        pending = self._main_pending(main)
        now = self.clock()
        for exp in measuring:
            if exp.retry_at and exp.retry_at > now:
                continue
            try:
                self._step_measuring(exp, main, runs[exp.id], pending)
            except Exception as error:  # noqa: BLE001 - one experiment's failure must not stop the loop
                self._step_failed(self.store.experiments.get(exp.id), f"{type(error).__name__}: {error}")

    def regraft_ahead(self, main: Main) -> int:
        """While a keep waits to be merged, the changes queued on main that have not run yet are
        re-grafted onto the kept train.py, main's next, and their runs queued ahead of the merge
        (their base: bot.store.runs.ahead_of the kept train.py). The slots the keep frees start
        them at once, where they waited for the merge and then for the re-grafts. Once main is the
        kept train.py, each experiment adopts its run (_adopt_ahead: the same 3-way merge, made
        before); a merge that fails stops them (Runs.cancel_ahead). Only changes without a branch:
        a branch is rebased by the forge, onto a commit that must exist first. Returns how many it
        queued."""
        # the keep merged first where several wait: advance_all's order
        kept = next((e for e in self.store.experiments.in_state(State.MERGING) if e.base_sha == main.sha), None)
        if kept is None or not kept.asset:
            return 0
        queued = 0
        waiting = [
            e
            for e in self.store.experiments.in_state(State.MEASURING)
            if e.base_sha == main.sha and e.head_sha is None and e.asset and not screening.pending(e)
        ]
        runs = self.store.runs.of_experiments([e.id for e in waiting])
        following = Main(ahead_of(kept.code_hash), kept.asset, kept.code_hash, main.instructions, main.settings)
        for exp in waiting:
            own = runs[exp.id]
            if any(is_ahead(r.base_sha) and r.state != RunState.CANCELLED for r in own):
                continue  # re-grafted ahead already
            if not any(r.state == RunState.QUEUED for r in own) or any(
                r.state not in (RunState.QUEUED, RunState.CANCELLED) for r in own if r.base_sha == main.sha
            ):
                continue  # it ran on this main (its result is judged where it ran), or nothing of it waits
            try:
                text = self.branching.regrafted(exp, following)
            except MergeConflict:
                continue  # discarded once main has moved, as before
            if code_hash(text) == kept.code_hash:
                continue
            self.store.runs.add(
                experiment_id=exp.id,
                purpose="remeasure",
                code_hash=code_hash(text),
                commit_sha="",
                base_sha=ahead_of(kept.code_hash),
                asset=text,
                profile=self.profile,
                main_code=kept.code_hash,
                reason=f"re-grafted onto experiment {kept.id}'s {self.baseline.task.asset}, main once it is merged",
            )
            queued += 1
        return queued

    def advance_all(self, main: Main) -> bool:
        """Advance every active experiment but those measured on main (judge_all's); True when a
        merge moved main (the rest of the tick must read it again)."""
        merged = False
        for exp in self.store.experiments.active():
            if merged and exp.state == State.MERGING:
                continue  # main just moved: a second keep on the old main is re-measured, with the new main
            if exp.state != State.PROPOSING and not (exp.state == State.MEASURING and exp.base_sha == main.sha):
                merged = self.advance(exp, main) or merged
        try:
            self.branching.push_wanted()
        except Exception as error:  # noqa: BLE001 - a branch people read must not lose the tick its merge
            log.warning(
                "pushing the wanted branches failed (%s: %s); trying again next tick", type(error).__name__, error
            )
        return merged

    def _main_pending(self, main: Main) -> list[int]:
        """The ids of main's own runs queued or running, which a verdict may wait for (see
        _waits_for_main); none while main is blocked: its runs do not start then."""
        if self.baseline.blocked:
            return []
        return [
            r.id
            for r in self.store.runs.all(code_hash=main.code_hash)
            if r.purpose == "baseline" and r.state in (RunState.QUEUED, RunState.RUNNING)
        ]

    def _waits_for_main(self, main: Main, last_run: int, pending: list[int]) -> bool:
        """Whether the verdict on an experiment whose last run is `last_run` waits for main's runs
        `pending`: those queued before that run (main's runs beside its confirmation, main's first
        runs), and any while main has fewer runs than it wants (one lost or crashed is run again).
        Main's runs queued later, beside another experiment's confirmation, are not waited for:
        with many slots some always are, and a verdict that waits keeps main from moving. A run
        waited for ends (done, lost or cancelled): the wait cannot last for ever."""
        if not pending:
            return False
        if min(pending) < last_run:
            return True
        return len(self.baseline.main_values(main.code_hash)) < self.baseline.runs_wanted(main)

    # --- what people asked for (bot.core.states.Request), acted on before the lifecycle moves ---------
    def _act_on_request(self, exp: Experiment, main: Main) -> None:
        request, who = Request(exp.request), exp.request_by or "someone"
        done = exp.state == State.DONE
        if request in (Request.CANCEL, Request.DISCARD) and not done and exp.state not in (State.CLOSING,):
            status = Status.CANCELLED if request == Request.CANCEL else Status.DISCARD
            why = f"its pull request was closed by {who}" if request == Request.CANCEL else f"discarded by {who}"
            self.runs.cancel(exp, why)
            if exp.state == State.MERGING:
                self.runs.cancel_ahead(why, kept=exp)
            self.store.experiments.update(
                exp.id, state=State.CLOSING, status=status, reason=why, request=None, event=why
            )
            return
        if request in (Request.REOPEN, Request.RERUN, Request.KEEP) and done and exp.status != Status.KEEP:
            meta = dict(exp.meta, keep_anyway=who) if request == Request.KEEP else exp.meta
            self.store.experiments.update(
                exp.id,
                state=State.BRANCHED,
                status=None,
                reason=None,
                val_bpb=None,
                delta=None,
                margin=None,
                failures=0,
                retry_at=None,
                request=None,
                meta=meta,
                reopened=exp.reopened + 1,  # the publisher shows the round even if it ends before it looks
                event=f"{request} by {who}: measured again",
            )
            return
        if request == Request.RERUN and exp.state == State.MEASURING:
            self.runs.queue(exp, "confirm", f"/rerun by {who}")
        if request == Request.KEEP and not done:
            self.store.experiments.update(exp.id, meta=dict(exp.meta, keep_anyway=who))
        self.store.experiments.update(
            exp.id,
            request=None,
            event=f"{request} by {who}: {'done' if not done else 'nothing to do, it is ' + str(exp.status)}",
        )

    # --- the moves -------------------------------------------------------------------------------
    def advance(self, exp: Experiment, main: Main) -> bool:
        """Do the next step of one experiment and the steps after it that need no waiting; True when
        one of them merged it into main. A failing step stays with its experiment (retried with
        backoff, then failed): it never stops the loop."""
        if exp.retry_at and exp.retry_at > self.clock():
            return False
        merged = False
        try:
            while exp.state != State.DONE:
                after = getattr(self, f"_step_{exp.state}")(exp, main)
                if after is None:
                    break
                merged = merged or (after.merged_sha is not None and exp.merged_sha is None)
                exp = after
        except Exception as error:  # noqa: BLE001 - one experiment's failure must not stop the loop
            self._step_failed(self.store.experiments.get(exp.id), f"{type(error).__name__}: {error}")
        return merged

    def _step_failed(self, exp: Experiment, what: str) -> None:
        failures = exp.failures + 1
        if failures >= self.step_retries and exp.merged_sha:  # main holds it: it stays kept
            self.store.experiments.update(
                exp.id,
                state=State.DONE,
                failures=failures,
                reason=f"{exp.reason} (closing its branch failed: {what})",
                event=f"keep: merged, but closing its branch failed {failures} times ({what})",
            )
            return
        if failures >= self.step_retries:
            self.runs.cancel(exp, "its experiment failed")
            if exp.state == State.MERGING:
                self.runs.cancel_ahead(f"experiment {exp.id} failed before its merge", kept=exp)
            self.store.experiments.update(
                exp.id,
                state=State.DONE,
                status=Status.FAILED,
                failures=failures,
                reason=f"its {exp.state} step failed {failures} times; last: {what}",
                event=f"failed: the {exp.state} step failed {failures} times ({what})",
            )
            log.error("experiment %s failed at %s: %s", exp.id, exp.state, what)
            return
        wait = self.backoff.after(failures)
        self.store.experiments.update(
            exp.id,
            failures=failures,
            retry_at=self.clock() + wait,
            event=f"the {exp.state} step failed ({what}); retrying in {wait:.0f}s",
        )
        log.warning("experiment %s: %s step failed (%s); retrying in %.0fs", exp.id, exp.state, what, wait)

    def _step_proposed(self, exp: Experiment, main: Main) -> Experiment | None:
        if self.branching.waits_at_proposal(exp):
            return self.store.experiments.update(
                exp.id, state=State.BRANCHED, event="its branch waits until it is wanted (a run of it starts)"
            )
        pushed = self.branching.push(exp)
        if pushed is None:
            return None
        return self.store.experiments.update(pushed.id, state=State.BRANCHED)

    def _step_branched(self, exp: Experiment, main: Main) -> Experiment:
        if self.screening.wanted(exp, main):  # a short run first (bot.loop.screening)
            return self.screening.start(exp, main)
        self.store.runs.add(
            experiment_id=exp.id,
            purpose="candidate",
            code_hash=exp.code_hash,
            commit_sha=exp.head_sha or "",
            base_sha=exp.base_sha,
            asset=exp.asset,
            profile=self.profile,
            main_code=self.baseline.code_at(exp.base_sha),
            experiment_fields={"state": State.MEASURING},
        )
        return self.store.experiments.get(exp.id)

    def _step_measuring(
        self, exp: Experiment, main: Main, runs: list[Run] | None = None, main_pending: list[int] | None = None
    ) -> Experiment | None:
        """Wait for the experiment's runs and main's, then judge. `runs` (the experiment's, as read
        this tick) and `main_pending` (see _main_pending) are read here when not given."""
        if runs is None:
            runs = self.store.runs.all(experiment_id=exp.id)
        if screening.pending(exp):  # its short run's verdict first; promoted, its full run is queued
            screened = self.screening.step(exp, main, runs)
            if screened is None or screened.state != State.MEASURING:
                return screened
            exp, runs = screened, self.store.runs.all(experiment_id=exp.id)
        runs = [r for r in runs if r.code_hash == exp.code_hash]
        waiting = [r for r in runs if r.state in (RunState.QUEUED, RunState.RUNNING)]
        if exp.base_sha != main.sha:
            if self.baseline.code_at(exp.base_sha) == main.code_hash:  # main moved, its train.py did not (program.md)
                return self._follow_main(exp, main.sha)
            if any(r.state == RunState.RUNNING for r in waiting):
                return None  # let it finish: judged against the main it ran on, a loss needs no re-measure
            adopted = self._adopt_ahead(exp, main)
            if adopted is not None:
                return adopted
            self.runs.cancel(exp, f"main moved to {main.sha[:7]} before it ran")
            waiting = []
        if waiting:
            return None
        counted = [r for r in runs if r.state == RunState.DONE]
        failed = next((r for r in counted if r.status in ("crash", "rejected")), None)  # no number: judged at once
        full = [r for r in counted if full_budget(r.purpose)]  # a short run's value is not a full run's
        candidate = [value.val_bpb for value in measurement.counted(full, self.identity)]
        if not candidate and failed is None and exp.base_sha == main.sha:
            self.runs.queue(exp, "candidate", "no run under the pinned harness and data")
            return None
        if failed is None and exp.base_sha == main.sha:
            if main_pending is None:
                main_pending = self._main_pending(main)
            if not self.baseline.main_values(main.code_hash) or self._waits_for_main(
                main, max(r.id for r in runs), main_pending
            ):
                return None  # the runs of main it is judged with come first (a crash or rejection: at once)
        if exp.base_sha != main.sha and candidate and failed is None and not exp.meta.get("keep_anyway"):
            lost = self._worse_where_it_ran(exp, main, candidate)
            if lost is not None:
                return lost
        # sizing a train.py takes tens of milliseconds: only for a verdict that can use it (on this
        # main, with a number), not for a re-measure or a crash, which come in waves after a keep
        judged_here = failed is None and bool(candidate) and exp.base_sha == main.sha
        simpler = simplicity.simplification(main.asset, exp.asset) if exp.asset and judged_here else None
        pairs = self.baseline.pairs_of(exp.id, exp.code_hash) if exp.code_hash else None
        decision = decide(
            candidate=candidate,
            crash=(failed.error or "crashed") if failed and failed.status == "crash" else None,
            rejected=(failed.error or "") if failed and failed.status == "rejected" else None,
            main=self.baseline.main_values(main.code_hash),
            noise=self.baseline.noise(),
            measured_on=exp.base_sha,
            current_main=main.sha,
            config=judge_config(main.settings),
            simpler=simpler,
            pairs=pairs,
        )
        if decision.action == "wait":
            return None
        for_simplicity = decision.action == "keep" and decision.loss_margin is not None
        who = exp.meta.get("keep_anyway")
        if who and decision.action in ("confirm", "discard") and decision.val_bpb is not None:
            decision = replace(
                decision, action="keep", reason=f"kept by {who} over the judge, who said: {decision.reason}"
            )
        if decision.action == "confirm":  # main's runs beside it first: its verdict waits for them
            for _ in range(decision.extra_main_runs):
                self.baseline.queue_run(main, f"beside the confirmation of experiment {exp.id}")
            if pairs is not None:  # it pairs with main: main runs under the confirmation's seed too
                seed = self.store.runs.next_seed(exp.code_hash, main.code_hash)
                if seed not in self.store.runs.main_seeds(main.code_hash):
                    why = f"under seed {seed}, paired with experiment {exp.id}'s next run"
                    self.baseline.queue_run(main, why, seed=seed)
            self.runs.queue(exp, "confirm", decision.reason)
            return None
        if decision.action == "remeasure":
            return self.store.experiments.update(exp.id, state=State.REBASING, event=decision.reason)
        numbers = dict(val_bpb=decision.val_bpb, delta=decision.delta, margin=decision.margin, reason=decision.reason)
        if decision.action == "keep":
            meta = dict(
                exp.meta,
                main_code=main.code_hash,
                runs=len(candidate),
                main_val_bpb=measurement.main_value(self.baseline.values(), main.code_hash),
            )
            meta.pop("kept_for_simplicity", None)  # from an earlier keep on an older main
            if for_simplicity and simpler:
                meta["kept_for_simplicity"] = dict(
                    lines=simpler.lines, tokens=simpler.tokens, loss_margin=decision.loss_margin
                )
            first = not any(e.base_sha == main.sha for e in self.store.experiments.in_state(State.MERGING))
            with self.store.transaction():  # a keep and its runs ahead, or neither: a restart finds both
                kept = self.store.experiments.update(
                    exp.id, state=State.MERGING, meta=meta, event=decision.reason, **numbers
                )
                if first:  # the first keep on this main is its next: its runs start now
                    self.baseline.queue_ahead(kept, main)
            failpoint(str(State.MERGING))  # the crash tests: the keep is committed
            return kept
        status = {"crash": Status.CRASH, "rejected": Status.REJECTED}.get(decision.action, Status.DISCARD)
        error_tail = _error_tail(failed) if failed else None
        return self.store.experiments.update(
            exp.id, state=State.CLOSING, status=status, error_tail=error_tail, event=decision.reason, **numbers
        )

    def _worse_where_it_ran(self, exp: Experiment, main: Main, candidate: list[float]) -> Experiment | None:
        """Discard an experiment whose runs, measured on a main that has moved on since, the judge
        would discard there, when they came out no better than that main or better by no more than
        program.md's `remeasure_below` standard errors; None otherwise (the judge would confirm or
        keep it there, it improved by more, or that main has no value): then it is re-measured on
        the current main before it may merge. A run on a main that moved is not wasted on a loss,
        and a gain is not judged twice."""
        noise = self.baseline.noise()
        old_main = self.baseline.main_values(self.baseline.code_at(exp.base_sha))
        there = decide(
            candidate=candidate,
            crash=None,
            main=old_main,
            noise=noise,
            measured_on=exp.base_sha,
            current_main=exp.base_sha,
            config=judge_config(main.settings),
            simpler=simplicity.simplification(self.forge.read_file(exp.base_sha, self.baseline.task.asset), exp.asset)
            if exp.asset
            else None,
        )
        if there.action != "discard" or there.delta is None:
            return None
        # how far below the old main a run must have come to be worth a run on the new one (no noise
        # known yet: any gain is)
        below = 0.0
        if noise is not None and old_main:
            below = main.settings.remeasure_below * standard_error(noise, len(candidate), len(old_main))
        if there.delta < -below:
            return None
        return self.store.experiments.update(
            exp.id,
            state=State.CLOSING,
            status=Status.DISCARD,
            val_bpb=there.val_bpb,
            delta=there.delta,
            margin=there.margin,
            reason=f"measured on main {exp.base_sha[:7]}, which has moved on since: {there.reason}",
            event=there.reason,
        )

    def _adopt_ahead(self, exp: Experiment, main: Main) -> Experiment | None:
        """The experiment re-grafted onto main by its run queued ahead of the merge that made this
        main (regraft_ahead), or None where it has none: that run measures its change on this
        main's train.py (the same 3-way merge, made before the merge), so it is adopted as the
        experiment's first run here and its runs on the old main, which never started, are set aside."""
        if exp.head_sha is not None:
            return None
        ahead = [
            r
            for r in self.store.runs.all(experiment_id=exp.id)
            if r.base_sha == ahead_of(main.code_hash) and r.state != RunState.CANCELLED
        ]
        if not ahead:
            return None
        with self.store.transaction():  # one move: a restart finds it on the old main or adopted, never between
            self.runs.cancel(exp, f"main moved to {main.sha[:7]} before it ran", ahead=False)  # never started
            self.store.runs.adopt([r.id for r in ahead], main.sha)
            adopted = self.store.experiments.update(
                exp.id,
                state=State.MEASURING,
                base_sha=main.sha,
                asset=ahead[0].asset,
                code_hash=ahead[0].code_hash,
                event=f"re-grafted onto main {main.sha[:7]}: its run queued ahead of the merge measures it",
            )
        failpoint(str(State.MEASURING))  # the crash tests: the move is committed
        if any(r.state == RunState.DONE for r in ahead):  # the values hold its base as it was
            self.baseline.run_finished()
        return adopted

    def _follow_main(self, exp: Experiment, main_sha: str, head: str | None = None) -> Experiment:
        """Move the branch onto a main whose train.py is the one it was measured against (`head`:
        where a forge call already moved it; an experiment without a branch only changes its base):
        its runs still count, since the judge compares train.py, not the commit around it."""
        if head is None and exp.head_sha is not None:
            head = self.forge.rebase_branch(exp.branch, main_sha, self.baseline.task.asset)
        return self.store.experiments.update(
            exp.id,
            base_sha=main_sha,
            head_sha=head,
            event=f"followed main to {main_sha[:7]} ({self.baseline.task.asset} unchanged)",
        )

    def _step_rebasing(self, exp: Experiment, main: Main) -> Experiment | None:
        asset = self.baseline.task.asset
        if exp.head_sha is None:  # no branch yet: the same re-graft, in memory
            if self.baseline.code_at(exp.base_sha) == main.code_hash:
                self.runs.cancel_ahead(f"main moved to {main.sha[:7]}, its {asset} unchanged", exp=exp)
                return self.store.experiments.update(self._follow_main(exp, main.sha).id, state=State.MEASURING)
            try:
                text = self.branching.regrafted(exp, main)
            except MergeConflict as error:
                self.runs.cancel_ahead("its change conflicts with main", exp=exp)
                return self._conflict(exp, main, error)
            return self._remeasure(exp, main, None, text)
        if self.baseline.code_at(exp.base_sha) == main.code_hash:
            # the same call slot as the rebase below: a rebase still being made for this branch ends first
            head = self.calls.call(
                ("rebase", exp.id, main.sha, "follow"), lambda forge: forge.rebase_branch(exp.branch, main.sha, asset)
            )
            if head is PENDING:
                return None
            return self.store.experiments.update(self._follow_main(exp, main.sha, head).id, state=State.MEASURING)

        def rebase(forge: Forge) -> tuple[str, str]:
            head = forge.rebase_branch(exp.branch, main.sha, asset)
            return head, forge.read_file(head, asset)

        try:
            rebased = self.calls.call(("rebase", exp.id, main.sha, "remeasure"), rebase)
        except MergeConflict as error:
            return self._conflict(exp, main, error)
        if rebased is PENDING:
            return None
        return self._remeasure(exp, main, *rebased)

    def _conflict(self, exp: Experiment, main: Main, error: MergeConflict) -> Experiment:
        why = f"its change to {self.baseline.task.asset} conflicts with main {main.sha[:7]}: {error}"
        return self._discard_unmeasured(exp, why, "conflict")

    def _discard_unmeasured(self, exp: Experiment, why: str, event: str) -> Experiment:
        """Discarded on the new main before a run there: no number of its own stands."""
        return self.store.experiments.update(
            exp.id, state=State.CLOSING, status=Status.DISCARD, val_bpb=None, delta=None, reason=why, event=event
        )

    def _remeasure(self, exp: Experiment, main: Main, head: str | None, text: str) -> Experiment:
        """Queue the re-measure of the experiment re-grafted onto main as `text` (at `head`, its
        branch's new commit; None without a branch), unless main already holds that. What was queued
        ahead of a merge for it stops: a run ahead of this main's merge is adopted before, where
        the experiment's runs on the old main are set aside (_adopt_ahead)."""
        digest = code_hash(text)
        self.runs.cancel_ahead(f"re-grafted onto main {main.sha[:7]}", exp=exp)
        if digest == main.code_hash:
            return self._discard_unmeasured(exp, "main already holds this change", "already in main")
        self.store.runs.add(
            experiment_id=exp.id,
            purpose="remeasure",
            code_hash=code_hash(text),
            commit_sha=head or "",
            base_sha=main.sha,
            asset=text,
            profile=self.profile,
            main_code=main.code_hash,
            reason=f"{'rebased' if head else 're-grafted'} onto main {main.sha[:7]}",
            experiment_fields={
                "state": State.MEASURING,
                "base_sha": main.sha,
                "head_sha": head,
                "asset": text,
                "code_hash": code_hash(text),
            },
        )
        return self.store.experiments.get(exp.id)

    def _step_merging(self, exp: Experiment, main: Main) -> Experiment | None:
        if exp.base_sha != main.sha:  # main moved since the judge kept it (another keep merged first)
            return self._main_moved_before_merge(exp, main.sha, f"main is at {main.sha[:7]}")
        if exp.head_sha is None:  # the commit main takes is its branch's: pushed first, at once
            exp = self.branching.push(exp, inline=True) or exp  # inline: never pending
        if self.merge_wait.holds(exp):
            return None
        runs = exp.meta.get("runs", 1)
        simpler = "kept_for_simplicity" in exp.meta
        config = judge_config(main.settings)  # the task's metric: its name, and the value on its own scale
        name, value = config.metric.name, config.shown(exp.val_bpb)
        message = (
            f"{exp.title} ({name} {value:.6f}, {config.signed(exp.delta)} vs main"
            f"{', kept for simplicity' if simpler else ''})\n\n{exp.hypothesis}\n\n"
            f"{exp.reason}\n\n{name} is the mean of its {runs} run{'s' if runs != 1 else ''}; the new main "
            f"is measured afresh, and that re-measured delta is the one to quote.\n\n"
            f"autoresearch-experiment: {exp.id}\nautoresearch-{name.replace('_', '-')}: {value:.6f}"
            + ("\nautoresearch-kept-for: simplicity" if simpler else "")
        )
        try:
            merged = self.forge.merge(exp.branch, exp.base_sha, message, measured=exp.head_sha)
        except MainMoved as error:
            # Someone moved main since the tick read it: only where it went matters here (its sha and
            # its train.py); the rest of the tick goes on with the main it read, the next reads the new one.
            self._main_moved_before_merge(exp, self.forge.main_sha(), str(error))
            return None
        return self.store.experiments.update(
            exp.id,
            state=State.CLOSING,
            status=Status.KEEP,
            merged_sha=merged,
            event=f"merged into main as {merged[:7]}",
        )

    def _main_moved_before_merge(self, exp: Experiment, moved_to: str, why: str) -> Experiment | None:
        """A keep whose main moved before its merge: it follows a main whose train.py did not change
        (program.md moved); otherwise it is re-measured on the new main, and what was queued ahead
        of its merge stops. None: nothing more this tick."""
        if moved_to != exp.base_sha and self.baseline.code_at(exp.base_sha) == self.baseline.code_at(moved_to):
            self._follow_main(exp, moved_to)  # only program.md or the like moved: no re-measure
            return None
        self.runs.cancel_ahead(f"main moved before experiment {exp.id} was merged", kept=exp)
        return self.store.experiments.update(exp.id, state=State.REBASING, event=f"main moved before the merge: {why}")

    def _step_closing(self, exp: Experiment, main: Main) -> Experiment | None:
        closing = self.branching.before_close(exp)  # its branch, if wanted and not pushed yet
        if closing is None:
            return None
        exp = closing
        if exp.head_sha is not None:  # one that never got its branch has nothing to close
            self.forge.close(exp.branch, exp.status or Status.DISCARD)
        exp = self.store.experiments.update(exp.id, state=State.DONE, event=f"{exp.status}: {exp.reason}")
        log.info("experiment %s %s: %s", exp.id, exp.status, exp.reason)
        if exp.status == Status.KEEP and exp.code_hash:  # its fresh runs may have ended before the merge did
            self.baseline.note_remeasured_delta(exp.code_hash, main)
        return exp


def _error_tail(run: Run, lines: int = 20) -> str:
    """What went wrong, for the agent and the pull request: a crash's error (or log) tail, or
    "rejected: " and the reason a rejected run was refused its number."""
    if run.status == "rejected":
        return f"rejected: {(run.error or '').strip() or 'no reason given'}"
    text = (run.error or "").strip() or (run.log_tail or "").strip()
    return "\n".join(text.splitlines()[-lines:])
