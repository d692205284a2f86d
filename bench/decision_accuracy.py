"""Benchmark: how often the judge keeps the wrong change, and what its decisions cost in runs, on the
schedule the conductor really runs.

Every loop has `--experiments` (100) changes whose true effects, in sigma (the run-to-run standard
deviation), come from one of schedule_sim.EFFECTS (`--effects`; most changes hurt or do nothing,
some help), and runs whose noise comes from one of schedule_sim.NOISE (`--noise`): Gaussian,
Student-t(3), 5% of runs worse by 4 sigma, or a drift of the measurement (a random walk of 0.15
sigma per run's time). Three ways of running them, on the same effects:

- THE REAL TICK: bench/schedule_sim.py drives the conductor itself (bot.loop.conductor, its
  baseline, proposals, lifecycle and runs, and the judge of bot/loop/judge.py) with a simulated
  runner of K slots (`--slots`: 1 4 16) and the default lookahead (one proposal per slot), the
  agent answering at once;
- ONE RUN AFTER ANOTHER: a model of the protocol with one slot and nothing overlapping: an
  experiment's confirmation and the extra run of main beside it land before its verdict, and no
  candidate runs on a main about to move; the judge is the real `decide` and `pooled_noise`;
- THE REFERENCE: karpathy/autoresearch's rule in the same model: one run, kept if lower than main
  at all; main measured once, afresh after each keep.

PAIRED SEEDS (`--paired-seeds`): the real tick with a noise that a run's seed shares: each run's
noise is sqrt(rho) z_seed + sqrt(1 - rho) z_run, z_seed shared by every run of one seed whose train.py
keeps the same parameters (schedule_sim.SimRunner), for each `--rho`; `--reshaping` (0.5) of the
changes change the model's parameters (their own z_seed, and a fingerprint of their own: they never
pair), and `--decorrelated` (0) of them keep the parameters but share nothing under a seed (the
attack on the paired pool: a change the fingerprint calls pairable whose differences spread like
unpaired ones). Each loop runs twice on the same draws: pairing off (the runner reports no
fingerprint, as before) and on (it does, as runner.score does).

OTHER RULES (`--set KEY=VALUE ...`): program.md's settings of the judge and of main's runs
(baseline_runs=3, confirm_below=1.0, ...) for the real tick and the sequential model alike, as the
loop reads them, so that a rule is measured against the defaults on the same loops; the reference
is unchanged. `--second-confirmation WINDOW MAIN_RUNS` adds a rule not built to the sequential model:
a change discarded on two runs lower than main by more than WINDOW standard errors gets a third run
(and MAIN_RUNS of main), judged at the two-run threshold.

A keep is false when the change's true effect is not negative. "Experiment 1": P(keep) of a change
with no effect, and of a true 3-sigma gain, when it is the loop's first experiment (probe loops,
the first change forced, run until its verdict; the sequential model judges it beside the loop
without changing it). "Later": the share of the loop's own true 3-sigma gains (experiments 2 and
on) that were kept. Runs per experiment: every run started, main's included, over the experiments.
Runs on a main that had moved: runs that ended when main was no longer the main they measured
against (per 100 experiments). Biases, in sigma, over kept changes: the delta the keep was judged
on minus the true effect, and the re-measured delta (the new main's fresh baseline against the
old main's) minus the true effect.

    .venv/bin/python bench/decision_accuracy.py [--trajectories 100] [--sequential 4000] [--slots 1 4 16]
        [--noise gauss t3 outliers drift] [--effects mixed|sparse] [--experiments 100] [--seed 0] [--jobs N]
        [--paired-seeds [--rho 0 0.5 0.9] [--reshaping 0.5] [--decorrelated 0]] [--set KEY=VALUE ...]
        [--second-confirmation WINDOW MAIN_RUNS]
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import numpy as np

# this bench and schedule_sim beside it, and the bot package of the tree this file is in (not the one
# the virtual environment was installed from: a copy of the tree measures its own code)
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import schedule_sim  # noqa: E402
from schedule_sim import EFFECTS, NOISE, Effects, NoiseModel, program_md  # noqa: E402

from bot.core.simplicity import Simplification  # noqa: E402
from bot.loop.judge import (  # noqa: E402
    Decision,
    JudgeConfig,
    Noise,
    decide,
    judge_config,
    main_runs_wanted,
    pooled_noise,
    standard_error,
)
from bot.loop.program import SettingsError, parse_program  # noqa: E402

EARLY = 10  # "early in a loop": experiments 1-10
GAIN = 3.0  # the gain whose P(keep) is reported, in sigma
SMALL_GAIN = 2.0  # the gain pairing should keep as often as GAIN without it
MAIN = "m" * 40  # the sequential model judges every run on the current main: no re-measures


@dataclass
class Tally:
    """What one way of running the loop did, summed over trajectories."""

    trajectories: int = 0
    experiments: int = 0
    runs: int = 0
    moved_runs: int = 0
    keeps: int = 0
    false_keeps: int = 0
    early_keeps: int = 0
    early_false_keeps: int = 0
    gains: int = 0  # true GAIN-sigma changes after experiment 1
    gains_kept: int = 0
    kept_bias: float = 0.0  # sums, over keeps: judged delta - true effect
    remeasured: int = 0
    remeasured_bias: float = 0.0
    null_probes: int = 0
    null_probes_kept: int = 0
    gain_probes: int = 0
    gain_probes_kept: int = 0
    small_gains: int = 0  # true SMALL_GAIN-sigma changes after experiment 1...
    small_gains_kept: int = 0
    small_pairable: int = 0  # ...of them, those that keep main's parameters
    small_pairable_kept: int = 0
    paired_keeps: int = 0  # keeps the judge's paired rule made
    paired_false_keeps: int = 0
    paired_dof: int = 0  # sums over loops: the paired pool's degrees of freedom at the loop's end
    seconds: float = 0.0  # CPU seconds of the processes that ran it

    def add(self, other: Tally) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def count_keep(self, index: int, effect: float, delta: float | None) -> None:
        false = effect >= 0
        self.keeps += 1
        self.false_keeps += false
        if index < EARLY:
            self.early_keeps += 1
            self.early_false_keeps += false
        if delta is not None:
            self.kept_bias += delta - effect


# --- the real tick -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """One trajectory of the real tick: a whole loop, or a probe of experiment 1 forced to `probe`."""

    slots: int
    noise: str
    effects: str
    experiments: int
    seed: int
    index: int
    probe: float | None = None
    rho: float = 0.0  # paired seeds: the share of a run's noise its seed decides
    fingerprints: bool = False  # pairing on: the runner reports the parameters' fingerprint
    reshaping: float = 0.0  # share of changes that change the model's parameters
    decorrelated: float = 0.0  # share that keep them but share nothing with main under a seed
    settings: tuple[tuple[str, str], ...] = ()  # program.md's front matter beyond its defaults (`--set`)


def change_kinds(task: Task) -> tuple[frozenset[int], frozenset[int]]:
    """Which changes of the trajectory reshape the model and which keep its parameters but draw them
    otherwise: the same for pairing on and off."""
    draws = np.random.default_rng([task.seed, task.index, 3]).random(task.experiments)
    reshapes = frozenset(int(i) for i in np.flatnonzero(draws < task.reshaping))
    upper = task.reshaping + task.decorrelated
    decorrelated = frozenset(int(i) for i in np.flatnonzero((draws >= task.reshaping) & (draws < upper)))
    return reshapes, decorrelated


def loop_effects(effects: Effects, experiments: int, seed: int, index: int) -> list[float]:
    """The true effects of trajectory `index`: the same for every way of running it."""
    return effects.draw(np.random.default_rng([seed, index]), experiments).tolist()


def run_task(task: Task) -> Tally:
    started = time.process_time()
    effects = loop_effects(EFFECTS[task.effects], task.experiments, task.seed, task.index)
    tally = Tally()
    if task.probe is not None:
        effects[0] = task.probe
    reshapes, decorrelated = change_kinds(task)
    trajectory = schedule_sim.simulate(
        effects,
        slots=task.slots,
        noise=NOISE[task.noise],
        seed=(task.seed, task.index, 1 if task.probe is None else 2),
        until=None if task.probe is None else 1,
        rho=task.rho,
        fingerprints=task.fingerprints,
        reshapes=reshapes,
        decorrelated=decorrelated,
        settings=dict(task.settings),
    )
    if task.probe is not None:
        kept = trajectory.experiments[0].status == "keep"
        if task.probe == 0.0:
            tally.null_probes, tally.null_probes_kept = 1, kept
        else:
            tally.gain_probes, tally.gain_probes_kept = 1, kept
    else:
        tally.trajectories = 1
        tally.experiments = len(trajectory.experiments)
        tally.runs = len(trajectory.runs)
        tally.moved_runs = sum(run.moved for run in trajectory.runs)
        tally.paired_dof = trajectory.paired_dof
        for index, exp in enumerate(trajectory.experiments):
            if index > 0 and exp.effect == -GAIN:
                tally.gains += 1
                tally.gains_kept += exp.status == "keep"
            if index > 0 and exp.effect == -SMALL_GAIN:
                tally.small_gains += 1
                tally.small_gains_kept += exp.status == "keep"
                tally.small_pairable += exp.keeps_parameters
                tally.small_pairable_kept += exp.keeps_parameters and exp.status == "keep"
            if exp.status == "keep":
                tally.count_keep(index, exp.effect, exp.delta)
                tally.paired_keeps += exp.paired
                tally.paired_false_keeps += exp.paired and exp.effect >= 0
                if exp.remeasured_delta is not None:
                    tally.remeasured += 1
                    tally.remeasured_bias += exp.remeasured_delta - exp.effect
    tally.seconds = time.process_time() - started
    return tally


def real_tick(slots: int, noise: str, args: argparse.Namespace) -> Iterator[Task]:
    for index in range(args.trajectories):
        common = dict(
            slots=slots,
            noise=noise,
            effects=args.effects,
            experiments=args.experiments,
            seed=args.seed,
            settings=tuple(args.set),
        )
        yield Task(**common, index=index)
        yield Task(**common, index=index, probe=0.0)
        yield Task(**common, index=index, probe=-GAIN)


# --- one run after another -----------------------------------------------------------------------


# (candidate's runs, main's runs, the pooled noise, how much smaller the change makes train.py)
JudgeFn = Callable[[list[float], list[float], Noise | None, Simplification | None], Decision]


@dataclass(frozen=True)
class RealJudge:
    """The real judge (bot/loop/judge.py) with `config`."""

    config: JudgeConfig = JudgeConfig()

    def __call__(
        self, candidate: list[float], main: list[float], noise: Noise | None, simpler: Simplification | None
    ) -> Decision:
        return decide(
            candidate=candidate,
            crash=None,
            main=main,
            noise=noise,
            measured_on=MAIN,
            current_main=MAIN,
            config=self.config,
            simpler=simpler,
        )


def karpathy_rule(
    candidate: list[float], main: list[float], noise: Noise | None, simpler: Simplification | None
) -> Decision:
    """REFERENCE ONLY: karpathy/autoresearch's rule: keep if the single run is lower at all."""
    value, base = candidate[0], statistics.fmean(main)
    return Decision("keep" if value < base else "discard", "single run", value, value - base, 0.0)


