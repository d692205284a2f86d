"""bench/decision_accuracy.py at a tiny size: the real tick (the conductor on simulated time) and
the sequential model count what they should, on fixed seeds. The figures themselves are the
bench's to measure (docs/benchmarks.md), not this test's."""

from __future__ import annotations

import benches

bench = benches.load("decision_accuracy")


def args(**overrides: object):
    defaults = dict(trajectories=2, sequential=50, slots=[1, 4], noise=["gauss", "outliers"], effects="mixed")
    defaults.update(experiments=12, seed=0, jobs=1)
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
