"""Paired seeds: which runs of a change pair with main's, the paired noise they pool to, and the
paired rule that judges a change on them, a second way to a keep beside bot.loop.judge's rule.

A candidate's run on a main takes one of that main's seeds, the one whose pairs overlap least with
other experiments' there (bot.store.runs: no code runs twice under one seed, so a new main's runs
are fresh draws, not its kept candidate's repeated). Where the
task's evaluation draws from the seed whatever the asset (Task.seed_pairs: ticket routing's
hold-out split), every run pairs with main's of its seed. In training, when the candidate keeps
main's parameters (the scorer's fingerprint of their names, shapes and dtypes is main's), the two
runs of a seed start from the same weights (torch.manual_seed(seed)), and their difference d =
candidate - main cancels what the seed explains (measured at equal steps on the cpu profile: a
schedule constant's d varies about a tenth as much as an unpaired difference, a learning rate's a
quarter; a new layer's or a depth's, whose initial draws all move, about as much).

Which runs pair (`paired_differences`): a seed pairs when exactly one counted run on each side has
it and, unless the task's seeds pair whatever the asset, the two report the same parameters'
fingerprint (a task whose seed decides nothing of its measurement, query latency's, has neither
and never pairs); a run of main set aside as an outlier pairs with nothing. The paired noise
sigma_d (`PairedPool`) is pooled, as judge.pooled_noise pools runs, from the deviations of d
within each experiment that has 2+ pairs; its degrees of freedom are not those pairs less one,
summed: every experiment on one main subtracts the same few runs of main, so the pool knows about
those runs no more than their own spread tells (PairedPool says how they are counted).

The rule (`Pairs.verdict`, which judge.decide asks after its own rule) is never a replacement: what
the unpaired rule keeps stays kept, and it is used only where the data say it pays: the pool has
`paired_min_dof` (4) degrees of freedom and sigma_d^2 is at most `paired_pays` (0.5) sigma^2 (a
paired difference varies at most a quarter as much as an unpaired one, 2 sigma^2) with one-sided 95%
confidence (`paired_pays_p`: an F test of the two estimates; a point estimate let pools that came out
small by chance in, and judged with them). Then a pair lower
than main by more than `confirm_below` of its standard error sigma_d/sqrt(n) earns one more run
under the next seed (and main a run under that seed if it lacks one: the lifecycle queues it), up
to `paired_keep_pairs` (3) pairs; on 3 pairs the change is kept when mean(d) clears
k * sigma_d/sqrt(n), k the Student-t quantile of `confirm_sigmas` at the pool's degrees of freedom.
A pool is as honest as its changes are alike: a change that keeps main's shapes but shares nothing
else with it (a random draw added before the weights are made) has a d that varies like an unpaired
difference, and judged with a pooled sigma_d a tenth of that, a null such change would clear the
margin on three pairs about one time in four. So a paired keep needs its own pairs to agree with the
pool: its d's spread, on n-1 degrees of freedom, must not exceed the rest of the pool's by more than
a one-sided 5% F test allows (`paired_spread_p`), or it is judged by the unpaired rule alone.
Anything else the paired rule does not decide goes to the unpaired rule.

Measured on the real tick (bench/decision_accuracy.py --paired-seeds --rho 0.5 0.9 --slots 1
--noise gauss --trajectories 40, half the changes reshaping the model): with a seed deciding 90% of
a run's noise, a true 2-sigma gain that keeps main's parameters is kept 57.6% of the time instead of
50.4%, at 0.9% more runs per experiment, 19 paired keeps and none false; with half (rho 0.5), where
a paired difference varies as much as an unpaired one and pairing cannot pay, nothing is judged
paired. Before the degrees of freedom were counted as above and the gate asked for confidence, the
same loops gave 67.6% at 3.5% more runs (66 paired keeps, 1 false) at rho 0.9, and 6 paired keeps (1
false) at rho 0.5; counting alone left 5 (2 false) there, and a gate at 80% confidence 3 (2 false).
With none (rho 0) nothing is judged paired and nothing changes. Since candidates spread over main's seeds
(bot.store.runs), the same loops at rho 0.9 keep a pairable 2-sigma gain 56.1% of the time with pairing on
and 50.4% with it off (43.9% and 41.7% when every candidate took main's first seeds), 9 paired keeps, none
false: most of that gain is the unpaired comparison's, and the pool at a loop's end still knows about 5
degrees of freedom, since after the first main each main has 2 runs for every experiment to subtract
(docs/benchmarks.md, "The judge's paired rule").
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple

from bot.loop.judge import Decision, JudgeConfig, Noise, t_multiplier

if TYPE_CHECKING:
    from bot.loop.measurement import MainRuns


Side = tuple[int, str]  # an experiment's runs of one train.py: (experiment, its code_hash)


class Paired(NamedTuple):
    """One side's pairs, in seed order: its runs minus main's under the same seed, and the positions
    (in the values) of main's runs they subtract."""

    differences: list[float]
    main_runs: list[int]