@dataclass(frozen=True)
class Rule:
    name: str
    judge: JudgeFn
    first_baseline_runs: int
    baseline_runs: int


REFERENCE = Rule("the reference (single run, keep if lower)", karpathy_rule, 1, 1)


def sequential_rule(settings: Sequence[tuple[str, str]] = ()) -> Rule:
    """The real judge one run after another, with program.md's `settings` (`--set`) as the real tick
    reads them (bot.loop.program, judge.judge_config)."""
    loop = parse_program(program_md(1, **dict(settings))).settings
    return Rule(
        "one run after another",
        RealJudge(judge_config(loop)),
        main_runs_wanted(True, loop.first_baseline_runs, loop.baseline_runs),
        main_runs_wanted(False, loop.first_baseline_runs, loop.baseline_runs),
    )


SEQUENTIAL = sequential_rule()


@dataclass(frozen=True)
class SecondConfirmation:
    """A RULE NOT BUILT, for the frontier of power against runs (`--second-confirmation`): the real
    judge (`inner`), and where it discards a change on two runs that are lower than main by more than
    `window` standard errors, one more run of it (and `main_runs` of main beside it) and a verdict on
    three runs at the two-run threshold."""

    inner: RealJudge
    window: float
    main_runs: int

    def __call__(
        self, candidate: list[float], main: list[float], noise: Noise | None, simpler: Simplification | None
    ) -> Decision:
        decision = self.inner(candidate, main, noise, simpler)
        if (
            decision.action == "discard"
            and len(candidate) == 2
            and noise is not None
            and decision.delta is not None
            and decision.loss_margin is None  # not judged as a simplification
            and decision.delta < -self.window * standard_error(noise, 2, len(main))
        ):
            return replace(decision, action="confirm", reason="a second confirmation", extra_main_runs=self.main_runs)
        return decision


