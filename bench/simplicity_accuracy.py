"""Benchmark: what the judge's simplicity rule keeps, what it costs in val_bpb and what it buys.

program.md tells the agent that an equal result from simpler code is a win. The judge's rule 5
(bot/loop/judge.py) keeps a change that makes train.py smaller when its runs rule out a loss larger
than `simplicity_sigmas` sigma at one-sided 95%; a single run losing less than
`simplicity_confirm_below` of that margin earns a confirmation run. This bench measures that rule
as bench/decision_accuracy.py measures the gain rule, on the same loops.

The world: every loop has `--experiments` (100) changes. A share of them (`--share`, 20%) are
simplifications: they delete code (bench/schedule_sim.py's spare code, which leaves train.py a line
and 2-3 code tokens smaller as bot.core.simplicity counts it) and their true effects, in sigma,
are: 50% none, 25% a loss uniform in (0, 2m], 15% a loss uniform in [2, 4], 10% a gain of 1 sigma,
where m is 1 sigma, the default margin (the world stays the same whatever rule judges it). The
other changes come from schedule_sim.EFFECTS (`--effects`, mixed), as in decision_accuracy.py.

Two ways of running the loops, on the same effects:

- ONE RUN AFTER ANOTHER: decision_accuracy.py's sequential model with the real `decide` and a
  JudgeConfig, for every simplicity_sigmas in `--sigmas` and simplicity_confirm_below in
  `--confirm-below`, and the rule off (simplicity_sigmas 0); `--sequential` loops each;
- THE REAL TICK: schedule_sim.py's conductor with `--slots` slots and the default lookahead, for
  every simplicity_sigmas in `--tick-sigmas` as program.md sets it (simplicity_confirm_below is the
  JudgeConfig default: program.md does not set it); `--trajectories` loops each.

Reported, per rule: P(keep) of the loop's simplifications by true effect; the share of
simplifications kept, and kept by the simplicity rule (not as a gain); the true effects of the kept
simplifications per 100 experiments, net and their losses alone (sigma: what the rule costs in
val_bpb); runs per simplification (its own runs and main's run beside each of its confirmations);
runs per experiment (every run, main's included); main's true change per 100 experiments (the sum of
every keep's true effect, sigma) and the false keeps among the other changes (% of their keeps).
The sequential model also probes the rule at fixed true effects (the P(keep) grid): at each
simplification of a loop, one more simplification judged beside the loop without changing it, its
effect the next of `GRID` in turn.

    .venv/bin/python bench/simplicity_accuracy.py [--sequential 1000] [--trajectories 10]
        [--sigmas 0.5 1 1.5 2] [--confirm-below 0.5 1] [--tick-sigmas 0 1 2] [--slots 1]
        [--noise gauss] [--share 0.2] [--effects mixed] [--experiments 100] [--seed 0] [--jobs N]
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import shlex
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

# this bench and schedule_sim beside it, and the bot package of the tree this file is in (not the one
# the virtual environment was installed from: a copy of the tree measures its own code)
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import schedule_sim  # noqa: E402
from decision_accuracy import Draws, Loop, RealJudge, Rule, loop_effects, machine, pct, ratio  # noqa: E402
from schedule_sim import EFFECTS, NOISE  # noqa: E402

from bot.core.simplicity import Simplification  # noqa: E402
from bot.loop.judge import JudgeConfig, main_runs_wanted  # noqa: E402

MARGIN = 1.0  # m, the world's margin in sigma: the default simplicity_sigmas
GAIN = 1.0  # the gain of a simplification that helps, in sigma
SMALLER = Simplification(lines=1, tokens=2)  # what schedule_sim's simplifications delete
BINS = ("no effect", "loss in (0, m]", "loss in (m, 2m]", "loss of 2-4 sigma", f"gain of {GAIN:g} sigma")
GRID = (-2.0, -1.0, -0.5, 0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0)  # probed true effects, sigma


def simplification_effects(rng: np.random.Generator, n: int) -> np.ndarray:
    """True effects of n simplifications, sigma: 50% none, 25% a loss U(0, 2m], 15% a loss U[2, 4],
    10% a gain of GAIN."""
    kind, u = rng.random(n), rng.random(n)
    return np.select([kind < 0.5, kind < 0.75, kind < 0.9], [0.0, 2 * MARGIN * (1.0 - u), 2.0 + 2.0 * u], default=-GAIN)


def world(effects: str, experiments: int, seed: int, index: int, share: float) -> tuple[list[float], frozenset[int]]:
    """Loop `index`'s true effects and which of its changes (0-based) are simplifications: the
    changes of decision_accuracy.py's loop `index`, with a share replaced by simplifications."""
    changes = loop_effects(EFFECTS[effects], experiments, seed, index)
    rng = np.random.default_rng([seed, index, 3])
    positions = np.flatnonzero(rng.random(experiments) < share)
    for position, effect in zip(positions, simplification_effects(rng, len(positions)), strict=True):
        changes[position] = float(effect)
    return changes, frozenset(int(p) for p in positions)


