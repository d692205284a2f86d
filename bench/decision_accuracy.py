"""Benchmark: how often the judge keeps the wrong change, and what its decisions cost in runs.

Simulates the conductor's protocol with one slot and Gaussian run-to-run noise (sigma = 1, so
every effect is in units of sigma), and drives the real `bot.loop.judge.decide` and
`bot.loop.judge.pooled_noise` through it:

- the first main is measured `first_baseline_runs` times; after a keep the new main is measured
  `baseline_runs` times afresh;
- each experiment gets one candidate run; "confirm" queues one more candidate run and
  `extra_main_runs` runs of main, which count in main's values and in the noise;
- the noise is pooled over every group of repeated runs of the same code (each main's runs, each
  candidate's runs); main's values for a comparison are its own baseline runs (and the extra ones)
  only, never a kept candidate's runs.

Three rules go through the same trajectories (same effects, same noise draws):

- OLD: the judge before the Student-t rule, reimplemented here as a reference (`old_rule`).
- NEW: the real judge with its defaults.
- KARPATHY: the reference loop's single-run rule (`karpathy_rule`): keep if the one run is lower
  than main at all; here main is measured once, afresh after each keep, like the others.

The true effect of each proposed change is drawn from one of EFFECTS (below; `--effects`): most
changes hurt or do nothing, some help. A keep is false when the change's true effect is not
negative. Power is measured with probes: at every experiment of every trajectory a change with a
fixed true gain (0, 1, 2, 3 sigma) is judged against the loop's state at that point (its runs and
its extra main runs are drawn, but they do not change the trajectory). The selection bias of a
kept change is its reported delta minus its true effect; the re-measured delta (what the
conductor reports after a keep) is the fresh main's baseline mean minus the old main's mean.

    .venv/bin/python bench/decision_accuracy.py [--trajectories N] [--experiments 100] [--seed S]
                                                [--effects mixed|sparse]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bot.loop.judge import Decision, JudgeConfig, Noise, decide, main_runs_wanted, pooled_noise

MAIN = "m" * 40  # every judged run was measured on the current main: no re-measures in one slot
PROBE_GAINS = (0.0, 1.0, 2.0, 3.0)  # true gains of the probe changes, in sigma
EARLY = 10  # "early in a loop": experiments 1-10
MAX_CONFIRMATIONS = 5  # a rule that keeps asking for runs is cut off here (none of the three does)


@dataclass(frozen=True)
class Effects:
    """A distribution of the true effects of proposed changes, in sigma (negative is better)."""

    name: str
    description: str
    null: float  # share of changes with no effect
    harmful: float  # share that hurt, by Exponential(mean harm) sigma
    harm: float
    helpful_gains: tuple[float, ...] = ()  # the rest help by one of these gains, equally likely...
    help_mean: float = 0.0  # ...or, when no gains are listed, by Exponential(mean help_mean) sigma

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        kind, size = rng.random(n), rng.exponential(1.0, n)
        if self.helpful_gains:
            gain = np.asarray(self.helpful_gains)[rng.integers(0, len(self.helpful_gains), n)]
        else:
            gain = self.help_mean * rng.exponential(1.0, n)
        return np.where(kind < self.null, 0.0, np.where(kind < self.null + self.harmful, self.harm * size, -gain))


EFFECTS = {
    # The default: an agent editing a tuned train.py. Most edits break something, often clearly
    # (karpathy's own run kept 22 of 126 with no margin at all); a fifth do nothing measurable; a
    # fifth help, by 1, 2 or 3 sigma.
    "mixed": Effects(
        "mixed",
        "20% no effect; 60% harmful, +Exponential(mean 4 sigma); 20% helpful, a gain of 1, 2 or 3 sigma equally likely",
        null=0.2,
        harmful=0.6,
        harm=4.0,
        helpful_gains=(1.0, 2.0, 3.0),
    ),
    # A harder world: half the edits do nothing and the helpful ones are mostly small, so few
    # keeps are possible and false keeps weigh more among them.
    "sparse": Effects(
        "sparse",
        "50% no effect; 30% harmful, +Exponential(mean 2 sigma); 20% helpful, -Exponential(mean 1.5 sigma)",
        null=0.5,
        harmful=0.3,
        harm=2.0,
        help_mean=1.5,
    ),
}


JudgeFn = Callable[[list[float], list[float], Noise | None], Decision]


@dataclass(frozen=True)
class Rule:
    name: str
    judge: JudgeFn
    first_baseline_runs: int
    baseline_runs: int


def new_rule(config: JudgeConfig | None = None) -> JudgeFn:
    """The real judge (bot/loop/judge.py) with `config`, defaults unless given."""
    config = config or JudgeConfig()

    def judge(candidate: list[float], main: list[float], noise: Noise | None) -> Decision:
        return decide(
            candidate=candidate, crash=None, main=main, noise=noise, measured_on=MAIN, current_main=MAIN, config=config
        )

    return judge


def old_rule(candidate: list[float], main: list[float], noise: Noise | None) -> Decision:
    """REFERENCE ONLY: the judge's rule before the Student-t change, as it stood in bot/loop/judge.py.

    margin = max(min_margin, 2.0 * sigma * sqrt(1/nc + 1/nm)) with min_margin 0; keep below
    -margin; an improvement inside the margin, or while the noise is unknown, gets one
    confirmation (no extra run of main); ties go to main.
    """
    value, base = statistics.fmean(candidate), statistics.fmean(main)
    delta = value - base
    sigma = noise.sigma if noise else None
    band = 0.0 if sigma is None else 2.0 * sigma * math.sqrt(1 / len(candidate) + 1 / len(main))
    single = len(candidate) < 2
    if delta < 0 and sigma is None and single:
        return Decision("confirm", "noise unknown", value, delta, band)
    if delta < -band:
        return Decision("keep", "beats the margin", value, delta, band)
    if delta < 0 and single:
        return Decision("confirm", "inside the margin", value, delta, band)
    return Decision("discard", "inside the margin or worse", value, delta, band)


def karpathy_rule(candidate: list[float], main: list[float], noise: Noise | None) -> Decision:
    """REFERENCE ONLY: karpathy/autoresearch's rule: keep if the single run is lower at all."""
    value, base = candidate[0], statistics.fmean(main)
    return Decision("keep" if value < base else "discard", "single run", value, value - base, 0.0)


