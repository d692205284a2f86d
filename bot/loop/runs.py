"""Runs: queued runs started on free slots, running ones asked about, and what comes back recorded.

`dispatch()` starts queued runs while slots are free: main's baselines first, then re-measures,
confirmations, candidates, only those measured on main's train.py; while a keep waits to be merged
(main is about to move) only the runs queued ahead of the merge on the kept train.py (the new
main's own, bot.loop.baseline; the changes waiting on the old main, re-grafted onto it by
bot.loop.lifecycle), so the slots the keep frees never wait for the merge. A queued run of a main
that moved is set aside, never run.
`collect()` asks the runner about every running run (lookup(), never a wait) and records what
finished, once its result passed measurement.refusal (it answers this job, this code, under the
pinned identity) and measurement.disturbance (a CPU run slowed by a busy machine runs once more).

A run the runner lost (a preempted container, an Actions runner gone offline, a worker killed by
the OOM killer: the runner says `lost`, never `finished` with a crash) costs one run, never its
experiment: it is set aside as lost and queued again under the same seed, on whichever slot is
free first. Lost MAX_LOST_RUNS times in a row (the run and its re-runs), it is the runners' fault
rather than its train.py's, and it is said so: its experiment fails with that reason, or, for
main's own train.py, the loop is blocked until a person fixes the runners. A refused result runs
again too, MAX_REFUSED_RESULTS times per code. A loss its own code may have caused (its training
process killed from outside, or its task's evaluator raising on it: the runner sends the crash it
would be) is lost too, but lost that way MAX_KILLED_RUNS times in a row it is charged as that crash.
The slots are the runner's to say (`runner.slots`, read at each dispatch): they may change while
the bot runs (bot.runners.capacity), and a slot taken away finishes its run and takes no new one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from bot.core.protocols import Runner
from bot.core.records import Job, RunResult
from bot.core.states import RunState, State, Status
from bot.loop import measurement
from bot.loop.baseline import Baseline, Main
from bot.loop.screening import budget_fraction
from bot.store import Experiment, Run, Store
from bot.store.runs import ahead_of, is_ahead

log = logging.getLogger(__name__)

RUN_PRIORITY = {"baseline": 0, "remeasure": 1, "confirm": 2, "candidate": 3, "screen": 3}
MAX_REFUSED_RESULTS = 3  # results of one code refused (wrong identity) before giving up on it
MAX_LOST_RUNS = 5  # times one run is lost in a row (a machine gone, an answer refused) before its code is given up on
# A run lost in a way its own code may have caused (its training process killed from outside, its
# evaluator raising on it) runs again; lost that way this many times in a row, it is charged as the
# crash it may be: a train.py can kill itself to look killed from outside.
MAX_KILLED_RUNS = 2
SUSPECT_NOTE = "lost, maybe by its own doing: "  # how such a lost run's note begins: the streak is counted by it
OLD_SUSPECT_NOTES = ("killed from outside: ",)  # the same, as stores written before the evaluator's losses say it


class Runs:
    def __init__(
        self,
        store: Store,
        runner: Runner,
        baseline: Baseline,
        *,
        identity: dict[str, str],
        profile: str,
        disturbed_share: float,
        report: Callable[[str, Exception], None],
    ) -> None:
        self.store = store
        self.runner = runner
        self.baseline = baseline
        self.identity = identity
        self.profile = profile
        self.disturbed_share = disturbed_share
        self.report = report  # records a failure that holds up nothing else (the tick's error log)
        self.progress: dict[int, dict[str, Any]] = {}  # run id -> its latest progress line (only the runner knows)

    def dispatch(self, main: Main) -> None:
        """Start queued runs on free slots in priority order: main's baselines first, then
        re-measures, confirmations, candidates, a re-run in its lost run's place; only runs
        measured on main's train.py; as many as the runner's slots now leave free. A queued run
        of a main whose train.py is no longer main's is set aside, never run: no verdict will use it.
        A queued run of an experiment measured on an older main waits for the lifecycle to re-graft
        it. While a keep measured on main waits to be merged, main is about to move: only the new
        main's runs and the re-grafts queued ahead of the merge start (bot.store.runs.ahead_of)."""
        # a re-run takes the place in line of the run it repeats: its experiment has waited already
        queued = sorted(
            self.store.runs.all(state=RunState.QUEUED), key=lambda r: (RUN_PRIORITY[r.purpose], self._first_of(r))
        )
        # the train.py of the keep waiting to be merged, main's next: its runs are queued ahead
        ahead = {e.code_hash for e in self.store.experiments.in_state(State.MERGING) if e.base_sha == main.sha}
        for run in [r for r in queued if r.experiment_id is None and r.code_hash not in (main.code_hash, *ahead)]:
            self.store.runs.set_aside(run.id, RunState.CANCELLED, f"main moved to {main.sha[:7]}", rerun=False)
            queued.remove(run)
        for run in [r for r in queued if is_ahead(r.base_sha) and r.experiment_id is not None and not ahead]:
            if self.store.experiments.get(run.experiment_id).state == State.DONE:  # ended before it was adopted
                self.store.runs.set_aside(run.id, RunState.CANCELLED, "its experiment ended", rerun=False)
                queued.remove(run)
        free = self.runner.slots - self.store.runs.count(RunState.RUNNING)
        if free <= 0 or self.baseline.blocked:  # nothing can be judged until main is fixed: spend no runs
            return
        if ahead:  # main is about to move: only the runs queued ahead of its merge start
            on_main = [r for r in queued if r.base_sha in {ahead_of(code) for code in ahead}]
        else:
            on_main = [
                r
                for r in queued
                if r.base_sha == main.sha
                or (not is_ahead(r.base_sha) and self.baseline.code_at(r.base_sha) == main.code_hash)
            ]
        for run in on_main[:free]:
            if not run.commit_sha and run.experiment_id is not None:  # queued before its branch was pushed
                exp = self.store.experiments.get(run.experiment_id)
                if exp.head_sha and exp.code_hash == run.code_hash:  # a runner that checks out the commit gets it
                    self.store.runs.set_commit(run.id, exp.head_sha)  # written first: a resubmit sends it too
                    run = replace(run, commit_sha=exp.head_sha)
            try:
                # idempotent by run id: safe before the write
                handle = self.runner.submit(_job(run, self.baseline.task.name))
            except Exception as error:  # noqa: BLE001 - one run the runner refuses must not hold up the rest
                self.report(f"starting run {run.id}", error)
                continue
            self.store.runs.mark_started(run.id, handle)
            log.info("run %s (%s) started", run.id, run.purpose)

    def collect(self, main: Main) -> None:
        """Ask the runner about every running run; record what finished, re-run what was lost."""
        for run in self.store.runs.all(state=RunState.RUNNING):
            try:
                status = self.runner.lookup(run.id)
            except Exception as error:  # noqa: BLE001 - one run the runner cannot answer for holds up no other
                self.report(f"asking about run {run.id}", error)
                continue
            if status.state in ("queued", "running"):
                self.progress[run.id] = status.progress or self.progress.get(run.id, {})
                continue
            self.progress.pop(run.id, None)
            if status.state == "unknown":  # written as started, never submitted: submit it now
                self.store.runs.mark_started(run.id, self.runner.submit(_job(run, self.baseline.task.name)))
            elif status.state == "lost":
                self._lost(run, status.detail or "the runner lost it", main, charge=status.result)
            else:
                assert status.result is not None
                self._record(run, status.result, main)

    def _lost(self, run: Run, why: str, main: Main, *, charge: RunResult | None = None) -> None:
        """Run it again under its seed, unless it keeps getting lost: a runner that refuses or drops
        every result (another harness deployed, a profile it lacks, runners that never stay up)
        must not loop forever. `charge`: the crash to record instead once it was lost that way
        MAX_KILLED_RUNS times in a row, for a loss its own code may have caused (see MAX_KILLED_RUNS)."""
        suspect = self._lost_before(run, suspect_only=True)
        if charge is not None and suspect + 1 >= MAX_KILLED_RUNS:
            asset = self.baseline.task.asset
            log.warning("run %s lost that way again (%s): charged as a crash of its %s", run.id, why, asset)
            self._record(
                run,
                replace(
                    charge,
                    error=f"{why}; lost this way {suspect + 1} times in a row, so charged as a crash of its {asset}",
                ),
                main,
            )
            return
        streak = self._lost_before(run)
        again = streak + 1 < MAX_LOST_RUNS
        note = why if charge is None else SUSPECT_NOTE + why
        self.store.runs.set_aside(run.id, RunState.LOST, note, rerun=again)
        log.warning("run %s lost: %s%s", run.id, why, "; running it again" if again else "")
        if not again:
            asset = self.baseline.task.asset
            log.error("run %s lost %d times in a row: giving up on its %s", run.id, MAX_LOST_RUNS, asset)
            self._give_up_on(
                run,
                f"{MAX_LOST_RUNS} runs of it were lost in a row, a fault of the runners rather than of its "
                f"{asset}; the last: {why}",
                main,
                lost=True,
            )

    def _first_of(self, run: Run) -> int:
        """The id of the first run of the runs `run` repeats (its own id if it repeats none)."""
        first = run
        while first.rerun_of is not None:
            first = self.store.runs.get(first.rerun_of)
        return first.id

    def _lost_before(self, run: Run, *, suspect_only: bool = False) -> int:
        """How many times in a row this run was lost before (`suspect_only`: in a way its own code may
        have caused): the lost runs it re-runs, one by one."""
        streak, earlier = 0, run.rerun_of
        while earlier is not None:
            before = self.store.runs.get(earlier)
            suspect = (before.note or "").startswith((SUSPECT_NOTE, *OLD_SUSPECT_NOTES))
            if before.state != RunState.LOST or (suspect_only and not suspect):
                break
            streak, earlier = streak + 1, before.rerun_of
        return streak

    def _record(self, run: Run, result: RunResult, main: Main) -> None:
        kept = dict(status=result.status, val_bpb=result.val_bpb, metrics=result.metrics, log_tail=result.log_tail)
        problem = measurement.refusal(run, result, self.identity)
        if problem is not None:
            refused = [r for r in self.store.runs.all(code_hash=run.code_hash) if r.state == RunState.REFUSED]
            again = len(refused) + 1 < MAX_REFUSED_RESULTS
            self.store.runs.set_aside(run.id, RunState.REFUSED, f"result refused: {problem}", rerun=again, result=kept)
            log.error("run %s: result refused: %s", run.id, problem)
            if not again:
                self._give_up_on(run, f"{MAX_REFUSED_RESULTS} results for it were refused; the last: {problem}", main)
            return
        disturbed = measurement.disturbance(run, result, self.store.runs.latest_ok("baseline", 6), self.disturbed_share)
        if disturbed is not None:
            self.store.runs.set_aside(run.id, RunState.DISTURBED, disturbed, result=kept)
            log.warning("run %s: %s; running it again", run.id, disturbed)
            return
        metric = self.baseline.task.metric
        run = self.store.runs.finish(
            run.id,
            status=result.status,
            val_bpb=result.val_bpb,
            metrics=result.metrics,
            error=result.error,
            log_tail=result.log_tail,
            metric=metric,
        )
        log.info(
            "run %s finished: %s %s",
            run.id,
            run.status,
            f"{metric.name} {metric.value(run.val_bpb):.6f}" if run.val_bpb is not None else (run.error or ""),
        )
        self.baseline.run_finished()
        if run.experiment_id is None:
            self.baseline.note_remeasured_delta(run.code_hash, main)

    def _give_up_on(self, run: Run, why: str, main: Main, *, lost: bool = False) -> None:
        if run.experiment_id is None and is_ahead(run.base_sha):
            # a run of the next main, ahead of its merge: main is not that train.py yet. Its runs ahead
            # stop; once merged, main's runs are queued as ever, and give up (blocking it) in its own name.
            log.error("the runs ahead of a keep's merge stop: %s", why)
            for other in self.store.runs.all(code_hash=run.code_hash):
                if other.base_sha == run.base_sha and other.state in (RunState.QUEUED, RunState.RUNNING):
                    self._stop(other, why)
            return
        if run.experiment_id is None:
            pinned = (
                "the runner must run the harness and data this conductor pinned when it started: update or "
                "re-prepare the runner, or restart the conductor to pin what the runner has"
            )
            fix = (
                f"Bring the runners back (each lost run's note says what happened to it), then restart the "
                f"conductor to measure main again; where the notes say results were refused, {pinned}."
                if lost
                else pinned[:1].upper() + pinned[1:] + "."
            )
            self.baseline.block(main, f"main's runs cannot be measured: {why}. {fix}")
            return
        exp = self.store.experiments.get(run.experiment_id)
        if exp.state != State.DONE:
            self.cancel(exp, "its experiment failed")
            self.store.experiments.update(
                exp.id, state=State.DONE, status=Status.FAILED, reason=why, event=f"failed: {why}"
            )

    # --- an experiment's runs --------------------------------------------------------------------
    def queue(
        self, exp: Experiment, purpose: str, reason: str, *, experiment_fields: dict[str, Any] | None = None
    ) -> None:
        """Queue one more run of the experiment as it stands (its state stays measuring, unless
        `experiment_fields` are written with the run, in the same transaction)."""
        self.store.runs.add(
            experiment_id=exp.id,
            purpose=purpose,
            code_hash=exp.code_hash,
            commit_sha=exp.head_sha or "",
            base_sha=exp.base_sha,
            asset=exp.asset,
            profile=self.profile,
            main_code=self.baseline.code_at(exp.base_sha),
            reason=reason,
            experiment_fields=experiment_fields,
        )

    def cancel_ahead(self, why: str, *, kept: Experiment | None = None, exp: Experiment | None = None) -> None:
        """Stop runs queued ahead of a keep's merge (bot.loop.baseline.Baseline.queue_ahead,
        bot.loop.lifecycle's re-grafts ahead): those of the `kept` experiment's merge, which did not
        happen (what they measure is not on main), or `exp`'s own (all of them, ahead of any merge)."""
        runs = (
            self.store.runs.all(state=RunState.QUEUED) + self.store.runs.all(state=RunState.RUNNING)
            if exp is None
            else self.store.runs.all(experiment_id=exp.id)
        )
        for run in runs:
            ours = is_ahead(run.base_sha) if kept is None else run.base_sha == ahead_of(kept.code_hash)
            if ours and run.state in (RunState.QUEUED, RunState.RUNNING):
                self._stop(run, why)

    def cancel(self, exp: Experiment, why: str, *, ahead: bool = True) -> None:
        """Stop the experiment's running runs and set aside its queued ones, none run again; with
        `ahead` False, not those queued ahead of a keep's merge (its re-graft onto the next main)."""
        for run in self.store.runs.all(experiment_id=exp.id):
            if run.state in (RunState.QUEUED, RunState.RUNNING) and (ahead or not is_ahead(run.base_sha)):
                self._stop(run, why)

    def _stop(self, run: Run, why: str) -> None:
        if run.state == RunState.RUNNING:
            self.runner.cancel(run.id)
        self.store.runs.set_aside(run.id, RunState.CANCELLED, why, rerun=False)


def _job(run: Run, task: str) -> Job:
    return Job(
        task=task,
        run_id=run.id,
        asset=run.asset,
        profile=run.profile,
        seed=run.seed,
        commit=run.commit_sha,
        experiment_id=run.experiment_id,
        budget_fraction=budget_fraction(run.purpose),
    )