def bin_of(effect: float) -> int:
    """Which of BINS a simplification's true effect falls in."""
    if effect < 0:
        return 4
    if effect == 0:
        return 0
    return 1 if effect <= MARGIN else 2 if effect <= 2 * MARGIN else 3


@dataclass
class Tally:
    """What one rule did to the loops' simplifications, summed over loops."""

    trajectories: int = 0
    experiments: int = 0
    runs: int = 0  # every run, main's included
    simple_runs: int = 0  # simplifications' own runs and main's runs beside their confirmations
    proposed: list[int] = field(default_factory=lambda: [0] * len(BINS))  # simplifications, by bin
    kept: list[int] = field(default_factory=lambda: [0] * len(BINS))
    kept_for_simplicity: int = 0
    kept_effect: float = 0.0  # sum of kept simplifications' true effects, sigma
    kept_loss: float = 0.0  # ...of those that lose
    main_change: float = 0.0  # sum of every keep's true effect, sigma
    other_keeps: int = 0
    other_false_keeps: int = 0
    probes: list[int] = field(default_factory=lambda: [0] * len(GRID))  # simplifications probed at GRID[i]
    probes_kept: list[int] = field(default_factory=lambda: [0] * len(GRID))
    seconds: float = 0.0  # CPU seconds of the processes that ran it

    def add(self, other: Tally) -> None:
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            setattr(
                self,
                f.name,
                [a + b for a, b in zip(mine, theirs, strict=True)] if isinstance(mine, list) else mine + theirs,
            )

    def count(self, effect: float, simpler: bool, kept: bool, for_simplicity: bool, runs: int) -> None:
        """One change's verdict; `runs`: a simplification's own runs and main's beside them."""
        if kept:
            self.main_change += effect
        if not simpler:
            self.other_keeps += kept
            self.other_false_keeps += kept and effect >= 0
            return
        where = bin_of(effect)
        self.proposed[where] += 1
        self.simple_runs += runs
        if kept:
            self.kept[where] += 1
            self.kept_for_simplicity += for_simplicity
            self.kept_effect += effect
            self.kept_loss += max(effect, 0.0)


# --- one run after another -----------------------------------------------------------------------


@dataclass(frozen=True)
class SequentialTask:
    """The sequential model's loops [start, stop) under one JudgeConfig."""

    config: JudgeConfig
    noise: str
    effects: str
    experiments: int
    share: float
    seed: int
    start: int
    stop: int


def run_sequential(task: SequentialTask) -> Tally:
    started = time.process_time()
    rule = Rule("sequential", RealJudge(task.config), main_runs_wanted(True), main_runs_wanted(False))
    noise = NOISE[task.noise]
    tally = Tally()
    for index in range(task.start, task.stop):
        effects, simple = world(task.effects, task.experiments, task.seed, index, task.share)
        draw = Draws(np.random.default_rng([task.seed, index, 1]), noise)
        probe = Draws(np.random.default_rng([task.seed, index, 2]), noise, walk=draw)
        loop = Loop(rule, draw)
        probed = index  # the grid's next effect, in turn from a place of its own for each loop
        for position, effect in enumerate(effects):
            simpler = SMALLER if position in simple else None
            if simpler is not None:
                where = probed % len(GRID)
                probed += 1
                tally.probes[where] += 1
                tally.probes_kept[where] += (
                    loop.judge(GRID[where], probe, commit=False, simpler=SMALLER).action == "keep"
                )
            before = loop.runs
            decision = loop.judge(effect, draw, commit=True, simpler=simpler)
            kept = decision.action == "keep"
            tally.count(
                effect, simpler is not None, kept, kept and decision.loss_margin is not None, loop.runs - before
            )
            if kept:
                loop.new_main(loop.true_main + effect, draw)
        tally.trajectories += 1
        tally.experiments += len(effects)
        tally.runs += loop.runs
    tally.seconds = time.process_time() - started
    return tally


