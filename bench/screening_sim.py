"""Benchmark: what screening buys, simulated with the real judge (issue 20).

    .venv/bin/python bench/screening_sim.py [--measured FILE.jsonl] [--trajectories 100]
        [--experiments 100] [--gains 1 2 3] [--gain-share 0.2] [--rho 0.5 0.7 0.9]
        [--screen 0 0.5 1] [--short-cost 0.33] [--seed 0]

One run after another, as bench/decision_accuracy.py's sequential model: every hypothesis of a loop
is judged by the real judge (bot/loop/judge.py's `decide`, on `pooled_noise` of main's and the
confirmed candidates' full runs, with program.md's default settings), main measured as the loop
measures it (6 runs first, 2 afresh after each keep) and a confirmation's extra run of main beside
it. Values are in units of a full run's standard deviation.

A hypothesis's true effect at the full budget: a gain of `g` sigma with probability `--gain-share`,
else no effect or (as often) a loss of |N(0, 2)| sigma. Its short run (a fifth of the budget)
measures `beta * value + mismatch + noise`: `beta`, the share of a full-budget effect a short run
shows; `mismatch`, the change's own short-budget deviation (an effect that shows early and fades,
or the reverse), fixed per change and carried by a kept one into main; `noise`, the short run's
run-to-run deviation. From a measurement (bench/screening.py), in full-run sigmas:

    beta = cov(short, full) / var(effect),  var(effect) = var(full deltas) - sigma_full^2
    noise = main's short runs' sd,          mismatch^2 = var(short deltas) - beta^2 var(effect) - noise^2

and rho, the correlation of a short delta with the true effect over the measured effects' spread,
is `beta sd(effect) / sqrt(beta^2 var(effect) + mismatch^2 + noise^2)`. The rows at a higher rho
scale mismatch and noise down together to reach it (what a profile would have to show).

SCREENING at threshold t: every hypothesis gets one short run first, and goes on to full runs and the
judge only when its short delta against the mean of main's short runs is below t short standard
errors (sigma from main's short runs, pooled apart from the full ones); otherwise it ends
screened out, a discard. Main gets short runs too (as many as full ones). A short run costs
`--short-cost` of a full one: a fifth of the budget plus the start-up and evaluation every run pays
(0.33 on h100: 60 s + 60 s of 360; bench/screening.py measures the cpu profile's).

Reported per rule: hypotheses decided, full-run equivalents spent, true gains kept ("validated
decisions": a keep whose change truly helps), false keeps (a keep of a change that does not help)
per 100 hypotheses, and true keeps per GPU-hour at 5-minute full runs (12 full runs an hour, the
reference's pace), with the ratio to no screening.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bot.loop.judge import JudgeConfig, Noise, decide, main_runs_wanted, pooled_noise  # noqa: E402

MAIN = "m" * 40  # every run is judged on the current main: no re-measures
FULL_RUNS_PER_HOUR = 12.0  # 5-minute runs, the reference's pace on one GPU


@dataclass(frozen=True)
class ShortModel:
    """A short run's value: beta * true value + the change's mismatch + run noise (full sigmas)."""

    beta: float
    mismatch: float
    noise: float

    def rho(self, spread: float) -> float:
        """The correlation of a short delta with the true effect, over effects of sd `spread`."""
        signal = self.beta * spread
        total = math.sqrt(signal**2 + self.mismatch**2 + self.noise**2)
        return signal / total if total > 0 else 0.0

    def at_rho(self, rho: float, spread: float) -> ShortModel:
        """This model with mismatch and noise scaled together so that rho(spread) is `rho`."""
        beta = self.beta if self.beta > 0 else 1.0
        mismatch, noise = (self.mismatch, self.noise) if self.mismatch + self.noise > 0 else (1.0, 1.0)
        wanted = beta * spread * math.sqrt(1 / rho**2 - 1)
        scale = wanted / math.hypot(mismatch, noise)
        return ShortModel(beta, mismatch * scale, noise * scale)


@dataclass(frozen=True)
class Fitted:
    """What a measurement says, in full-run sigmas."""

    model: ShortModel
    spread: float  # sd of the proposals' true effects
    sigma_full: float  # of one full run, in val_bpb
    proposals: int


def fit(path: Path) -> Fitted:
    """The short-run model from a measurement file of bench/screening.py."""
    from screening import load  # bench/screening.py beside this file

    found = load(path)
    both = sorted(set(found.short) & set(found.full))
    repeated = [[found.full[k], found.full_again[k]] for k in found.full if k in found.full_again]
    full_noise = pooled_noise([found.main.get(1.0, []), *repeated])
    if full_noise is None or len(both) < 3:
        raise SystemExit(f"{path}: too few runs to fit (main's full runs repeated, 3 proposals at both budgets)")
    sigma = full_noise.sigma
    short = np.array([found.short[k] for k in both]) / sigma
    full = np.array([found.full[k] for k in both]) / sigma
    var_effect = float(np.var(full, ddof=1)) - 1.0
    if var_effect <= 0:
        raise SystemExit(
            f"{path}: the proposals' full deltas spread no more than one full run's noise "
            f"(sd {math.sqrt(var_effect + 1):.2f} sigma): their effects are not measurable, so neither is beta; "
            "measure more proposals, or simulate at assumed --rho without --measured"
        )
    beta = float(np.cov(short, full, ddof=1)[0, 1]) / var_effect
    noise = found.main_sd(found.fraction) / sigma
    mismatch_sq = float(np.var(short, ddof=1)) - beta**2 * var_effect - noise**2
    return Fitted(ShortModel(beta, math.sqrt(max(mismatch_sq, 0.0)), noise), math.sqrt(var_effect), sigma, len(both))


@dataclass
class Tally:
    hypotheses: int = 0
    cost: float = 0.0  # in full runs
    screened_out: int = 0
    true_keeps: int = 0
    false_keeps: int = 0
    gains: int = 0

    def add(self, other: Tally) -> None:
        for name in vars(self):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def true_keeps_per_hour(self) -> float:
        return FULL_RUNS_PER_HOUR * self.true_keeps / self.cost if self.cost else math.nan


@dataclass
class Loop:
    """One trajectory: main's full and short runs, and the finished groups of each."""

    rng: np.random.Generator
    model: ShortModel
    config: JudgeConfig
    short_cost: float
    screen: float | None  # the threshold in short standard errors; None: no screening
    true_main: float = 0.0
    main_mismatch: float = 0.0
    main: list[float] = field(default_factory=list)
    main_short: list[float] = field(default_factory=list)
    repeated: list[list[float]] = field(default_factory=list)
    repeated_short: list[list[float]] = field(default_factory=list)
    tally: Tally = field(default_factory=Tally)

    def measure_main(self, runs: int) -> None:
        self.main = [self.full_run(self.true_main) for _ in range(runs)]
        self.tally.cost += runs
        if self.screen is not None:
            self.main_short = [self.short_run(self.true_main, self.main_mismatch) for _ in range(runs)]
            self.tally.cost += runs * self.short_cost

    def full_run(self, true_value: float) -> float:
        return true_value + float(self.rng.standard_normal())

    def short_run(self, true_value: float, mismatch: float) -> float:
        return self.model.beta * true_value + mismatch + self.model.noise * float(self.rng.standard_normal())

    def promising(self, effect: float, mismatch: float) -> bool:
        """The screen: one short run, below `screen` short standard errors against main's short runs."""
        assert self.screen is not None
        value = self.short_run(self.true_main + effect, mismatch)
        self.tally.cost += self.short_cost
        noise = pooled_noise([self.main_short, *self.repeated_short])
        if noise is None:
            return True
        error = noise.sigma * math.sqrt(1 + 1 / len(self.main_short))
        return value - statistics.fmean(self.main_short) < self.screen * error

    def judge(self, effect: float) -> str:
        """Full runs and the judge's verdict on one change: keep or discard (or screened out)."""
        mismatch = self.model.mismatch * float(self.rng.standard_normal())
        self.tally.hypotheses += 1
        self.tally.gains += effect < 0
        if self.screen is not None and not self.promising(effect, mismatch):
            self.tally.screened_out += 1
            return "screened out"
        candidate = [self.full_run(self.true_main + effect)]
        main = self.main
        while True:
            noise: Noise | None = pooled_noise([main, *self.repeated, candidate])
            decision = decide(
                candidate=candidate,
                crash=None,
                main=main,
                noise=noise,
                measured_on=MAIN,
                current_main=MAIN,
                config=self.config,
            )
            if decision.action != "confirm":
                break
            candidate.append(self.full_run(self.true_main + effect))
            main = main + [self.full_run(self.true_main) for _ in range(decision.extra_main_runs)]
        self.tally.cost += len(candidate) + len(main) - len(self.main)
        self.main = main
        if len(candidate) > 1:
            self.repeated.append(candidate)
        if decision.action == "keep":
            self.tally.true_keeps += effect < 0
            self.tally.false_keeps += effect >= 0
            self.repeated.append(self.main)
            if self.main_short:
                self.repeated_short.append(self.main_short)
            self.true_main += effect
            self.main_mismatch = mismatch
            self.measure_main(main_runs_wanted(False))
        return decision.action