RULES = (
    Rule("OLD (2.0 sigma, fixed z)", old_rule, 2, 2),
    Rule("NEW (Student-t, bot/loop/judge.py)", new_rule(), main_runs_wanted(True), main_runs_wanted(False)),
    Rule("KARPATHY (single run, no margin)", karpathy_rule, 1, 1),
)


class Draws:
    """Standard normal run noise, drawn in blocks with numpy and handed out one at a time."""

    def __init__(self, rng: np.random.Generator, block: int = 1024) -> None:
        self.rng, self.block = rng, block
        self.values: list[float] = []

    def __call__(self) -> float:
        if not self.values:
            self.values = self.rng.standard_normal(self.block).tolist()
        return self.values.pop()


@dataclass
class Tally:
    """What one rule did over all trajectories."""

    experiments: int = 0
    runs: int = 0
    keeps: int = 0
    false_keeps: int = 0
    early_keeps: int = 0
    early_false_keeps: int = 0
    kept_bias: list[float] = field(default_factory=list)  # reported delta - true delta, kept changes
    remeasured_bias: list[float] = field(default_factory=list)  # fresh main mean - old main mean - true delta
    probe_keeps: dict[float, int] = field(default_factory=lambda: {g: 0 for g in PROBE_GAINS})
    probes: int = 0
    first_probe_keeps: dict[float, int] = field(default_factory=lambda: {g: 0 for g in PROBE_GAINS})
    first_probes: int = 0


