"""Screening (program.md's `screening: true`): a short run first, full runs only for a promising change.

With screening on, a new candidate's first run is a short one, a fifth of the profile's budget
(SCREEN_FRACTION; runner.protocol.JobSpec.budget_fraction), run purpose `screen`. Main's train.py
gets short runs too (SHORT_MAIN_RUNS, queued as main's own runs of purpose `screen` when it lacks
them), since a short run's value is a different measurement from a full one's: it is compared with
main's short runs only, and never enters main's value, the noise the judge pools, the pairs or an
experiment's mean: bot.core.records.full_budget says which runs count there, for main's values, the
lifecycle, the read model and a check's numbers alike. A short run's seed is one of main's short
runs' (bot.store.runs), never one its full runs pair under.

The rule: the candidate goes on to full runs and the judge (bot.loop.judge, as without screening)
when its short run's value less the mean of main's short runs is below `screening_sigmas` short
standard errors, sigma pooled over main's short runs of every train.py measured so
(bot.loop.judge.pooled_noise; a short run is never pooled with a full one). Otherwise it ends
discarded: "screened out: short-run delta X against main's short runs Y". While the short noise
is unknown (main's short runs have no two values yet) every candidate goes on. A short run that
crashes or is rejected is judged as such by the lifecycle, at once.

A candidate caught by a new main's train.py before its screen has a verdict is not screened: it is
re-measured on the new main at the full budget, as any experiment measured on an older main. A
screened experiment reopened, rerun or kept anyway by a person is measured at the full budget.

Screening is off by default, and on for no profile by default: bench/screening.py and
bench/screening_sim.py measure what it buys (docs/benchmarks.md, "Screening (issue 20)").
"""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING, Any

from bot.core.records import SCREEN, full_budget
from bot.core.states import RunState, State, Status
from bot.loop import measurement
from bot.loop.baseline import Baseline, Main
from bot.loop.judge import Noise, pooled_noise
from bot.store import Experiment, Run, Store

if TYPE_CHECKING:
    from bot.loop.runs import Runs

SCREEN_FRACTION = 0.2  # of the profile's time budget
SHORT_MAIN_RUNS = 3  # short runs of each main's train.py that candidates are screened against
PENDING = "pending"  # exp.meta["screen"] while its screen has no verdict


def budget_fraction(purpose: str) -> float:
    """The share of the profile's budget a run of `purpose` trains."""
    return 1.0 if full_budget(purpose) else SCREEN_FRACTION


def pending(exp: Experiment) -> bool:
    """Whether the experiment waits for its screen's verdict."""
    return exp.meta.get(SCREEN) == PENDING