def second_confirmation(window: float, main_runs: int, settings: Sequence[tuple[str, str]] = ()) -> Rule:
    rule = sequential_rule(settings)
    assert isinstance(rule.judge, RealJudge)
    return replace(
        rule,
        name=f"{rule.name}, a second confirmation below -{window:g} standard errors with {main_runs} of main",
        judge=SecondConfirmation(rule.judge, window, main_runs),
    )


class Draws:
    """One run's deviation in sigma: the noise model's draw plus the measurement's drift, a random
    walk that takes one step per run of the loop; a probe's runs (`walk`: the loop's draws) read
    the loop's level and move it not."""

    def __init__(self, rng: np.random.Generator, noise: NoiseModel, walk: Draws | None = None) -> None:
        self.rng, self.noise, self.walk = rng, noise, walk
        self.level = 0.0

    def __call__(self) -> float:
        if self.walk is not None:
            return self.noise.draw(self.rng) + self.walk.level
        if self.noise.drift:
            self.level += self.noise.drift * float(self.rng.standard_normal())
        return self.noise.draw(self.rng) + self.level


class Loop:
    """One trajectory's state: main's runs, the finished groups of repeated runs."""

    def __init__(self, rule: Rule, draw: Draws) -> None:
        self.rule = rule
        self.true_main = 0.0
        self.main = [self.true_main + draw() for _ in range(rule.first_baseline_runs)]
        self.repeated: list[list[float]] = []  # finished groups with 2+ runs: old mains, confirmed candidates
        self.runs = len(self.main)

    def judge(self, true_effect: float, draw: Draws, commit: bool, simpler: Simplification | None = None) -> Decision:
        """Measure and judge one change (`simpler`: it makes train.py that much smaller); when
        `commit` is false (a probe) nothing it ran stays."""
        candidate = [self.true_main + true_effect + draw()]
        main = self.main
        while True:
            decision = self.rule.judge(candidate, main, pooled_noise([main, *self.repeated, candidate]), simpler)
            if decision.action != "confirm":
                break
            candidate.append(self.true_main + true_effect + draw())
            main = main + [self.true_main + draw() for _ in range(decision.extra_main_runs)]
        if commit:
            self.runs += len(candidate) + len(main) - len(self.main)
            self.main = main
            if len(candidate) > 1:
                self.repeated.append(candidate)
        return decision

    def new_main(self, true_value: float, draw: Draws) -> float:
        """After a keep: main is the kept code, measured afresh; returns the re-measured delta."""
        old = statistics.fmean(self.main)
        self.repeated.append(self.main)
        self.true_main = true_value
        self.main = [true_value + draw() for _ in range(self.rule.baseline_runs)]
        self.runs += len(self.main)
        return statistics.fmean(self.main) - old


