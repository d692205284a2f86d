"""The judge: keep, discard, confirm or re-measure an experiment, from numbers alone.

This module owns the decision rule and the noise estimate it rests on; it touches neither the
store nor the forge. It works on the loss scale, where lower is better: val_bpb for training, and
for any task its metric or the metric negated where higher is better (bot.runners.specs records a
run's number so), so "lower" below reads "better" for every task. Only the reasons people read show
the task's metric, by its name and on its own scale (JudgeConfig.metric). The rule, in plain words:

1. Noise. Every group of repeated runs of the same train.py (main's baseline runs, a candidate's
   first and confirmation runs) says how much val_bpb moves between runs of the same code. The
   groups are pooled into one standard deviation `sigma` with `dof` degrees of freedom (the sum
   over groups of runs minus one). Early in a loop `dof` is small and sigma itself is uncertain:
   from one pair of runs it comes out under a third of the truth one time in four.

2. Margin. A candidate beats main when its mean val_bpb is lower than main's mean by more than

       margin = max(min_margin, k * sigma * sqrt(1/n_candidate + 1/n_main))

   `sigma * sqrt(...)` is the standard error of the difference of the two means. `k` is the
   Student-t quantile at `dof` degrees of freedom with the same one-sided tail as a z-score
   (`noise_sigmas` or `confirm_sigmas`), so a change with no effect passes the test as rarely
   with 5 degrees of freedom as with 500. For noise_sigmas 2.5 k is 3.8 at 5 degrees of freedom,
   2.66 at 30 and 2.55 at 100. The earlier rule used k = 2 whatever the degrees of freedom, and
   kept a change with no effect at the first experiment about one time in six.

3. One run, then maybe one more. A single candidate run is kept when it clears the margin with
   k from `noise_sigmas` (2.5: a null change passes 0.6% of the time). If it does not, but it is
   lower than main by more than `confirm_below` (1.25) standard errors, it earns one confirmation
   run, and main gets `confirm_main_runs` (1) more run beside it so both sides of the comparison
   sharpen. With two or more candidate runs the change is kept when the mean clears the margin
   with k from `confirm_sigmas` (2.1), and discarded otherwise. A smaller improvement is discarded
   at once: confirming every improvement spends runs on changes that almost never survive. All
   told a null change is kept about 2% of the time, a true gain of 3 sigma about 85% of the time
   at the first experiment.

4. Main's measurements. The first main of a loop is measured `first_baseline_runs` (6) times, so
   the noise estimate starts from 5 degrees of freedom; every later main (after a keep)
   `baseline_runs` (2) times afresh, since by then the noise is known from earlier groups. The
   runs that got a change kept are never main's values: they were selected for coming out low.
   See `main_runs_wanted`. Runs that say more about the machine than about main are left out of
   main's value and main is measured again (bot.loop.measurement.main_runs): one worse than main's
   other runs by more than the noise allows (a one-sided Student-t test on the run against the
   rest, 0.1% under Gaussian noise), which would raise main's value and make false keeps; and, once
   main's runs trend with time beyond the noise (1%), every run older than the loop's last 20, so
   a candidate is judged against main as it measures now. The noise keeps every run.

5. Simpler code. A change that makes train.py smaller (fewer lines of code and fewer code tokens,
   counted on the code itself: see bot.core.simplicity) and is not kept or confirmed by the rule
   above gets a rule of its own, non-inferiority: it is kept when its runs rule out a loss larger
   than `simplicity_sigmas` (1) sigma, that is when delta + k * standard error < margin with k the
   Student-t quantile of a one-sided 95% (`simplicity_z` 1.645) at `dof`. It is judged on two or
   more runs: a single run that loses less than half that margin earns one confirmation run (and
   main its extra run), anything worse is discarded at once; with confirmations off it is judged
   on its one run. A change with a true loss at the margin is then kept at most 5% of the time (3%
   measured); a change with none about a fifth of the time, since a margin of one sigma is narrow
   for two runs (bench/simplicity_accuracy.py). A change that is both simpler and clearly better is an ordinary keep, said as such. With
   `simpler` not given, or `simplicity_sigmas` 0, the rule above is all there is.

6. Paired seeds. A change that keeps main's parameters (any change, where the task's seeds pair
   whatever the asset: Task.seed_pairs) is also compared with main seed for seed
   (bot.loop.pairing): its differences from main's runs under the same seeds, judged against a
   paired noise pooled from such differences, where the data say that pays. It is a second way to
   a keep, never a replacement: what the rule above keeps stays kept, and whatever the paired rule
   does not decide is judged by the rule above.

7. Everything else. A crash is a crash, whatever the number, and a rejected run (refused a number
   by the evaluator's gate or training's harness) is a rejection, said with its reason. A result
   measured on an older main is re-measured on the current one before it may merge. Ties go to
   main. While no group has two runs (the noise is unknown) nothing is kept: an improvement gets a
   confirmation and one more run of main, or, with confirmations off, is discarded.

The figures behind the defaults (false keeps, power, runs per experiment) come from
bench/decision_accuracy.py, which drives this module through the conductor's protocol; see
"Decision accuracy of the judge" in docs/benchmarks.md.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from runner.tasks import TRAINING, Metric

if TYPE_CHECKING:
    from bot.core.simplicity import Simplification
    from bot.loop.pairing import Pairs
    from bot.loop.program import LoopSettings

# How many times main is measured: the first main of a loop carries the whole noise estimate on
# its own, so it gets enough runs for a usable sigma; later mains only need a fresh mean.
FIRST_BASELINE_RUNS = 6
BASELINE_RUNS = 2


@dataclass(frozen=True)
class Noise:
    sigma: float  # pooled standard deviation of one run
    dof: int  # degrees of freedom behind it (sum over groups of n-1)


@dataclass(frozen=True)
class JudgeConfig:
    noise_sigmas: float = 2.5  # keep threshold on a single run, a z-equivalent converted to Student-t at noise.dof
    confirm_sigmas: float = 2.1  # keep threshold once the candidate has 2+ runs
    confirm_below: float = 1.25  # a single run below -this many standard errors gets a confirmation
    min_margin: float = 0.0  # absolute floor on the margin, in val_bpb
    confirm: bool = True  # False: never confirm, decide on the first run
    confirm_main_runs: int = 1  # runs of main queued beside each confirmation run
    simplicity_sigmas: float = 1.0  # a simpler change may lose at most this many sigma (0: no simplicity rule)
    simplicity_z: float = 1.645  # one-sided confidence that it loses less, a z converted to Student-t (95%)
    simplicity_confirm_below: float = 0.5  # a simpler single run losing less than this share of the margin is confirmed
    paired_min_dof: int = 4  # the paired noise is used from this many degrees of freedom
    paired_pays: float = 0.5  # ...when sigma_d^2 is at most this share of sigma^2 (an unpaired difference's is 2)
    paired_pays_p: float = 0.95  # ...with this one-sided confidence (an F test of the two estimates)
    paired_keep_pairs: int = 3  # pairs a paired keep rests on (fewer: only a confirmation)
    paired_spread_p: float = 0.95  # a paired keep's own d's may spread at most this F quantile beyond the pool's
    metric: Metric = TRAINING.metric  # the reasons' words only: the rule minimises the loss (runner.tasks.Metric.loss)

    def shown(self, loss: float) -> float:
        """A value of the loss scale the rule works on as the metric's, for the reasons people read
        (Metric.value; never -0.0, which would read as a loss)."""
        return self.metric.value(loss)

    def size(self, size: float, better: bool) -> str:
        """A magnitude of the loss scale (a delta's size, a margin) for the reasons: as it is, or for a
        log-scale metric the relative change of the metric it means, a gain's (`better`) or a loss's
        ("20.0%": a p95 a fifth lower, where the log margin is symmetric and its percentages not)."""
        if not self.metric.relative:
            return f"{size:.6f}"
        return f"{100 * abs(self.metric.change(-size if better else size)):.1f}%"

    def signed(self, delta: float) -> str:
        """A signed delta of the loss scale as the metric's change ("+0.001630", or "-20.0%")."""
        return self.metric.format_change(delta) if self.metric.relative else f"{self.shown(delta):+.6f}"


def judge_config(settings: LoopSettings) -> JudgeConfig:
    """The judge's settings as program.md's front matter sets them, and its task's metric."""
    return JudgeConfig(
        metric=settings.metric,
        noise_sigmas=settings.noise_sigmas,
        confirm_sigmas=settings.confirm_sigmas,
        confirm_below=settings.confirm_below,
        min_margin=settings.min_margin,
        confirm=settings.confirm,
        simplicity_sigmas=settings.simplicity_sigmas,
    )


@dataclass(frozen=True)
class Decision:
    action: str  # keep | discard | crash | rejected | confirm | remeasure | wait
    reason: str  # one sentence with the numbers, shown to humans (PR comment, merge message)
    val_bpb: float | None = None
    delta: float | None = None
    margin: float | None = None
    extra_main_runs: int = 0  # on "confirm": runs of main to queue beside the confirmation run
    loss_margin: float | None = None  # judged as a simplification: the loss its runs must rule out
    paired: bool = False  # decided by the paired rule (delta is then the mean paired difference)


def main_runs_wanted(
    first_main: bool, first_baseline_runs: int = FIRST_BASELINE_RUNS, baseline_runs: int = BASELINE_RUNS
) -> int:
    """How many baseline runs a main needs before experiments are judged against it.

    `first_main` is true when no other code has been measured yet under the current profile,
    harness and data, so the noise estimate will rest on this main's runs alone. Runs queued by a
    confirmation (`Decision.extra_main_runs`) come on top of this number.
    """
    return max(1, first_baseline_runs if first_main else baseline_runs)


def pooled_noise(groups: Iterable[Sequence[float]]) -> Noise | None:
    """Pooled standard deviation over groups of repeated runs of the same code.

    Each group contributes its squared deviations from its own mean and len-1 degrees of freedom,
    so differences between groups (different code) do not count as noise. None when no group has
    two or more values.
    """
    squares = 0.0
    dof = 0
    for values in groups:
        if len(values) >= 2:
            mean = statistics.fmean(values)
            squares += sum((v - mean) ** 2 for v in values)
            dof += len(values) - 1
    return Noise(sigma=math.sqrt(squares / dof), dof=dof) if dof else None


@functools.lru_cache(maxsize=4096)
def t_multiplier(z: float, dof: int) -> float:
    """The Student-t quantile with the same one-sided tail as `z` standard normal deviations.

    With `dof` degrees of freedom behind sigma, (delta / standard error) follows a Student-t
    distribution under no effect, so this keeps the false-keep rate of a null change at
    P(Z > z) however few repeats the noise estimate has. It tends to `z` as dof grows.
    """
    if dof < 1:
        raise ValueError(f"a Student-t quantile needs at least 1 degree of freedom, got {dof}")
    # imported here, not with the module: a process that never judges against a known noise (the
    # CLI's other commands, the web service) does not pay for it. Not scipy.stats: that takes seconds.
    from scipy import special

    return float(special.stdtrit(dof, special.ndtr(z)))  # t quantile at the normal's P(Z <= z)


def warm() -> None:
    """Load what the first verdict needs (scipy's special functions: a fifth of a second of CPU),
    so that the first results a conductor collects, main's first runs ending together on every
    slot, do not wait for it (bench/duty_cycle.py saw it as the longest gaps at four slots)."""
    t_multiplier(2.0, 1)


def margin(noise: Noise, n_candidate: int, n_main: int, config: JudgeConfig) -> float:
    """The improvement a candidate with `n_candidate` runs must exceed against `n_main` runs of main."""
    z = config.noise_sigmas if n_candidate < 2 else config.confirm_sigmas
    k = t_multiplier(z, noise.dof)
    return max(config.min_margin, k * standard_error(noise, n_candidate, n_main))


def standard_error(noise: Noise, n_candidate: int, n_main: int) -> float:
    """Standard error of (candidate mean - main mean) when each run has standard deviation sigma."""
    return noise.sigma * math.sqrt(1 / n_candidate + 1 / n_main)


def decide(
    *,
    candidate: list[float],
    crash: str | None,
    main: list[float],
    noise: Noise | None,
    measured_on: str,
    current_main: str,
    config: JudgeConfig,
    simpler: Simplification | None = None,
    pairs: Pairs | None = None,
    rejected: str | None = None,
) -> Decision:
    """Judge one experiment from its runs on `measured_on` against main's baseline runs; `crash`,
    the error of a run that crashed, or `rejected`, the reason a run was refused its number;
    `simpler` says how much smaller its train.py is than main's, when it is (bot.core.simplicity);
    `pairs`, its runs against main's under the same seeds, when they pair (bot.loop.pairing)."""
    if rejected is not None:
        lines = [line.strip() for line in rejected.splitlines() if line.strip()]
        return Decision("rejected", f"rejected: {lines[0] if lines else 'no reason given'}")
    unpaired = _unpaired(candidate, crash, main, noise, measured_on, current_main, config, simpler)
    if pairs is None or noise is None or unpaired.action not in ("confirm", "discard"):
        return unpaired
    return pairs.verdict(noise, unpaired, candidate, config) or unpaired


def _unpaired(
    candidate: list[float],
    crash: str | None,
    main: list[float],
    noise: Noise | None,
    measured_on: str,
    current_main: str,
    config: JudgeConfig,
    simpler: Simplification | None,
) -> Decision:
    """Rules 1-5 and 7: the verdict from the two sides' means, whatever the seeds."""
    if crash is not None:
        last = crash.strip().splitlines()[-1] if crash.strip() else "no output"
        return Decision("crash", f"the run crashed: {last}")
    if measured_on != current_main:
        return Decision(
            "remeasure",
            f"measured on main {measured_on[:7]}, but main is now "
            f"{current_main[:7]}: re-measure on the current main before it may merge",
        )
    if not candidate:
        return Decision("wait", "no finished run yet")
    if not main:
        return Decision("wait", "main has no measurement yet")
    value = statistics.fmean(candidate)
    base = statistics.fmean(main)
    delta = value - base
    name, shown, gain = config.metric.name, config.shown, config.size(-delta, True)
    runs = f"{len(candidate)} run{'s' if len(candidate) > 1 else ''} against {len(main)} of main"
    single = len(candidate) < 2
    as_simplification = simpler is not None and noise is not None and config.simplicity_sigmas > 0
    if delta >= 0:
        band = margin(noise, len(candidate), len(main), config) if noise else None
        numbers = dict(val_bpb=value, delta=delta, margin=band)
        if as_simplification:
            return _simplification(value, base, len(candidate), len(main), noise, simpler, config, band)
        if delta == 0:
            return Decision("discard", f"{name} {shown(value):.6f} ties main: main keeps the tie", **numbers)
        return Decision(
            "discard",
            f"{name} {shown(value):.6f} is worse than main {shown(base):.6f} by {config.size(delta, False)}",
            **numbers,
        )
    if noise is None:
        # No group has two runs yet: a gain of any size could be noise, so nothing may be kept.
        numbers = dict(val_bpb=value, delta=delta, margin=None)
        if single and config.confirm:
            return Decision(
                "confirm",
                f"{name} {shown(value):.6f} improves on main {shown(base):.6f} by {gain}, but the "
                "noise is not known yet (no repeated runs): one confirmation run and one more "
                "run of main",
                extra_main_runs=max(1, config.confirm_main_runs),
                **numbers,
            )
        return Decision(
            "discard",
            f"{name} {shown(value):.6f} improves on main {shown(base):.6f} by {gain}, but the "
            f"noise is not known (no repeated runs), so no gain can be told from noise ({runs})",
            **numbers,
        )
    band = margin(noise, len(candidate), len(main), config)
    numbers = dict(val_bpb=value, delta=delta, margin=band)
    noise_words = f"sigma {noise.sigma:.6f} from {noise.dof} degree{'s' if noise.dof > 1 else ''} of freedom"
    if delta < -band:
        return Decision(
            "keep",
            f"{name} {shown(value):.6f} beats main {shown(base):.6f} by {gain}, more than the noise "
            f"margin {config.size(band, True)} ({runs}, {noise_words})",
            **numbers,
        )
    window = config.confirm_below * standard_error(noise, len(candidate), len(main))
    if single and config.confirm and delta < -window:
        extra = config.confirm_main_runs
        main_words = f" and {extra} more run{'s' if extra > 1 else ''} of main" if extra else ""
        return Decision(
            "confirm",
            f"{name} {shown(value):.6f} improves on main {shown(base):.6f} by {gain}, inside the "
            f"noise margin {config.size(band, True)} but more than {config.confirm_below:g} standard errors "
            f"({config.size(window, True)}): one confirmation run{main_words}",
            extra_main_runs=extra,
            **numbers,
        )
    if as_simplification:
        return _simplification(value, base, len(candidate), len(main), noise, simpler, config, band)
    return Decision(
        "discard",
        f"{name} {shown(value):.6f} improves on main {shown(base):.6f} by only {gain}, inside the "
        f"noise margin {config.size(band, True)} ({runs}, {noise_words}): not a measurable gain",
        **numbers,
    )


def _simplification(
    value: float,
    base: float,
    n_candidate: int,
    n_main: int,
    noise: Noise,
    simpler: Simplification,
    config: JudgeConfig,
    band: float | None,
) -> Decision:
    """Keep, confirm or discard a smaller train.py that the gain rule does not keep: kept when its
    runs rule out, at one-sided `simplicity_z` confidence, a loss larger than `simplicity_sigmas`
    sigma (non-inferiority); judged on two or more runs unless confirmations are off."""
    delta = value - base
    loss_margin = config.simplicity_sigmas * noise.sigma
    numbers = dict(val_bpb=value, delta=delta, margin=band, loss_margin=loss_margin)
    confidence = f"{100 * 0.5 * math.erfc(-config.simplicity_z / math.sqrt(2)):.3g}%"
    allowed = f"{config.size(loss_margin, False)} ({config.simplicity_sigmas:g} sigma)"
    name, shown = config.metric.name, config.shown
    against = f"{name} {shown(value):.6f} against main {shown(base):.6f}"
    head = f"{against} ({config.signed(delta)}), a simplification: {simpler.words()}"
    if n_candidate < 2 and config.confirm:
        below = config.simplicity_confirm_below * loss_margin
        if delta < below:
            extra = config.confirm_main_runs
            main_words = f" and {extra} more run{'s' if extra > 1 else ''} of main" if extra else ""
            return Decision(
                "confirm",
                f"{head}; its run is less than {config.size(below, False)} worse than main, so one confirmation run{main_words} "
                f"to rule out a loss larger than {allowed} at {confidence}",
                extra_main_runs=extra,
                **numbers,
            )
        return Decision(
            "discard",
            f"{head}; but its run is {config.size(delta, False)} worse than main, "
            f"not less than {config.size(below, False)}: too "
            f"much for a confirmation to rule out a loss larger than {allowed}",
            **numbers,
        )
    upper = delta + t_multiplier(config.simplicity_z, noise.dof) * standard_error(noise, n_candidate, n_main)
    runs = f"{n_candidate} run{'s' if n_candidate > 1 else ''} against {n_main} of main"
    noise_words = f"sigma {noise.sigma:.6f} from {noise.dof} degree{'s' if noise.dof > 1 else ''} of freedom"
    if upper < loss_margin:
        bound = f"{'at most' if config.metric.lower_is_better else 'at least'} {config.signed(upper)}"
        return Decision(
            "keep",
            f"kept for simplicity: {simpler.words()}, and the runs rule out a loss larger than {allowed} "
            f"at {confidence}: {against} ({config.signed(delta)}, {bound}; {runs}, {noise_words})",
            **numbers,
        )
    largest = config.size(upper, False) if config.metric.relative else f"{upper:+.6f}"
    return Decision(
        "discard",
        f"{head}; but the runs do not rule out a loss larger than {allowed} at {confidence}: it "
        f"may be as large as {largest} ({runs}, {noise_words})",
        **numbers,
    )