class Loop:
    """One trajectory's state: main's runs, the finished groups of repeated runs, the noise estimate."""

    def __init__(self, rule: Rule, draw: Draws) -> None:
        self.rule = rule
        self.true_main = 0.0
        self.main = [self.true_main + draw() for _ in range(rule.first_baseline_runs)]
        self.repeated: list[list[float]] = []  # finished groups with 2+ runs: old mains, confirmed candidates
        self.runs = len(self.main)
        self._noise: Noise | None = None
        self._stale = True

    def noise(self, candidate: list[float], main: list[float]) -> Noise | None:
        """The real pooled_noise over every repeated group, this candidate's and main's extra runs included.
        Between changes to the groups the last answer is reused: only its cost is saved."""
        if len(candidate) > 1 or main is not self.main:
            return pooled_noise([main, *self.repeated, candidate])
        if self._stale:
            self._noise, self._stale = pooled_noise([self.main, *self.repeated]), False
        return self._noise

    def judge(self, true_effect: float, draw: Draws, commit: bool) -> Decision:
        """Measure and judge one change; when `commit` is false (a probe) nothing it ran stays."""
        candidate = [self.true_main + true_effect + draw()]
        main = self.main
        for _ in range(MAX_CONFIRMATIONS + 1):
            decision = self.rule.judge(candidate, main, self.noise(candidate, main))
            if decision.action != "confirm":
                break
            candidate.append(self.true_main + true_effect + draw())
            main = main + [self.true_main + draw() for _ in range(decision.extra_main_runs)]
        if commit and (len(candidate) > 1 or main is not self.main):
            self.runs += len(candidate) + len(main) - len(self.main)
            self.main = main
            if len(candidate) > 1:
                self.repeated.append(candidate)
            self._stale = True
        elif commit:
            self.runs += 1
        return decision

    def new_main(self, true_value: float, draw: Draws) -> list[float]:
        """After a keep: main is the kept code, measured afresh; the old main's runs stay a group."""
        self.repeated.append(self.main)
        self.true_main = true_value
        self.main = [true_value + draw() for _ in range(self.rule.baseline_runs)]
        self.runs += len(self.main)
        self._stale = True
        return self.main


def simulate(rule: Rule, trajectories: int, experiments: int, seed: int, effects: Effects = EFFECTS["mixed"]) -> Tally:
    """Run `trajectories` loops of `experiments` experiments under `rule` and count what happened."""
    tally = Tally()
    for trajectory in range(trajectories):
        # Common random numbers: every rule sees the same effects and the same noise streams.
        rng = np.random.default_rng([seed, trajectory])
        true_effects = effects.draw(rng, experiments).tolist()
        draw, probe_draw = Draws(rng), Draws(np.random.default_rng([seed, trajectory, 1]))
        loop = Loop(rule, draw)
        for index, effect in enumerate(true_effects):
            for gain in PROBE_GAINS:
                kept = loop.judge(-gain, probe_draw, commit=False).action == "keep"
                tally.probe_keeps[gain] += kept
                if index == 0:
                    tally.first_probe_keeps[gain] += kept
            tally.probes += 1
            tally.first_probes += index == 0
            decision = loop.judge(effect, draw, commit=True)
            tally.experiments += 1
            if decision.action != "keep":
                continue
            false = effect >= 0
            tally.keeps += 1
            tally.false_keeps += false
            if index < EARLY:
                tally.early_keeps += 1
                tally.early_false_keeps += false
            assert decision.delta is not None
            tally.kept_bias.append(decision.delta - effect)
            old_mean = statistics.fmean(loop.main)
            fresh = loop.new_main(loop.true_main + effect, draw)
            tally.remeasured_bias.append(statistics.fmean(fresh) - old_mean - effect)
        tally.runs += loop.runs
    return tally


def ratio(part: int, whole: int) -> float:
    return part / whole if whole else math.nan