# --- the real tick -------------------------------------------------------------------------------


@dataclass(frozen=True)
class TickTask:
    """One loop of the real tick with program.md's simplicity_sigmas at `sigmas`."""

    sigmas: float
    slots: int
    noise: str
    effects: str
    experiments: int
    share: float
    seed: int
    index: int


def run_tick(task: TickTask) -> Tally:
    started = time.process_time()
    effects, simple = world(task.effects, task.experiments, task.seed, task.index, task.share)
    trajectory = schedule_sim.simulate(
        effects,
        slots=task.slots,
        noise=NOISE[task.noise],
        seed=(task.seed, task.index, 1),
        simplifications=simple,
        settings={"simplicity_sigmas": task.sigmas},
    )
    tally = count_trajectory(trajectory)
    tally.seconds = time.process_time() - started
    return tally


def count_trajectory(trajectory: schedule_sim.Trajectory) -> Tally:
    """A real tick's loop counted: a simplification's runs are its own (first, confirmation,
    re-measure) and main's beside each of its confirmations (JudgeConfig.confirm_main_runs each)."""
    tally = Tally(trajectories=1, experiments=len(trajectory.experiments), runs=len(trajectory.runs))
    beside = JudgeConfig().confirm_main_runs
    for exp in trajectory.experiments:
        own = [run for run in trajectory.runs if run.experiment == exp.id]
        runs = len(own) + beside * sum(run.purpose == "confirm" for run in own)
        tally.count(exp.effect, exp.simpler, exp.status == "keep", exp.kept_for_simplicity, runs)
    return tally


# --- the tables ----------------------------------------------------------------------------------


def config_name(config: JudgeConfig) -> str:
    if config.simplicity_sigmas == 0:
        return "off (simplicity_sigmas 0)"
    return f"simplicity_sigmas {config.simplicity_sigmas:g}, confirm below {config.simplicity_confirm_below:g}"


def per_100(value: float, t: Tally) -> str:
    return f"{100 * ratio(value, t.experiments):+.2f}"


def loop_row(name: str, t: Tally) -> str:
    simplifications = sum(t.proposed)
    by_bin = " / ".join(pct(ratio(k, n)) for k, n in zip(t.kept, t.proposed, strict=True))
    return (
        f"| {name} | {t.trajectories} | {by_bin} "
        f"| {pct(ratio(sum(t.kept), simplifications))} ({sum(t.kept)}/{simplifications}) / "
        f"{pct(ratio(t.kept_for_simplicity, simplifications))} "
        f"| {per_100(t.kept_effect, t)} / {per_100(t.kept_loss, t)} "
        f"| {ratio(t.simple_runs, simplifications):.2f} | {ratio(t.runs, t.experiments):.3f} "
        f"| {per_100(t.main_change, t)} | {pct(ratio(t.other_false_keeps, t.other_keeps))} |"
    )


LOOP_HEAD = (
    "| rule | loops | P(keep) of a simplification: " + " / ".join(BINS) + " "
    "| simplifications kept / kept for simplicity | true effect of kept simplifications per 100 exp: "
    "net / losses (sigma) | runs per simplification | runs per experiment "
    "| main's true change per 100 exp (sigma) | false keeps among other changes |"
)


def grid_row(name: str, t: Tally) -> str:
    return f"| {name} | " + " | ".join(pct(ratio(k, n)) for k, n in zip(t.probes_kept, t.probes, strict=True)) + " |"


GRID_HEAD = "| rule | " + " | ".join(f"{'gain' if x < 0 else 'loss'} {abs(x):g}" for x in GRID) + " |"


def table(head: str, rows: Iterable[str]) -> list[str]:
    return [head, "|" + "---|" * (head.count("|") - 1), *rows]


@dataclass
class Results:
    sequential: dict[JudgeConfig, Tally] = field(default_factory=dict)
    tick: dict[tuple[float, int], Tally] = field(default_factory=dict)  # (simplicity_sigmas, slots) -> tally


def sweep(args: argparse.Namespace) -> list[JudgeConfig]:
    """The rule off, then every (simplicity_sigmas, simplicity_confirm_below) of the sweep."""
    return [JudgeConfig(simplicity_sigmas=0.0)] + [
        JudgeConfig(simplicity_sigmas=s, simplicity_confirm_below=c) for s in args.sigmas for c in args.confirm_below
    ]