def paired_differences(
    values: Sequence[tuple[str, int | None, str, float]],
    seeded: Sequence[tuple[int, str, str | None]],
    main_code_at: Mapping[str, str],
    main_runs_of: Callable[[str], MainRuns],
    *,
    seed_pairs: bool = False,
) -> dict[Side, Paired]:
    """Each experiment's runs minus main's under the same seed, by (experiment, code_hash of its
    train.py), in seed order. `seeded` holds, for each of `values`, the run's seed, the main it was
    measured on and the scorer's fingerprint of its parameters (None when its runner reported none):
    store.runs.measured_runs gives both. `main_code_at` gives the code_hash
    of main's train.py at a run's base_sha (a run whose main is not in it pairs with nothing);
    `main_runs_of(code_hash)` gives main's runs as the judge reads them (measurement.main_runs: a run
    set aside pairs with nothing either). A seed pairs when exactly one counted run on each side has
    it and the two report the same parameters' fingerprint: a change that reshapes, adds or drops a
    parameter draws other initial weights under the same seed and shares little with main. With
    `seed_pairs` (the task's evaluation draws from the seed whatever the asset: Task.seed_pairs) no
    fingerprint is asked for."""
    main_by_seed: dict[str, dict[int, list[int]]] = {}
    for code in {c for c, _, purpose, _ in values if purpose == "baseline"}:
        by_seed = main_by_seed.setdefault(code, {})
        for i in main_runs_of(code).positions:
            by_seed.setdefault(seeded[i][0], []).append(i)
    sides: dict[Side, dict[int, list[int]]] = {}
    for i, (code, experiment, purpose, _) in enumerate(values):
        if purpose != "baseline" and experiment is not None:
            sides.setdefault((experiment, code), {}).setdefault(seeded[i][0], []).append(i)
    found: dict[Side, Paired] = {}
    for side, by_seed in sides.items():
        paired = Paired([], [])
        for seed, own in sorted(by_seed.items()):
            main_code = main_code_at.get(seeded[own[0]][1])
            partner = main_by_seed.get(main_code or "", {}).get(seed, [])
            if len(own) != 1 or len(partner) != 1:
                continue
            i, j = own[0], partner[0]
            if seed_pairs or (seeded[i][2] is not None and seeded[i][2] == seeded[j][2]):
                paired.differences.append(values[i][3] - values[j][3])
                paired.main_runs.append(j)
        if paired.differences:
            found[side] = paired
    return found