def pct(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{100 * value:.1f}%"


def mean(values: list[float]) -> str:
    return f"{statistics.fmean(values):+.2f}" if values else "n/a"


def table(results: list[tuple[Rule, Tally]]) -> str:
    head = (
        "| rule | main runs (first/later) | false keeps, exp 1-10 | false keeps, all | null kept at exp 1 "
        "| P(keep) at exp 1: 1 / 2 / 3 sigma | P(keep) over the loop: 0 / 1 / 2 / 3 sigma "
        "| runs per experiment | kept-delta bias (sigma) | re-measured-delta bias (sigma) |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for rule, t in results:
        at_first = " / ".join(pct(ratio(t.first_probe_keeps[g], t.first_probes)) for g in PROBE_GAINS[1:])
        over_loop = " / ".join(pct(ratio(t.probe_keeps[g], t.probes)) for g in PROBE_GAINS)
        lines.append(
            f"| {rule.name} | {rule.first_baseline_runs}/{rule.baseline_runs} "
            f"| {pct(ratio(t.early_false_keeps, t.early_keeps))} ({t.early_false_keeps}/{t.early_keeps}) "
            f"| {pct(ratio(t.false_keeps, t.keeps))} ({t.false_keeps}/{t.keeps}) "
            f"| {pct(ratio(t.first_probe_keeps[0.0], t.first_probes))} | {at_first} | {over_loop} "
            f"| {ratio(t.runs, t.experiments):.3f} | {mean(t.kept_bias)} | {mean(t.remeasured_bias)} |"
        )
    return "\n".join(lines)


def targets(t: Tally) -> list[tuple[str, float, bool]]:
    """The judge's targets, each with the measured value and whether it is met."""
    early = ratio(t.early_false_keeps, t.early_keeps)
    overall = ratio(t.false_keeps, t.keeps)
    null = ratio(t.first_probe_keeps[0.0], t.first_probes)
    power = ratio(t.first_probe_keeps[3.0], t.first_probes)
    runs = ratio(t.runs, t.experiments)
    return [
        ("false keeps in experiments 1-10 <= 5% of keeps", early, early <= 0.05),
        ("false keeps overall <= 5% of keeps", overall, overall <= 0.05),
        ("a null change kept at experiment 1 <= 5%", null, null <= 0.05),
        ("P(keep) of a true 3-sigma gain at experiment 1 >= 80%", power, power >= 0.80),
        ("runs per experiment <= 1.45", runs, runs <= 1.45),
    ]


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        kib = next(
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        )
        memory = f", {kib / 2**20:.0f} GiB"
    except (OSError, StopIteration, ValueError):
        memory = ""
    return f"{os.cpu_count()} cores {cpu}{memory}, Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trajectories", type=int, default=8000)
    parser.add_argument("--experiments", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--effects", choices=sorted(EFFECTS), default="mixed")
    args = parser.parse_args(argv)
    effects = EFFECTS[args.effects]
    started = time.perf_counter()
    results = [(rule, simulate(rule, args.trajectories, args.experiments, args.seed, effects)) for rule in RULES]
    elapsed = time.perf_counter() - started
    command = " ".join(
        shlex.quote(a)
        for a in [".venv/bin/python", "bench/decision_accuracy.py", *(sys.argv[1:] if argv is None else argv)]
    )
    print(f"Command: `{command}`  ")
    print(f"Date: {time.strftime('%Y-%m-%d')}; machine: {machine()}; {elapsed:.0f} s  ")
    print(
        f"{args.trajectories} trajectories x {args.experiments} experiments, seed {args.seed}; one slot, "
        f"Gaussian noise (sigma 1); true effects ({effects.name}): {effects.description}.\n"
    )
    print(table(results))
    new = next(t for rule, t in results if rule.name.startswith("NEW"))
    print("\nTargets for NEW:")
    for text, value, met in targets(new):
        shown = f"{value:.3f}" if text.startswith("runs") else pct(value)
        print(f"- {text}: {shown} ({'met' if met else 'NOT met'})")


if __name__ == "__main__":
    main()