class Screening:
    def __init__(self, store: Store, baseline: Baseline, runs: Runs, *, identity: dict[str, str], profile: str):
        self.store = store
        self.baseline = baseline
        self.runs = runs
        self.identity = identity
        self.profile = profile

    def wanted(self, exp: Experiment, main: Main) -> bool:
        """Whether a branched experiment gets a short run first: screening on, its first
        measurement (not a reopened one), on main's train.py."""
        return (
            main.settings.screening
            and SCREEN not in exp.meta
            and not exp.meta.get("keep_anyway")
            and self.baseline.code_at(exp.base_sha) == main.code_hash
        )

    def start(self, exp: Experiment, main: Main) -> Experiment:
        """Queue the experiment's short run (and main's, when it lacks them); it is measuring."""
        self._top_up_main(main)
        self.runs.queue(  # on main's train.py (wanted): the run's main is main
            exp,
            SCREEN,
            f"screening: {SCREEN_FRACTION:g} of the budget first",
            experiment_fields={"state": State.MEASURING, "meta": dict(exp.meta, **{SCREEN: PENDING})},
        )
        return self.store.experiments.get(exp.id)

    def step(self, exp: Experiment, main: Main, runs: list[Run]) -> Experiment | None:
        """The screen's verdict once the experiment's short run and main's are in: screened out
        (closing, discarded), or promoted (its first full run queued). None while it waits. An
        experiment returned still measuring and no longer pending goes on to the lifecycle's rule:
        its short run failed, or main's train.py changed under it."""
        if self.baseline.code_at(exp.base_sha) != main.code_hash:  # its short run will not start: no short main
            return self._unscreened(exp, f"main's {self.baseline.task.asset} changed before its screen ended")
        short = [r for r in runs if not full_budget(r.purpose) and r.code_hash == exp.code_hash]
        if any(r.state in (RunState.QUEUED, RunState.RUNNING) for r in short):
            return None
        done = [r for r in short if r.state == RunState.DONE]
        if any(r.status in ("crash", "rejected") for r in done):
            return self._unscreened(exp, "its short run failed")
        values = [v.val_bpb for v in measurement.counted(done, self.identity)]
        if not values:  # lost, refused or cancelled: one more
            self.runs.queue(exp, SCREEN, "no short run under the pinned harness and data")
            return None
        main_short = self._main_short(main)
        if main_short is None:
            return None
        if not main_short:
            return self._unscreened(exp, f"main's short runs failed {SHORT_MAIN_RUNS} times")
        return self._verdict(exp, main, statistics.fmean(values), main_short)

    def _verdict(self, exp: Experiment, main: Main, value: float, main_short: list[float]) -> Experiment:
        config, base = main.settings, statistics.fmean(main_short)
        delta, noise = value - base, self.short_noise()
        metric = self.baseline.task.metric
        record: dict[str, Any] = dict(short=value, main=base, delta=delta, main_runs=len(main_short))
        if noise is None:
            promoted, why = True, "the short runs' noise is not known yet"
        else:
            threshold = config.screening_sigmas * noise.sigma * math.sqrt(1 + 1 / len(main_short))
            record.update(threshold=threshold, sigma=noise.sigma, dof=noise.dof)
            promoted = delta < threshold
            why = (
                f"{'below' if promoted else 'not below'} {config.screening_sigmas:g} short standard errors "
                f"({metric.format_change(threshold, 6)}; short sigma {noise.sigma:.6f} from {noise.dof} degrees of freedom)"
            )
        words = (
            f"short-run delta {metric.format_change(delta, 6)} against main's short runs "
            f"{metric.value(base):.6f} ({len(main_short)} runs at {SCREEN_FRACTION:g} of the budget)"
        )
        meta = dict(exp.meta, **{SCREEN: dict(record, promoted=promoted)})
        if not promoted:
            reason = f"screened out: {words}, {why}"
            return self.store.experiments.update(
                exp.id, state=State.CLOSING, status=Status.DISCARD, meta=meta, reason=reason, event=reason
            )
        self.store.experiments.update(exp.id, meta=meta, event=f"promising: {words}, {why}: full runs next")
        self.runs.queue(exp, "candidate", "promising after its short run")
        return self.store.experiments.get(exp.id)

    def _unscreened(self, exp: Experiment, why: str) -> Experiment:
        self.runs.cancel(exp, why)
        meta = dict(exp.meta, **{SCREEN: f"not screened: {why}"})
        return self.store.experiments.update(exp.id, meta=meta, event=f"not screened: {why}")

    def _main_short(self, main: Main) -> list[float] | None:
        """Main's short values once it has them all (its short runs queued while it lacks some), or
        those it has once SHORT_MAIN_RUNS of them failed (perhaps none); None while they run."""
        own = self._own_short(main)
        if any(r.state in (RunState.QUEUED, RunState.RUNNING) for r in own):
            return None
        values = [v.val_bpb for v in measurement.counted(own, self.identity)]
        failed = [r for r in own if r.state == RunState.DONE and r.status in ("crash", "rejected")]
        if len(values) >= SHORT_MAIN_RUNS or len(failed) >= SHORT_MAIN_RUNS:
            return values
        self._top_up_main(main)
        return None

    def _own_short(self, main: Main) -> list[Run]:
        """Main's own short runs of its train.py, in run order."""
        runs = self.store.runs.all(code_hash=main.code_hash)
        return [r for r in runs if not full_budget(r.purpose) and r.experiment_id is None]

    def _top_up_main(self, main: Main) -> None:
        """Queue main's short runs until SHORT_MAIN_RUNS are queued, running or counted: finished ok
        under the pinned identity, as `_main_short` counts them (a run measured under an earlier
        harness or data set is done but no longer counts, and must not stand in for one that does)."""
        own = self._own_short(main)
        have = [r for r in own if r.state in (RunState.QUEUED, RunState.RUNNING)]
        have += measurement.counted_runs(own, self.identity)
        for _ in range(SHORT_MAIN_RUNS - len(have)):
            self.store.runs.add(
                experiment_id=None,
                purpose=SCREEN,
                code_hash=main.code_hash,
                commit_sha=main.sha,
                base_sha=main.sha,
                asset=main.asset,
                profile=self.profile,
                reason=f"main's short run ({SCREEN_FRACTION:g} of the budget), for screening",
            )

    def short_noise(self) -> Noise | None:
        """The short runs' run-to-run noise: pooled over main's short runs of each train.py (the store's
        light query of the runs that count, as bot.loop.baseline reads the full ones)."""
        ident = self.identity
        values = self.store.runs.measured_values(
            profile=ident["profile"],
            harness_hash=ident["harness_hash"],
            data_fingerprint=ident["data_fingerprint"],
            threads=measurement.pinned_threads(ident),
        )
        groups: dict[str, list[float]] = {}
        for code, experiment, purpose, value in values:
            if not full_budget(purpose) and experiment is None:
                groups.setdefault(code, []).append(value)
        return pooled_noise(groups.values())