@dataclass(frozen=True)
class PairedPool:
    """The paired noise's sums over the sides with two pairs or more, each side's share kept apart
    so that the pool without one side (what a paired keep's own spread is tested against) is at hand.

    The sum of squares is the deviations of each side's differences from their own mean, as
    judge.pooled_noise pools runs, and sigma_d^2 is that over `counted` = sum of (pairs - 1). But the
    sides measured on one main subtract some of the same runs of main, so their deviations share
    those runs' deviations, and `counted` overstates how much the estimate knows: with many sides on
    one main, sigma_d^2 tends to what that main's few runs happened to spread, not to the truth. The degrees of freedom are those of the sum of squares as a quadratic
    form in the runs' independent noise (Satterthwaite: 2 E[SS]^2 / Var[SS] = tr(A)^2 / tr(A^2)),
    with a candidate's run and main's the same variance once the seed's share cancels (the judge's
    unpaired pool assumes as much): 4 D^2 / (4 D + T), D = `counted` and T = `shared`, the sum over
    ordered pairs of sides e, f of |C_e M C_f|^2 (C centres a side's differences, M matches the main
    runs two sides share): for k shared runs among n_e and n_f pairs, k (1 - 1/n_e - 1/n_f) +
    k^2 / (n_e n_f). Sides that share nothing give D; m sides of n pairs on the same n runs of main
    give 4 m (n - 1) / (m + 3), at most 4 (n - 1) however many they are; spread over main's N runs
    so that each two runs of main are shared about equally (what bot.store.runs's seed choice aims
    at), E[k] = n^2/N and E[k(k - 1)] = n^2 (n - 1)^2 / (N (N - 1)) make each ordered pair's term
    (n - 1)^2 / (N - 1), so 4 m (n - 1)(N - 1) / (4 (N - 1) + (m - 1)(n - 1)), growing to 4 (N - 1):
    main's N - 1 degrees of freedom, at the half of a difference's variance that main's run holds (on
    the first main's 6 runs, 11 for 20 sides of 2 pairs where main's first 2 runs allow 3; the seeds
    the store gives do a little better than that average). Rounded down."""

    squares: dict[Side, float]  # each side's sum of squared deviations from its own mean
    counted: dict[Side, int]  # each side's pairs less one
    shared: dict[Side, float]  # each side's overlap with the others, summed over them

    def noise(self, without: Side | None = None) -> Noise | None:
        """sigma_d with its degrees of freedom, over every side but `without`; None while no side with
        two pairs or more is left."""
        counted = sum(n for side, n in self.counted.items() if side != without)
        if not counted:
            return None
        squares = sum(s for side, s in self.squares.items() if side != without)
        shared = sum(t for side, t in self.shared.items() if side != without)
        if without in self.shared:
            shared -= self.shared[without]  # its overlaps counted from the other side of each pair
        dof = max(1, math.floor(4 * counted**2 / (4 * counted + shared)))
        return Noise(sigma=math.sqrt(squares / counted), dof=dof)


def paired_pool(found: Mapping[Side, Paired]) -> PairedPool:
    """The paired pool of `found` (paired_differences): sums of squares and overlaps by side."""
    pooled = {side: paired for side, paired in found.items() if len(paired.differences) >= 2}
    squares, counted, shared = {}, {}, {}
    by_main_run: dict[int, list[Side]] = {}
    for side, paired in pooled.items():
        mean = statistics.fmean(paired.differences)
        squares[side] = sum((d - mean) ** 2 for d in paired.differences)
        counted[side] = len(paired.differences) - 1
        shared[side] = 0.0
        for j in paired.main_runs:
            by_main_run.setdefault(j, []).append(side)
    overlaps: dict[tuple[Side, Side], int] = {}
    for sides in by_main_run.values():
        for e in sides:
            for f in sides:
                if e != f:
                    overlaps[(e, f)] = overlaps.get((e, f), 0) + 1
    for (e, f), k in overlaps.items():
        n_e, n_f = len(pooled[e].differences), len(pooled[f].differences)
        shared[e] += k * (1 - 1 / n_e - 1 / n_f) + k**2 / (n_e * n_f)
    return PairedPool(squares, counted, shared)


