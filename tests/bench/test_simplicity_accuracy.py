"""bench/simplicity_accuracy.py at a tiny size: its world of simplifications is the one it states,
its tallies count a hand-made loop right, and both ways of running the loops fill the tables. The
figures themselves are the bench's to measure (docs/benchmarks.md), not this test's."""

from __future__ import annotations

import benches
import numpy as np
import pytest

bench = benches.load("simplicity_accuracy")
sim = bench.schedule_sim


def test_simplification_effects_come_in_the_stated_classes_and_shares() -> None:
    effects = bench.simplification_effects(np.random.default_rng(0), 20_000)

    classes = [bench.bin_of(float(x)) for x in effects]
    shares = [classes.count(k) / len(classes) for k in range(len(bench.BINS))]
    assert shares[0] == pytest.approx(0.5, abs=0.02)
    assert shares[1] + shares[2] == pytest.approx(0.25, abs=0.02)  # U(0, 2m], m = 1 sigma
    assert shares[3] == pytest.approx(0.15, abs=0.02)
    assert shares[4] == pytest.approx(0.10, abs=0.02)
    assert set(effects[effects < 0]) == {-bench.GAIN}
    assert effects.max() <= 4.0


def test_a_loops_simplifications_replace_some_of_its_changes_and_the_rest_stay() -> None:
    plain = bench.loop_effects(sim.EFFECTS["mixed"], 100, 0, 5)

    effects, simple = bench.world("mixed", 100, 0, 5, share=0.2)

    assert 5 <= len(simple) <= 40
    assert [e for n, e in enumerate(effects) if n not in simple] == [e for n, e in enumerate(plain) if n not in simple]
    assert bench.world("mixed", 100, 0, 5, share=0.2) == (effects, simple)  # the same for every rule


@pytest.mark.parametrize(("effect", "where"), [(0.0, 0), (0.3, 1), (1.0, 1), (1.7, 2), (2.0, 2), (3.5, 3), (-1.0, 4)])
def test_each_true_effect_falls_in_its_class(effect: float, where: int) -> None:
    assert bench.bin_of(effect) == where


def test_the_tallies_count_a_hand_made_loop() -> None:
    def run(id: int, purpose: str, experiment: int | None) -> sim.SimRun:
        return sim.SimRun(id, purpose, experiment, 0.0, 1.0, moved=False)

    experiments = [
        sim.SimExperiment(1, -3.0, "keep", -3.2, -3.1),  # an ordinary gain, kept
        sim.SimExperiment(2, 0.0, "keep", 0.1, 0.0, simpler=True, kept_for_simplicity=True),
        sim.SimExperiment(3, 0.5, "keep", -0.2, 0.4, simpler=True, kept_for_simplicity=True),
        sim.SimExperiment(4, 3.0, "discard", 2.5, None, simpler=True),
        sim.SimExperiment(5, 1.0, "keep", -2.5, 0.9),  # an ordinary loss, kept: a false keep
        sim.SimExperiment(6, -1.0, "keep", -2.9, -1.2, simpler=True),  # a simpler gain kept as a gain
    ]
    runs = [run(n, "baseline", None) for n in range(1, 7)] + [
        run(7, "candidate", 1),
        run(8, "candidate", 2),
        run(9, "confirm", 2),
        run(10, "candidate", 3),
        run(11, "remeasure", 3),
        run(12, "confirm", 3),
        run(13, "candidate", 4),
        run(14, "candidate", 5),
        run(15, "candidate", 6),
    ]

    tally = bench.count_trajectory(sim.Trajectory(experiments, runs))

    assert (tally.trajectories, tally.experiments, tally.runs) == (1, 6, 15)
    assert tally.proposed == [1, 1, 0, 1, 1] and tally.kept == [1, 1, 0, 0, 1]
    assert tally.kept_for_simplicity == 2
    assert tally.kept_effect == pytest.approx(-0.5) and tally.kept_loss == pytest.approx(0.5)
    assert tally.main_change == pytest.approx(-2.5)  # -3 + 0 + 0.5 + 1 - 1
    assert (tally.other_keeps, tally.other_false_keeps) == (2, 1)
    assert tally.simple_runs == (2 + 1) + (3 + 1) + 1 + 1  # a confirmation brings main's run beside it


def args(**overrides: object):
    defaults = dict(sequential=6, trajectories=1, sigmas=[1.0], confirm_below=[0.5, 1.0], tick_sigmas=[0.0, 1.0])
    defaults.update(slots=[1], noise="gauss", share=0.3, effects="mixed", experiments=12, seed=0, jobs=1)
    defaults.update(overrides)
    return bench.argparse.Namespace(**defaults)


def test_every_rule_is_measured_both_ways_and_reported() -> None:
    options = args()

    results = bench.measure(options)

    off, default = bench.JudgeConfig(simplicity_sigmas=0.0), bench.JudgeConfig()
    assert list(results.sequential) == [off, default, bench.JudgeConfig(simplicity_confirm_below=1.0)]
    assert set(results.tick) == {(0.0, 1), (1.0, 1)}
    for tally in [*results.sequential.values(), *results.tick.values()]:
        assert tally.experiments == tally.trajectories * 12
        assert sum(tally.kept) <= sum(tally.proposed) > 0
        assert tally.simple_runs >= sum(tally.proposed)
    assert results.sequential[off].kept_for_simplicity == results.tick[(0.0, 1)].kept_for_simplicity == 0
    for tally in results.sequential.values():
        assert sum(tally.probes) == sum(tally.proposed)  # a probe beside each simplification
    text = bench.report(results, options)
    assert "| the real tick, 1 slot, simplicity_sigmas 1, confirm below 0.5 | 1 |" in text
    assert "| one run after another, off (simplicity_sigmas 0) | 6 |" in text
    assert "| simplicity_sigmas 1, confirm below 1 |" in text  # the P(keep) grid
