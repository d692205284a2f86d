"""bench/decision_accuracy.py at a tiny size: the real tick (the conductor on simulated time) and
the sequential model count what they should, on fixed seeds. The figures themselves are the
bench's to measure (docs/benchmarks.md), not this test's."""

from __future__ import annotations

import benches
import pytest

bench = benches.load("decision_accuracy")


def args(**overrides: object):
    defaults = dict(trajectories=2, sequential=50, slots=[1, 4], noise=["gauss", "outliers"], effects="mixed")
    defaults.update(experiments=12, seed=0, jobs=1, set=[], second_confirmation=None)
    defaults.update(overrides)
    return bench.argparse.Namespace(**defaults)


def test_every_way_of_running_the_loop_is_counted_for_every_noise() -> None:
    results = bench.measure(args())

    assert set(results.real) == {(n, s) for n in ("gauss", "outliers") for s in (1, 4)}
    for tally in results.real.values():
        assert tally.trajectories == 2 and tally.experiments == 24
        assert tally.null_probes == tally.gain_probes == 2
        assert tally.runs >= tally.experiments + 6 * 2  # a run per experiment, the first main's six
        assert tally.false_keeps <= tally.keeps and tally.early_keeps <= tally.keeps
    for tally in results.sequential.values():
        assert tally.trajectories == 50 and tally.moved_runs == 0  # nothing overlaps, one after another
    gauss = {rule: t for (noise, rule), t in results.sequential.items() if noise == "gauss"}
    judge, reference = gauss[bench.SEQUENTIAL.name], gauss[bench.REFERENCE.name]
    assert reference.false_keeps > judge.false_keeps
    assert reference.null_probes_kept > judge.null_probes_kept


def test_the_report_has_a_table_per_noise_and_the_targets() -> None:
    options = args(trajectories=1, sequential=5, slots=[2], noise=["t3"])

    text = bench.report(bench.measure(options), options)

    assert "Student-t(3)" in text
    assert "| the real tick, 2 slots | 1 |" in text
    assert "| one run after another | 5 |" in text
    assert "- t3, 2 slot(s):" in text


def test_paired_seeds_run_the_same_loops_with_pairing_off_and_on() -> None:
    """Off, the runner reports no fingerprint and nothing is judged paired; on, at a seed share of 0.9,
    the changes that keep main's parameters give the judge pairs. Each (rho, pairing) counts its loops."""
    options = args(trajectories=2, slots=[1], noise=["gauss"], experiments=40, rho=[0.0, 0.9])
    options.reshaping, options.decorrelated = 0.5, 0.0

    found = bench.paired_seeds(options)

    assert set(found) == {("gauss", 1, rho, pairing) for rho in (0.0, 0.9) for pairing in (False, True)}
    for tally in found.values():
        assert tally.trajectories == 2 and tally.experiments == 80 and tally.null_probes == 2
        assert tally.small_pairable <= tally.small_gains and tally.paired_false_keeps <= tally.paired_keeps
    assert found[("gauss", 1, 0.9, False)].paired_keeps == found[("gauss", 1, 0.0, False)].paired_keeps == 0
    assert "| 0.9 | on | 2 |" in bench.paired_report(found, options)


def test_change_kinds_split_the_changes_by_their_shares_the_same_way_for_both_pairings() -> None:
    task = bench.Task(slots=1, noise="gauss", effects="mixed", experiments=1000, seed=0, index=3, reshaping=0.5)
    reshapes, decorrelated = bench.change_kinds(task)
    assert 400 < len(reshapes) < 600 and not decorrelated
    other = bench.Task(**{**task.__dict__, "fingerprints": True, "decorrelated": 0.2})
    again, drawn_otherwise = bench.change_kinds(other)
    assert again == reshapes and 150 < len(drawn_otherwise) < 250 and not again & drawn_otherwise


def test_program_md_settings_reach_the_real_tick_and_the_sequential_model() -> None:
    rule = bench.sequential_rule([("first_baseline_runs", "3"), ("confirm_below", "1.0")])
    assert (rule.first_baseline_runs, rule.baseline_runs, rule.judge.config.confirm_below) == (3, 2, 1.0)
    task = bench.Task(slots=1, noise="gauss", effects="mixed", experiments=1, seed=0, index=0)
    three = bench.Task(**{**task.__dict__, "settings": (("first_baseline_runs", "3"),)})
    assert (bench.run_task(task).runs, bench.run_task(three).runs) == (6 + 1, 3 + 1)  # main's first runs, one change


def test_a_setting_the_loop_would_refuse_is_refused_before_anything_runs() -> None:
    with pytest.raises(SystemExit):
        bench.main(["--set", "baseline_runs=0"])
    with pytest.raises(SystemExit):
        bench.main(["--set", "baseline_runs"])


def test_a_second_confirmation_gives_a_discarded_pair_of_runs_inside_its_window_a_third_run() -> None:
    rule = bench.second_confirmation(1.25, 0)
    noise, main = bench.Noise(sigma=1.0, dof=30), [0.0, 0.0]
    error = bench.standard_error(noise, 2, 2)  # 1.0
    inside = rule.judge([-1.5 * error, -1.5 * error], main, noise, None)
    assert (inside.action, inside.extra_main_runs) == ("confirm", 0)
    assert rule.judge([-error, -error], main, noise, None).action == "discard"  # outside the window
    assert rule.judge([-1.5 * error], main, noise, None) == bench.sequential_rule().judge(
        [-1.5 * error], main, noise, None
    )
    assert rule.judge([-9.0, -9.0], main, noise, None).action == "keep"


def test_the_second_confirmation_is_a_row_of_its_own_in_the_sequential_model() -> None:
    options = args(trajectories=1, sequential=20, slots=[1], noise=["gauss"], second_confirmation=[1.25, 1])
    text = bench.report(bench.measure(options), options)
    assert "| one run after another, a second confirmation below -1.25 standard errors with 1 of main | 20 |" in text