@dataclass(frozen=True)
class Pairs:
    """What the paired rule reads of one experiment: `differences`, its runs minus main's under the
    same seeds (each seed with one run on each side and the same parameters' fingerprint); `noise`,
    the paired noise pooled over every experiment's differences (None while no experiment has two
    pairs); `rest`, that pool without this experiment's own pairs (None when nothing else is in it).
    PairedPool.noise gives both."""

    differences: list[float]
    noise: Noise | None
    rest: Noise | None

    def verdict(self, noise: Noise, unpaired: Decision, candidate: list[float], config: JudgeConfig) -> Decision | None:
        """The paired rule's keep or confirmation, None where it does not pay or does not decide (the
        unpaired verdict stands); `unpaired` gets a note when its own pairs kept it from a paired keep.
        A candidate with `paired_keep_pairs` runs gets no more, paired or not."""
        pool, d = self.noise, self.differences
        if not d or pool is None or pool.dof < config.paired_min_dof or not _pays(pool, noise, config):
            return None
        n, value = len(d), statistics.fmean(candidate)
        mean = statistics.fmean(d)
        error = pool.sigma / math.sqrt(n)
        seeds = f"{n} seed{'s' if n > 1 else ''}"
        name, shown = config.metric.name, config.shown
        words = (
            f"paired on {seeds}: mean difference from main under the same seed {config.signed(mean)}, sigma_d "
            f"{pool.sigma:.6f} from {pool.dof} degrees of freedom against sigma {noise.sigma:.6f}"
        )
        if n >= config.paired_keep_pairs:
            band = max(config.min_margin, t_multiplier(config.confirm_sigmas, pool.dof) * error)
            if mean >= -band:
                return None
            spread = _spread_beyond_pool(d, self.rest, config.paired_spread_p)
            if spread is not None:
                return replace(unpaired, reason=f"{unpaired.reason} (not judged paired: {spread})")
            return Decision(
                "keep",
                f"{name} {shown(value):.6f} beats main by {config.size(-mean, True)} seed for seed, more than the paired noise "
                f"margin {config.size(band, True)} ({words})",
                val_bpb=value,
                delta=mean,
                margin=band,
                paired=True,
            )
        window = config.confirm_below * error
        if not config.confirm or mean >= -window or len(candidate) >= config.paired_keep_pairs:
            return None
        return Decision(
            "confirm",
            f"{name} {shown(value):.6f} improves on main by {config.size(-mean, True)} seed for seed, more than "
            f"{config.confirm_below:g} paired standard errors ({config.size(window, True)}): one more run under the next seed "
            f"({words})",
            val_bpb=value,
            delta=mean,
            margin=max(config.min_margin, t_multiplier(config.confirm_sigmas, pool.dof) * error),
            paired=True,
        )


def _pays(pool: Noise, noise: Noise, config: JudgeConfig) -> bool:
    """Whether the paired noise's variance is at most `paired_pays` of the unpaired one's with one-sided
    confidence `paired_pays_p`: their ratio, over the F quantile at 1 - p of their degrees of freedom,
    is at most that share. A pool that came out small by chance, as a few degrees of freedom often do,
    would otherwise let the paired rule judge with a sigma_d smaller than the truth."""
    # imported here for the reason judge.t_multiplier gives
    from scipy import special

    low = float(special.fdtri(pool.dof, noise.dof, 1 - config.paired_pays_p))
    return pool.sigma**2 <= config.paired_pays * low * noise.sigma**2


def _spread_beyond_pool(d: Sequence[float], rest: Noise | None, p: float) -> str | None:
    """Why these differences spread more than the rest of the pool allows (an F test at quantile `p`
    of their variance on len-1 degrees of freedom against `rest`, the pool without them), or None."""
    if rest is None:
        return None  # the pool is its own pairs: their spread is the sigma_d it is judged with
    n = len(d)
    variance = statistics.variance(d)
    ratio = variance / rest.sigma**2 if rest.sigma > 0 else math.inf
    # imported here for the reason judge.t_multiplier gives
    from scipy import special

    limit = float(special.fdtri(n - 1, rest.dof, p))
    if ratio <= limit:
        return None
    return (
        f"its {n} pairs spread sd {math.sqrt(variance):.6f}, {ratio:.1f} times the variance of the "
        f"rest of the paired pool, more than its {100 * p:g}% quantile {limit:.1f} allows"
    )