def measure(args: argparse.Namespace) -> Results:
    world_args = dict(
        noise=args.noise, effects=args.effects, experiments=args.experiments, share=args.share, seed=args.seed
    )
    chunk = max(1, math.ceil(args.sequential / max(1, args.jobs)))
    sequential = [
        SequentialTask(config, **world_args, start=start, stop=min(start + chunk, args.sequential))
        for config in sweep(args)
        for start in range(0, args.sequential, chunk)
    ]
    tick = [
        TickTask(sigmas, slots, **world_args, index=index)
        for sigmas in args.tick_sigmas
        for slots in args.slots
        for index in range(args.trajectories)
    ]
    results = Results()
    pool = ProcessPoolExecutor(args.jobs) if args.jobs > 1 else None
    mapper = pool.map if pool is not None else map
    try:
        for task, outcome in zip(tick, mapper(run_tick, tick), strict=True):
            results.tick.setdefault((task.sigmas, task.slots), Tally()).add(outcome)
        for task, outcome in zip(sequential, mapper(run_sequential, sequential), strict=True):
            results.sequential.setdefault(task.config, Tally()).add(outcome)
    finally:
        if pool is not None:
            pool.shutdown()
    return results


def report(results: Results, args: argparse.Namespace) -> str:
    tick_rows = [
        loop_row(
            f"the real tick, {slots} slot{'s' if slots > 1 else ''}, " + config_name(JudgeConfig(simplicity_sigmas=s)),
            t,
        )
        for (s, slots), t in results.tick.items()
    ]
    sequential_rows = [loop_row(f"one run after another, {config_name(c)}", t) for c, t in results.sequential.items()]
    return "\n".join(
        [
            "",
            f"Simplifications in the loops (noise: {NOISE[args.noise].description}; m = {MARGIN:g} sigma):",
            "",
            *table(LOOP_HEAD, tick_rows + sequential_rows),
            "",
            "P(keep) of a simplification by its true effect (sigma), one run after another (probes beside the loops):",
            "",
            *table(GRID_HEAD, (grid_row(config_name(c), t) for c, t in results.sequential.items())),
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequential", type=int, default=1000, help="loops of the sequential model per rule")
    parser.add_argument("--trajectories", type=int, default=10, help="loops of the real tick per setting and slots")
    parser.add_argument("--sigmas", type=float, nargs="+", default=[0.5, 1.0, 1.5, 2.0])
    parser.add_argument("--confirm-below", type=float, nargs="+", default=[0.5, 1.0])
    parser.add_argument("--tick-sigmas", type=float, nargs="*", default=[0.0, 1.0, 2.0])
    parser.add_argument("--slots", type=int, nargs="+", default=[1])
    parser.add_argument("--noise", choices=sorted(NOISE), default="gauss")
    parser.add_argument("--share", type=float, default=0.2, help="share of the changes that are simplifications")
    parser.add_argument("--effects", choices=sorted(EFFECTS), default="mixed")
    parser.add_argument("--experiments", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes")
    args = parser.parse_args(argv)
    if args.experiments > schedule_sim.SPOTS:
        parser.error(f"--experiments: at most {schedule_sim.SPOTS} (a place of its own for each simplification)")
    logging.getLogger("bot").setLevel(logging.ERROR)  # a failing phase stops the bench (schedule_sim)
    started = time.perf_counter()
    results = measure(args)
    elapsed = time.perf_counter() - started
    command = " ".join(
        shlex.quote(a)
        for a in [".venv/bin/python", "bench/simplicity_accuracy.py", *(sys.argv[1:] if argv is None else argv)]
    )
    tick_cpu = sum(t.seconds for t in results.tick.values())
    sequential_cpu = sum(t.seconds for t in results.sequential.values())
    print(f"Command: `{command}`  ")
    print(f"Date: {time.strftime('%Y-%m-%d')}; machine: {machine()}; {elapsed:.0f} s wall, {args.jobs} process(es)  ")
    print(
        f"CPU: the real tick {tick_cpu:.0f} s, one run after another {sequential_cpu:.0f} s. Other changes "
        f"({args.effects}): {EFFECTS[args.effects].description}. Simplifications: {100 * args.share:g}% of "
        f"changes; 50% no effect, 25% a loss U(0, 2m], 15% a loss U[2, 4] sigma, 10% a gain of {GAIN:g} sigma."
    )
    print(report(results, args))


if __name__ == "__main__":
    main()