def one_after_another(rule: Rule, noise: NoiseModel, args: argparse.Namespace) -> Tally:
    tally = Tally()
    started = time.process_time()
    for index in range(args.sequential):
        effects = loop_effects(EFFECTS[args.effects], args.experiments, args.seed, index)
        rng = np.random.default_rng([args.seed, index, 1])
        draw = Draws(rng, noise)
        probe = Draws(np.random.default_rng([args.seed, index, 2]), noise, walk=draw)
        loop = Loop(rule, draw)
        tally.null_probes += 1
        tally.null_probes_kept += loop.judge(0.0, probe, commit=False).action == "keep"
        tally.gain_probes += 1
        tally.gain_probes_kept += loop.judge(-GAIN, probe, commit=False).action == "keep"
        for position, effect in enumerate(effects):
            decision = loop.judge(effect, draw, commit=True)
            kept = decision.action == "keep"
            if position > 0 and effect == -GAIN:
                tally.gains += 1
                tally.gains_kept += kept
            if kept:
                tally.count_keep(position, effect, decision.delta)
                tally.remeasured += 1
                tally.remeasured_bias += loop.new_main(loop.true_main + effect, draw) - effect
        tally.trajectories += 1
        tally.experiments += len(effects)
        tally.runs += loop.runs
    tally.seconds = time.process_time() - started
    return tally