def effects(rng: np.random.Generator, count: int, gain: float, gain_share: float) -> list[float]:
    """A loop's true effects: -gain with probability gain_share, else 0 or a loss of |N(0, 2)|."""
    found = []
    for _ in range(count):
        if rng.random() < gain_share:
            found.append(-gain)
        else:
            found.append(0.0 if rng.random() < 0.5 else abs(2.0 * float(rng.standard_normal())))
    return found


def simulate(model: ShortModel, screen: float | None, gain: float, args: argparse.Namespace) -> Tally:
    total = Tally()
    config = JudgeConfig()
    for index in range(args.trajectories):
        draws = effects(np.random.default_rng([args.seed, index, 0]), args.experiments, gain, args.gain_share)
        loop = Loop(np.random.default_rng([args.seed, index, 1]), model, config, args.short_cost, screen)
        loop.measure_main(main_runs_wanted(True))
        for effect in draws:
            loop.judge(effect)
        total.add(loop.tally)
    return total


def table(models: list[tuple[str, ShortModel]], args: argparse.Namespace) -> str:
    lines = [
        "| short runs | gain | rule | full runs / 100 hyp. | screened out | true keeps / 100 | "
        "gains kept | false keeps / 100 | true keeps / GPU-hour | vs none |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for gain in args.gains:
        base = simulate(models[0][1], None, gain, args)
        rows = [("-", "no screening", base)]
        for name, model in models:
            for threshold in args.screen:
                rows.append((name, f"screen below {threshold:+g} SE", simulate(model, threshold, gain, args)))
        for name, rule, t in rows:
            per = 100 / t.hypotheses
            lines.append(
                f"| {name} | {gain:g} sigma | {rule} | {t.cost * per:.0f} | {t.screened_out * per:.0f}% | "
                f"{t.true_keeps * per:.1f} | {100 * t.true_keeps / max(1, t.gains):.0f}% | "
                f"{t.false_keeps * per:.2f} | {t.true_keeps_per_hour:.2f} | "
                f"{t.true_keeps_per_hour / base.true_keeps_per_hour:.2f}x |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measured", type=Path, default=None, help="a bench/screening.py measurement to fit")
    parser.add_argument("--trajectories", type=int, default=100)
    parser.add_argument("--experiments", type=int, default=100)
    parser.add_argument("--gains", type=float, nargs="+", default=[1.0, 2.0, 3.0])
    parser.add_argument("--gain-share", type=float, default=0.2)
    parser.add_argument("--rho", type=float, nargs="+", default=[0.5, 0.7, 0.9])
    parser.add_argument("--screen", type=float, nargs="+", default=[0.0, 0.5, 1.0])
    parser.add_argument("--short-cost", type=float, default=0.33, help="a short run's cost in full runs")
    parser.add_argument("--spread", type=float, default=2.0, help="sd of effects for rho without a measurement")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    models: list[tuple[str, ShortModel]] = []
    spread = args.spread
    base = ShortModel(1.0, 1.0, 1.0)
    if args.measured is not None:
        fitted = fit(args.measured)
        spread, base = fitted.spread, fitted.model
        print(
            f"fitted on {fitted.proposals} proposals: beta {base.beta:.2f}, mismatch {base.mismatch:.2f}, "
            f"noise {base.noise:.2f} (full sigma {fitted.sigma_full:.5f}), effects' sd {spread:.2f}: "
            f"rho {base.rho(spread):.2f}"
        )
        models.append((f"measured, rho {base.rho(spread):.2f}", base))
    models += [(f"rho {rho:g}", base.at_rho(rho, spread)) for rho in args.rho]
    print(
        f"{args.trajectories} loops of {args.experiments} hypotheses, {100 * args.gain_share:g}% gains; "
        f"a short run costs {args.short_cost:g} of a full one; effects' sd for rho {spread:.2f}\n"
    )
    print(table(models, args))


if __name__ == "__main__":
    main()