# --- the table -----------------------------------------------------------------------------------


def ratio(part: float, whole: float) -> float:
    return part / whole if whole else math.nan


def pct(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{100 * value:.1f}%"


def row(name: str, t: Tally) -> str:
    return (
        f"| {name} | {t.trajectories} "
        f"| {pct(ratio(t.early_false_keeps, t.early_keeps))} ({t.early_false_keeps}/{t.early_keeps}) / "
        f"{pct(ratio(t.false_keeps, t.keeps))} ({t.false_keeps}/{t.keeps}) "
        f"| {pct(ratio(t.null_probes_kept, t.null_probes))} "
        f"| {pct(ratio(t.gain_probes_kept, t.gain_probes))} / {pct(ratio(t.gains_kept, t.gains))} "
        f"| {ratio(t.runs, t.experiments):.3f} | {100 * ratio(t.moved_runs, t.experiments):.1f} "
        f"| {ratio(t.kept_bias, t.keeps):+.2f} / {ratio(t.remeasured_bias, t.remeasured):+.2f} |"
    )


HEAD = (
    "| how the loop runs | loops | false keeps, % of keeps: exp 1-10 / all | null kept at exp 1 "
    f"| P(keep) of a true {GAIN:g}-sigma gain: exp 1 / later | runs per experiment "
    "| runs on a main that had moved, per 100 exp | bias of kept / re-measured delta (sigma) |"
)


def targets(t: Tally) -> list[tuple[str, float, bool]]:
    """The judge's targets (issue 18), each with the measured value and whether it is met."""
    early, overall = ratio(t.early_false_keeps, t.early_keeps), ratio(t.false_keeps, t.keeps)
    null, first = ratio(t.null_probes_kept, t.null_probes), ratio(t.gain_probes_kept, t.gain_probes)
    later, runs = ratio(t.gains_kept, t.gains), ratio(t.runs, t.experiments)
    return [
        ("false keeps in experiments 1-10 <= 5% of keeps", early, early <= 0.05),
        ("false keeps overall <= 5% of keeps", overall, overall <= 0.05),
        ("a null change kept at experiment 1 <= 5%", null, null <= 0.05),
        (f"P(keep) of a true {GAIN:g}-sigma gain at experiment 1 >= 80%", first, first >= 0.80),
        (f"P(keep) of a true {GAIN:g}-sigma gain later >= 80%", later, later >= 0.80),
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


PAIRED_HEAD = (
    "| rho | pairing | loops | false keeps, % of keeps: exp 1-10 / all | null kept at exp 1 "
    f"| P(keep) of a true {SMALL_GAIN:g}-sigma gain, later: all / keeping main's parameters "
    f"| P(keep) of a true {GAIN:g}-sigma gain: exp 1 / later | runs per experiment | paired keeps (false) "
    "| paired pool's degrees of freedom at the loop's end |"
)


def paired_row(rho: float, pairing: bool, t: Tally) -> str:
    return (
        f"| {rho:g} | {'on' if pairing else 'off'} | {t.trajectories} "
        f"| {pct(ratio(t.early_false_keeps, t.early_keeps))} ({t.early_false_keeps}/{t.early_keeps}) / "
        f"{pct(ratio(t.false_keeps, t.keeps))} ({t.false_keeps}/{t.keeps}) "
        f"| {pct(ratio(t.null_probes_kept, t.null_probes))} "
        f"| {pct(ratio(t.small_gains_kept, t.small_gains))} / {pct(ratio(t.small_pairable_kept, t.small_pairable))} "
        f"| {pct(ratio(t.gain_probes_kept, t.gain_probes))} / {pct(ratio(t.gains_kept, t.gains))} "
        f"| {ratio(t.runs, t.experiments):.3f} | {t.paired_keeps} ({t.paired_false_keeps}) "
        f"| {ratio(t.paired_dof, t.trajectories):.1f} |"
    )


def paired_seeds(args: argparse.Namespace) -> dict[tuple[str, int, float, bool], Tally]:
    """(noise, slots, rho, pairing) -> what the real tick did, the same loops with pairing off and on."""
    tasks = [
        Task(
            slots=slots,
            noise=noise,
            effects=args.effects,
            experiments=args.experiments,
            seed=args.seed,
            index=index,
            probe=probe,
            rho=rho,
            fingerprints=pairing,
            reshaping=args.reshaping,
            decorrelated=args.decorrelated,
            settings=tuple(args.set),
        )
        for noise in args.noise
        for slots in args.slots
        for rho in args.rho
        for pairing in (False, True)
        for index in range(args.trajectories)
        for probe in (None, 0.0, -GAIN)
    ]
    found: dict[tuple[str, int, float, bool], Tally] = {}
    for task, outcome in zip(tasks, run_all(tasks, args.jobs), strict=True):
        found.setdefault((task.noise, task.slots, task.rho, task.fingerprints), Tally()).add(outcome)
    return found


def paired_report(found: dict[tuple[str, int, float, bool], Tally], args: argparse.Namespace) -> str:
    lines = []
    for noise in args.noise:
        for slots in args.slots:
            lines += ["", f"Noise: {NOISE[noise].description}; {slots} slot(s).", "", PAIRED_HEAD]
            lines.append("|" + "---|" * (PAIRED_HEAD.count("|") - 1))
            for rho in args.rho:
                for pairing in (False, True):
                    lines.append(paired_row(rho, pairing, found[(noise, slots, rho, pairing)]))
    return "\n".join(lines)


def run_all(tasks: list[Task], jobs: int) -> list[Tally]:
    """run_task over `tasks`, in `jobs` processes."""
    if jobs <= 1:
        return [run_task(task) for task in tasks]
    with ProcessPoolExecutor(jobs) as pool:
        return list(pool.map(run_task, tasks, chunksize=4))


@dataclass
class Results:
    real: dict[tuple[str, int], Tally] = field(default_factory=dict)  # (noise, slots) -> tally
    sequential: dict[tuple[str, str], Tally] = field(default_factory=dict)  # (noise, rule) -> tally


def measure(args: argparse.Namespace) -> Results:
    results = Results()
    tasks = [task for noise in args.noise for slots in args.slots for task in real_tick(slots, noise, args)]
    for task, outcome in zip(tasks, run_all(tasks, args.jobs), strict=True):
        results.real.setdefault((task.noise, task.slots), Tally()).add(outcome)
    rules = [sequential_rule(args.set), REFERENCE]
    if args.second_confirmation:
        window, main_runs = args.second_confirmation
        rules.append(second_confirmation(window, int(main_runs), args.set))
    for noise in args.noise:
        for rule in rules:
            results.sequential[(noise, rule.name)] = one_after_another(rule, NOISE[noise], args)
    return results


def report(results: Results, args: argparse.Namespace) -> str:
    lines = []
    for noise in args.noise:
        lines += ["", f"Noise: {NOISE[noise].description}.", "", HEAD, "|" + "---|" * (HEAD.count("|") - 1)]
        for slots in args.slots:
            lines.append(row(f"the real tick, {slots} slot{'s' if slots > 1 else ''}", results.real[(noise, slots)]))
        lines += [row(name, tally) for (which, name), tally in results.sequential.items() if which == noise]
    lines += ["", "Targets for the real tick (each noise, each number of slots):"]
    for (noise, slots), tally in results.real.items():
        missed = [
            f"{text}: {value:.3f}" if text.startswith("runs") else f"{text}: {pct(value)}"
            for text, value, met in targets(tally)
            if not met
        ]
        lines.append(f"- {noise}, {slots} slot(s): {'all met' if not missed else 'NOT met: ' + '; '.join(missed)}")
    return "\n".join(lines)


def setting(text: str) -> tuple[str, str]:
    """KEY=VALUE, a setting of program.md's front matter, checked as the loop reads it."""
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    try:
        parse_program(program_md(1, **{key: value}))
    except SettingsError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return key, value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trajectories", type=int, default=100, help="loops of the real tick per noise and slots")
    parser.add_argument("--sequential", type=int, default=4000, help="loops of the sequential model per noise and rule")
    parser.add_argument("--slots", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--noise", choices=sorted(NOISE), nargs="+", default=list(NOISE))
    parser.add_argument("--effects", choices=sorted(EFFECTS), default="mixed")
    parser.add_argument("--experiments", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes for the real tick")
    parser.add_argument("--paired-seeds", action="store_true", help="the paired-seeds table instead (see above)")
    parser.add_argument("--rho", type=float, nargs="+", default=[0.0, 0.5, 0.9], help="seed shares of the noise")
    parser.add_argument("--reshaping", type=float, default=0.5, help="share of changes of the model's parameters")
    parser.add_argument("--decorrelated", type=float, default=0.0, help="share keeping them, drawn otherwise")
    parser.add_argument(
        "--second-confirmation",
        type=float,
        nargs=2,
        metavar=("WINDOW", "MAIN_RUNS"),
        help="a row more for the sequential model: a rule not built (SecondConfirmation)",
    )
    parser.add_argument(
        "--set",
        type=setting,
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="program.md settings for the real tick and the sequential model (baseline_runs=3 confirm_below=1)",
    )
    args = parser.parse_args(argv)
    logging.getLogger("bot").setLevel(logging.ERROR)  # a failing phase stops the bench (schedule_sim)
    started = time.perf_counter()
    command = " ".join(
        shlex.quote(a)
        for a in [".venv/bin/python", "bench/decision_accuracy.py", *(sys.argv[1:] if argv is None else argv)]
    )
    if args.paired_seeds:
        found = paired_seeds(args)
        print(f"Command: `{command}`  ")
        print(
            f"Date: {time.strftime('%Y-%m-%d')}; machine: {machine()}; {time.perf_counter() - started:.0f} s wall, "
            f"{args.jobs} process(es); {args.reshaping:.0%} of changes reshape the model, "
            f"{args.decorrelated:.0%} keep its parameters but share nothing under a seed. True effects "
            f"({args.effects}): {EFFECTS[args.effects].description}."
        )
        print(paired_report(found, args))
        return
    results = measure(args)
    elapsed = time.perf_counter() - started
    real_cpu = sum(t.seconds for t in results.real.values())
    per_loop = {
        slots: ratio(
            sum(t.seconds for (_, s), t in results.real.items() if s == slots),
            sum(t.trajectories for (_, s), t in results.real.items() if s == slots),
        )
        for slots in args.slots
    }
    print(f"Command: `{command}`  ")
    print(f"Date: {time.strftime('%Y-%m-%d')}; machine: {machine()}; {elapsed:.0f} s wall, {args.jobs} process(es)  ")
    print(
        f"The real tick: {real_cpu:.0f} CPU s; per loop of {args.experiments} experiments with its two probes, "
        + ", ".join(f"{slots} slot(s) {seconds:.2f} s" for slots, seconds in per_loop.items())
        + f". True effects ({args.effects}): {EFFECTS[args.effects].description}."
    )
    print(report(results, args))


if __name__ == "__main__":
    main()
