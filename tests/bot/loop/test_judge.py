"""The judge: pooled noise, Student-t margins, the confirm window, and every branch of decide()."""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
from benches import load as load_bench_script
from scipy import special

from bot.core.simplicity import Simplification
from bot.loop.judge import (
    BASELINE_RUNS,
    FIRST_BASELINE_RUNS,
    Decision,
    JudgeConfig,
    Noise,
    decide,
    judge_config,
    main_runs_wanted,
    margin,
    pooled_noise,
    standard_error,
    t_multiplier,
)
from bot.loop.program import LoopSettings
from runner.tasks import TICKET_ROUTING

MAIN = "a" * 40
OLD_MAIN = "b" * 40

# Main measured six times at 1.0; the noise is sigma 0.01 from 30 degrees of freedom unless a test
# says otherwise. One candidate run against six of main has a standard error of
# 0.01 * sqrt(1 + 1/6) = 0.0108.
SIGMA = 0.01
NOISE = Noise(sigma=SIGMA, dof=30)
MAIN_RUNS = [1.0] * 6
SE_1 = SIGMA * math.sqrt(1 + 1 / 6)
ONE_RUN_Z = JudgeConfig().noise_sigmas  # 2.5
TWO_RUN_Z = JudgeConfig().confirm_sigmas  # 2.1


def judge(
    candidate: list[float],
    *,
    main: list[float] | None = None,
    crash: str | None = None,
    noise: Noise | None = NOISE,
    measured_on: str = MAIN,
    current_main: str = MAIN,
    config: JudgeConfig | None = None,
) -> Decision:
    return decide(
        candidate=candidate,
        crash=crash,
        main=MAIN_RUNS if main is None else main,
        noise=noise,
        measured_on=measured_on,
        current_main=current_main,
        config=config or JudgeConfig(),
    )


def normal_tail(z: float) -> float:
    """P(Z > z) for a standard normal Z."""
    return 0.5 * math.erfc(z / math.sqrt(2))


def t_tail(k: float, dof: int) -> float:
    """P(T > k) for Student's t with `dof` degrees of freedom, from its distribution function (the
    judge inverts another of scipy's functions; scipy.stats would cost seconds of import)."""
    return float(special.stdtr(dof, -k))


def t_quantile(tail: float, dof: int) -> float:
    """The k with t_tail(k, dof) == tail, by bisection: independent of the judge's inverse."""
    low, high = 0.0, 1e6
    while low < (middle := (low + high) / 2) < high:
        low, high = (middle, high) if t_tail(middle, dof) > tail else (low, middle)
    return middle


def keep_margin(z: float, dof: int, n_candidate: int, n_main: int, sigma: float = SIGMA) -> float:
    """The margin computed independently of the judge, for comparison with the judge's."""
    return t_quantile(normal_tail(z), dof) * sigma * math.sqrt(1 / n_candidate + 1 / n_main)


# --- pooled_noise --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("groups", "sigma", "dof"),
    [
        # mean 2, squares 1 + 1 = 2, one degree of freedom
        ([[1.0, 3.0]], math.sqrt(2.0), 1),
        # squares 2 (first group) + 4 + 0 + 4 (second group, mean 4) = 10 over 1 + 2 degrees of freedom
        ([[1.0, 3.0], [2.0, 4.0, 6.0]], math.sqrt(10.0 / 3.0), 3),
        # repeats that agree exactly: zero noise, not "unknown"
        ([[1.5, 1.5, 1.5]], 0.0, 2),
        # squares 0.5 + 0.5 over 1 + 1
        ([[0.5, 1.5], [2.0, 3.0]], math.sqrt(1.0 / 2.0), 2),
    ],
    ids=["one-pair", "two-groups", "identical", "equal-groups"],
)
def test_pooled_noise_known_values_and_degrees_of_freedom(groups, sigma, dof):
    noise = pooled_noise(groups)
    assert noise is not None
    assert noise.sigma == pytest.approx(sigma, rel=1e-12)
    assert noise.dof == dof


def test_pooled_noise_ignores_groups_of_one():
    # The singletons carry no information about the spread, however far off they are.
    assert pooled_noise([[1.0, 3.0], [100.0], [-50.0]]) == Noise(sigma=pytest.approx(math.sqrt(2.0)), dof=1)


def test_pooled_noise_does_not_count_differences_between_groups():
    # Two codes a whole unit apart, each repeated without spread: no noise at all.
    assert pooled_noise([[1.0, 1.0], [2.0, 2.0]]) == Noise(sigma=0.0, dof=2)


def test_pooled_noise_accepts_tuples_and_generators():
    assert pooled_noise(g for g in [(1.0, 3.0)]) == Noise(sigma=pytest.approx(math.sqrt(2.0)), dof=1)


@pytest.mark.parametrize(
    "groups",
    [[], [[]], [[1.0]], [[1.0], [2.0], [3.0]]],
    ids=["no-groups", "empty-group", "one-singleton", "only-singletons"],
)
def test_pooled_noise_is_none_without_repeats(groups):
    assert pooled_noise(groups) is None


# --- Student-t quantiles and margins -------------------------------------------------------------


@pytest.mark.parametrize("z", [2.0, 2.25])
@pytest.mark.parametrize("dof", [1, 2, 5, 7, 30, 100])
def test_t_multiplier_has_the_same_one_sided_tail_as_z(z, dof):
    k = t_multiplier(z, dof)
    assert t_tail(k, dof) == pytest.approx(normal_tail(z), rel=1e-9)


def test_t_multiplier_shrinks_towards_z_as_degrees_of_freedom_grow():
    ks = [t_multiplier(2.25, dof) for dof in (1, 2, 5, 10, 100, 10_000)]
    assert ks == sorted(ks, reverse=True)
    assert ks[0] > 25  # one degree of freedom: sigma itself is barely known
    assert ks[-1] == pytest.approx(2.25, abs=1e-3)


def test_t_multiplier_refuses_zero_degrees_of_freedom():
    with pytest.raises(ValueError, match="at least 1 degree of freedom"):
        t_multiplier(2.0, 0)


def test_margin_uses_noise_sigmas_for_one_run_and_confirm_sigmas_for_two():
    config = JudgeConfig()
    assert margin(NOISE, 1, 6, config) == pytest.approx(keep_margin(ONE_RUN_Z, 30, 1, 6), rel=1e-9)
    assert margin(NOISE, 2, 7, config) == pytest.approx(keep_margin(TWO_RUN_Z, 30, 2, 7), rel=1e-9)
    assert margin(NOISE, 3, 7, config) == pytest.approx(keep_margin(TWO_RUN_Z, 30, 3, 7), rel=1e-9)


@pytest.mark.parametrize(
    ("min_margin", "expected"),
    [(0.001, keep_margin(ONE_RUN_Z, 30, 1, 6)), (0.05, 0.05)],
    ids=["formula-above-floor", "floor-wins"],
)
def test_margin_has_an_absolute_floor(min_margin, expected):
    assert margin(NOISE, 1, 6, JudgeConfig(min_margin=min_margin)) == pytest.approx(expected, rel=1e-9)


def test_standard_error_of_the_difference_of_means():
    assert standard_error(NOISE, 1, 6) == pytest.approx(SE_1)
    assert standard_error(Noise(0.02, 4), 2, 2) == pytest.approx(0.02)


def test_one_degree_of_freedom_needs_a_much_larger_gain_than_many():
    # Same sigma, same runs: a gain of 5 standard errors is kept with 30 degrees of freedom
    # behind sigma, but not with 1, where sigma from one pair of runs comes out under a third of
    # the truth one time in four.
    gain = 5 * SIGMA * math.sqrt(1 + 1 / 2)
    candidate, main = [1.0 - gain], [1.0, 1.0]
    assert judge(candidate, main=main, noise=Noise(SIGMA, 30)).action == "keep"
    few = judge(candidate, main=main, noise=Noise(SIGMA, 1))
    assert few.action != "keep"
    assert few.margin is not None and few.margin > 5 * gain


# --- how often main is measured ------------------------------------------------------------------


def test_defaults_are_the_benchmarked_rule():
    # bench/decision_accuracy.py and docs/benchmarks.md report these; change them together.
    assert JudgeConfig() == JudgeConfig(
        noise_sigmas=2.5, confirm_sigmas=2.1, confirm_below=1.25, min_margin=0.0, confirm=True, confirm_main_runs=1
    )


def test_first_main_is_measured_more_often_than_later_ones():
    assert main_runs_wanted(True) == FIRST_BASELINE_RUNS == 6
    assert main_runs_wanted(False) == BASELINE_RUNS == 2
    assert main_runs_wanted(True, 4, 3) == 4
    assert main_runs_wanted(False, 4, 3) == 3


def test_main_is_measured_at_least_once():
    assert main_runs_wanted(True, 0, 0) == 1
    assert main_runs_wanted(False, 0, 0) == 1


# --- decide: crash, remeasure, wait --------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(candidate=[0.5]),  # a great number
        dict(candidate=[]),  # no number at all
        dict(candidate=[0.5], main=[]),  # no main either
        dict(candidate=[0.5], measured_on=OLD_MAIN),  # and measured on an old main
        dict(candidate=[2.0], noise=None),
    ],
    ids=["great-number", "no-candidate", "no-main", "old-main", "worse-no-noise"],
)
def test_crash_wins_over_everything(kwargs):
    d = judge(
        crash='Traceback (most recent call last):\n  File "train.py"\nRuntimeError: CUDA out of memory\n', **kwargs
    )
    assert d.action == "crash"
    # the reason quotes the last line of the traceback
    assert "RuntimeError: CUDA out of memory" in d.reason
    assert "Traceback" not in d.reason
    assert (d.val_bpb, d.delta, d.margin, d.extra_main_runs) == (None, None, None, 0)


@pytest.mark.parametrize("crash", ["", "   \n\t\n"], ids=["empty", "whitespace"])
def test_crash_without_output_says_so(crash):
    d = judge([0.5], crash=crash)
    assert d.action == "crash"
    assert "no output" in d.reason


@pytest.mark.parametrize("candidate", [[0.5], [0.999], [1.5], []], ids=["great", "borderline", "worse", "none"])
def test_remeasure_when_main_moved(candidate):
    d = judge(candidate, measured_on=OLD_MAIN, current_main=MAIN)
    assert d.action == "remeasure"
    assert OLD_MAIN[:7] in d.reason and MAIN[:7] in d.reason
    assert d.val_bpb is None


def test_no_candidate_run_waits():
    d = judge([])
    assert d.action == "wait"
    assert "no finished run" in d.reason


@pytest.mark.parametrize("noise", [NOISE, None], ids=["noise", "no-noise"])
def test_no_main_measurement_waits(noise):
    d = judge([0.5], main=[], noise=noise)
    assert d.action == "wait"
    assert "main has no measurement" in d.reason


# --- decide: keep ---------------------------------------------------------------------------------


def test_single_run_beyond_the_margin_is_kept_with_its_numbers():
    d = judge([0.95])
    assert d.action == "keep"
    assert d.val_bpb == pytest.approx(0.95)
    assert d.delta == pytest.approx(-0.05)
    assert d.margin == pytest.approx(keep_margin(ONE_RUN_Z, 30, 1, 6), rel=1e-9)
    assert d.extra_main_runs == 0
    # the reason a human reads carries the numbers behind the decision
    assert "beats main 1.000000 by 0.050000" in d.reason
    assert "1 run against 6 of main" in d.reason
    assert "30 degrees of freedom" in d.reason


def test_several_runs_are_judged_on_their_means():
    d = judge([0.95, 0.97], main=[1.0, 1.02, 1.0, 1.02, 1.0, 1.02, 1.01])
    assert d.action == "keep"
    assert d.val_bpb == pytest.approx(0.96)
    assert d.delta == pytest.approx(0.96 - 7.07 / 7)
    assert d.margin == pytest.approx(keep_margin(TWO_RUN_Z, 30, 2, 7), rel=1e-9)
    assert "2 runs against 7 of main" in d.reason


def test_improvement_equal_to_the_margin_is_not_kept():
    # Exactly representable numbers: a gain of 0.25 against a floor of 0.25, zero sigma.
    # Only *more* than the margin keeps.
    d = judge([0.75], main=[1.0], noise=Noise(0.0, 5), config=JudgeConfig(min_margin=0.25, confirm=False))
    assert (d.delta, d.margin) == (-0.25, 0.25)
    assert d.action == "discard"
    assert judge([0.75], main=[1.0], noise=Noise(0.0, 5), config=JudgeConfig(min_margin=0.2499)).action == "keep"


def test_min_margin_floor_holds_back_a_gain_the_noise_alone_would_keep():
    config = JudgeConfig(min_margin=0.1)
    assert judge([0.95]).action == "keep"
    d = judge([0.95, 0.95], config=config)
    assert d.action == "discard" and d.margin == 0.1


# --- decide: confirm --------------------------------------------------------------------------------


def test_single_run_inside_the_confirm_window_gets_a_confirmation_and_one_main_run():
    # 2 standard errors: beyond the 1.25 of the confirm window, inside the keep margin (2.66 SE at
    # 30 degrees of freedom).
    d = judge([1.0 - 2 * SE_1])
    assert d.action == "confirm"
    assert d.extra_main_runs == 1
    assert d.delta == pytest.approx(-2 * SE_1)
    assert d.margin == pytest.approx(keep_margin(ONE_RUN_Z, 30, 1, 6), rel=1e-9)
    assert "one confirmation run and 1 more run of main" in d.reason


def test_small_improvement_below_the_confirm_window_is_discarded_at_once():
    # 1 standard error: could well be noise, and a confirmation would rarely turn it into a keep.
    d = judge([1.0 - SE_1])
    assert d.action == "discard"
    assert d.extra_main_runs == 0
    assert "inside the noise margin" in d.reason


def test_confirm_window_edge_is_exclusive():
    config = JudgeConfig(confirm_below=1.0)
    exact = Noise(sigma=0.25, dof=30)  # one run against one of main: standard error 0.25 * sqrt(2)
    window = 0.25 * math.sqrt(2)
    assert judge([1.0 - window], main=[1.0], noise=exact, config=config).action == "discard"
    assert judge([1.0 - window * 1.001], main=[1.0], noise=exact, config=config).action == "confirm"


def test_confirm_main_runs_sets_how_many_main_runs_are_queued():
    d = judge([1.0 - 2 * SE_1], config=JudgeConfig(confirm_main_runs=0))
    assert d.action == "confirm" and d.extra_main_runs == 0
    assert "more run of main" not in d.reason
    d = judge([1.0 - 2 * SE_1], config=JudgeConfig(confirm_main_runs=2))
    assert d.extra_main_runs == 2 and "2 more runs of main" in d.reason


def test_confirmation_that_holds_up_is_kept_at_the_two_run_threshold():
    first = judge([1.0 - 2 * SE_1])
    assert first.action == "confirm"
    # The confirmation run agrees and main got one more run: the two-run margin (2.1 z-equivalent,
    # 2 runs against 7) is smaller than the one-run margin, and the mean clears it.
    two = judge([1.0 - 2 * SE_1, 1.0 - 2 * SE_1], main=MAIN_RUNS + [1.0], noise=Noise(SIGMA, 32))
    assert two.action == "keep"
    assert two.margin == pytest.approx(keep_margin(TWO_RUN_Z, 32, 2, 7), rel=1e-9)
    assert two.margin < first.margin


def test_confirmation_that_regresses_is_discarded_and_never_confirmed_again():
    d = judge([1.0 - 2 * SE_1, 1.0], main=MAIN_RUNS + [1.0], noise=Noise(SIGMA, 32))
    assert d.action == "discard"
    assert d.extra_main_runs == 0
    assert "inside the noise margin" in d.reason and "2 runs against 7 of main" in d.reason


def test_confirm_off_decides_on_the_first_run():
    config = JudgeConfig(confirm=False)
    assert judge([1.0 - 2 * SE_1], config=config).action == "discard"
    assert judge([0.95], config=config).action == "keep"


# --- decide: discard, ties ----------------------------------------------------------------------------


@pytest.mark.parametrize("candidate", [[1.01], [1.001, 1.003]], ids=["one-run", "two-runs"])
def test_worse_is_discarded(candidate):
    d = judge(candidate)
    assert d.action == "discard"
    assert "worse than main" in d.reason
    assert d.delta is not None and d.delta > 0


@pytest.mark.parametrize("noise", [NOISE, None, Noise(0.0, 3)], ids=["noise", "no-noise", "zero-noise"])
def test_ties_go_to_main(noise):
    d = judge([1.0], main=[1.0, 1.0], noise=noise)
    assert d.action == "discard"
    assert "ties" in d.reason
    assert d.delta == 0.0


def test_zero_noise_keeps_any_strict_improvement():
    # Repeats that agree exactly (a deterministic train.py): any measured gain is real.
    assert judge([0.9999], main=[1.0, 1.0], noise=Noise(0.0, 4)).action == "keep"


# --- decide: unknown noise ---------------------------------------------------------------------------


def test_no_noise_estimate_never_keeps():
    huge = [0.1]
    first = judge(huge, main=[1.0], noise=None)
    assert first.action == "confirm"
    assert first.extra_main_runs == 1
    assert "noise is not known" in first.reason
    assert first.margin is None
    # even with two runs, no noise estimate means no keep
    assert judge([0.1, 0.1], main=[1.0], noise=None).action == "discard"
    # and a floor on the margin does not stand in for the noise
    assert judge(huge, main=[1.0], noise=None, config=JudgeConfig(min_margin=0.01)).action == "confirm"


def test_no_noise_estimate_with_confirm_off_is_discarded_saying_why():
    d = judge([0.1], main=[1.0], noise=None, config=JudgeConfig(confirm=False))
    assert d.action == "discard"
    assert "noise is not known" in d.reason
    assert d.delta == pytest.approx(-0.9)


def test_no_noise_estimate_still_queues_a_main_run_when_confirm_main_runs_is_zero():
    # Without a main run nothing would ever give the noise a second value of the same code.
    d = judge([0.5], main=[1.0], noise=None, config=JudgeConfig(confirm_main_runs=0))
    assert d.action == "confirm" and d.extra_main_runs == 1


# --- the simulation behind the defaults ------------------------------------------------------------


def load_bench():
    return load_bench_script("decision_accuracy")


def test_simulated_null_change_at_experiment_one_is_rarely_kept():
    bench = load_bench()
    gauss = bench.NOISE["gauss"]

    def first_experiment(rule, trajectories: int):
        # Only experiment 1 matters here, so one experiment per trajectory.
        options = SimpleNamespace(sequential=trajectories, experiments=1, seed=7, effects="mixed")
        return bench.one_after_another(rule, gauss, options)

    # 1000 seeded trajectories put a standard error of about 0.5 percentage point on a rate near 2%
    # and about 1.6 on the reference rule's 50%: each bound below is 6 standard errors or more away
    # from the rate it bounds.
    tally_new = first_experiment(bench.SEQUENTIAL, 1000)
    tally_reference = first_experiment(bench.REFERENCE, 1000)
    assert tally_new.null_probes_kept / tally_new.null_probes <= 0.05  # the target
    # the reference's single-run rule keeps noise, so the simulation can tell the rules apart
    assert tally_reference.null_probes_kept / tally_reference.null_probes >= 0.10
    # and the caution does not cost the power to see a real gain of 3 sigma (target 80%; loose here)
    assert tally_new.gain_probes_kept / tally_new.gain_probes >= 0.75
    # the same seed gives the same trajectories
    again = replace(first_experiment(bench.SEQUENTIAL, 50), seconds=0.0)
    assert again == replace(first_experiment(bench.SEQUENTIAL, 50), seconds=0.0)


def test_the_judges_settings_come_from_program_md():
    from bot.loop.judge import judge_config
    from bot.loop.program import LoopSettings

    settings = LoopSettings(noise_sigmas=3.0, confirm_sigmas=2.0, confirm_below=1.0, min_margin=0.001, confirm=False)
    assert judge_config(settings) == JudgeConfig(
        noise_sigmas=3.0, confirm_sigmas=2.0, confirm_below=1.0, min_margin=0.001, confirm=False
    )


# --- decide: a smaller train.py (non-inferiority) ----------------------------------------------------

SIMPLER = Simplification(lines=3, tokens=20)
LOSS_MARGIN = JudgeConfig().simplicity_sigmas * SIGMA  # one sigma: 0.01
SIMPLICITY_Z = JudgeConfig().simplicity_z  # 1.645: one-sided 95%


def judge_simpler(candidate: list[float], *, simpler: Simplification | None = SIMPLER, **kwargs) -> Decision:
    config = kwargs.pop("config", None) or JudgeConfig()
    main = kwargs.pop("main", None) or MAIN_RUNS
    noise = kwargs.pop("noise", NOISE)
    return decide(
        candidate=candidate,
        crash=None,
        main=main,
        noise=noise,
        measured_on=MAIN,
        current_main=MAIN,
        config=config,
        simpler=simpler,
        **kwargs,
    )


def worst_loss(candidate: list[float], main: list[float] = MAIN_RUNS, dof: int = 30) -> float:
    """The one-sided 95% upper bound of (candidate - main), computed independently of the judge."""
    se = SIGMA * math.sqrt(1 / len(candidate) + 1 / len(main))
    return sum(candidate) / len(candidate) - sum(main) / len(main) + t_quantile(normal_tail(SIMPLICITY_Z), dof) * se


@pytest.mark.parametrize(
    "candidate",
    [[0.95], [1.0 - 2 * SE_1], [1.0 - SE_1], [1.0], [1.003], [1.2], [0.99, 0.99], [1.0, 1.001], [1.05, 1.04]],
    ids=[
        "clear-gain",
        "confirm-window",
        "small-gain",
        "tie",
        "small-loss",
        "large-loss",
        "two-gain",
        "two-tie",
        "two-loss",
    ],
)
@pytest.mark.parametrize("noise", [NOISE, Noise(0.02, 3), None], ids=["noise", "few-dof", "no-noise"])
@pytest.mark.parametrize("confirm", [True, False], ids=["confirm", "no-confirm"])
def test_a_change_that_is_not_simpler_is_judged_exactly_as_before(candidate, noise, confirm):
    config = JudgeConfig(confirm=confirm)
    before = judge(candidate, noise=noise, config=config)
    assert judge_simpler(candidate, simpler=None, noise=noise, config=config) == before
    # and a simpler one is too when program.md sets the simplicity rule off
    off = JudgeConfig(confirm=confirm, simplicity_sigmas=0.0)
    assert judge_simpler(candidate, noise=noise, config=off) == judge(candidate, noise=noise, config=off) == before


def test_a_simpler_change_that_is_clearly_better_is_an_ordinary_keep_said_as_such():
    d = judge_simpler([0.95])
    assert d == judge([0.95])
    assert d.action == "keep" and d.loss_margin is None
    assert d.reason.startswith("val_bpb 0.950000 beats main 1.000000 by 0.050000, more than the noise margin")


def test_a_simpler_change_in_the_gain_rules_confirm_window_gets_the_ordinary_confirmation():
    assert judge_simpler([1.0 - 2 * SE_1]) == judge([1.0 - 2 * SE_1])


def test_a_simpler_single_run_without_a_clear_loss_gets_a_confirmation_run_and_a_run_of_main():
    d = judge_simpler([1.002])
    assert d.action == "confirm" and d.extra_main_runs == 1
    assert d.loss_margin == pytest.approx(LOSS_MARGIN)
    assert d.delta == pytest.approx(0.002)
    assert d.margin == pytest.approx(keep_margin(ONE_RUN_Z, 30, 1, 6), rel=1e-9)
    assert d.reason == (
        "val_bpb 1.002000 against main 1.000000 (+0.002000), a simplification: 3 fewer lines of code "
        "(20 fewer code tokens); its run is less than 0.005000 worse than main, so one confirmation run "
        "and 1 more run of main to rule out a loss larger than 0.010000 (1 sigma) at 95%"
    )


def test_a_simpler_single_run_losing_half_the_margin_is_discarded_without_a_confirmation():
    # half of one sigma (0.005) is the line: a run this much worse rarely survives a confirmation
    assert judge_simpler([1.0049]).action == "confirm"
    d = judge_simpler([1.0051])
    assert d.action == "discard" and d.extra_main_runs == 0
    assert "a simplification: 3 fewer lines of code" in d.reason
    assert "not less than 0.005000" in d.reason and "a loss larger than 0.010000 (1 sigma)" in d.reason


def test_a_simpler_change_whose_runs_rule_out_a_loss_beyond_the_margin_is_kept_for_simplicity():
    # two runs against six of main, sigma 0.01 from 30 degrees of freedom: the 95% upper bound of the
    # difference is delta + 1.697 * 0.00816 = delta + 0.01386, so a delta of -0.004 rules out a loss
    # of more than 0.01; the gain rule would need a gain of 0.018
    candidate = [0.995, 0.997]
    assert worst_loss(candidate) < LOSS_MARGIN
    d = judge_simpler(candidate)
    assert d.action == "keep"
    assert d.loss_margin == pytest.approx(LOSS_MARGIN)
    assert d.margin == pytest.approx(keep_margin(TWO_RUN_Z, 30, 2, 6), rel=1e-9)  # the gain rule's, as ever
    assert d.reason == (
        "kept for simplicity: 3 fewer lines of code (20 fewer code tokens), and the runs rule out a loss "
        f"larger than 0.010000 (1 sigma) at 95%: val_bpb 0.996000 against main 1.000000 (-0.004000, at most "
        f"{worst_loss(candidate):+.6f}; 2 runs against 6 of main, sigma 0.010000 from 30 degrees of freedom)"
    )


def test_a_simpler_change_is_kept_only_when_the_bound_is_strictly_inside_the_margin():
    # an upper bound exactly at the margin does not rule the margin out
    bound = t_quantile(normal_tail(SIMPLICITY_Z), 30) * SIGMA * math.sqrt(1 / 2 + 1 / 6)
    at_margin = 1.0 + LOSS_MARGIN - bound
    assert judge_simpler([at_margin - 1e-9, at_margin - 1e-9]).action == "keep"
    assert judge_simpler([at_margin + 1e-9, at_margin + 1e-9]).action == "discard"


def test_a_simpler_change_whose_runs_cannot_rule_out_the_loss_is_discarded_saying_so():
    candidate = [1.0, 1.002]
    d = judge_simpler(candidate)
    assert d.action == "discard" and d.loss_margin == pytest.approx(LOSS_MARGIN)
    assert d.reason == (
        "val_bpb 1.001000 against main 1.000000 (+0.001000), a simplification: 3 fewer lines of code "
        "(20 fewer code tokens); but the runs do not rule out a loss larger than 0.010000 (1 sigma) at 95%: "
        f"it may be as large as {worst_loss(candidate):+.6f} (2 runs against 6 of main, sigma 0.010000 from "
        "30 degrees of freedom)"
    )


def test_the_simplicity_margin_is_in_sigma_and_its_confidence_a_one_sided_student_t():
    # two sigma of margin, and few degrees of freedom behind sigma widen the bound
    wide = JudgeConfig(simplicity_sigmas=2.0)
    candidate = [1.004, 1.006]
    assert judge_simpler(candidate).action == "discard"
    assert worst_loss(candidate) < 2 * LOSS_MARGIN
    d = judge_simpler(candidate, config=wide)
    assert d.action == "keep" and d.loss_margin == pytest.approx(0.02) and "(2 sigma) at 95%" in d.reason
    assert worst_loss(candidate, dof=2) > 2 * LOSS_MARGIN
    assert judge_simpler(candidate, config=wide, noise=Noise(SIGMA, 2)).action == "discard"
    strict = JudgeConfig(simplicity_sigmas=2.0, simplicity_z=2.0)
    assert "at 97.7%" in judge_simpler([1.0, 1.0], config=strict).reason


def test_with_confirmations_off_a_simpler_change_is_judged_on_its_one_run():
    config = JudgeConfig(confirm=False, simplicity_sigmas=2.0)
    assert worst_loss([0.998]) < 2 * LOSS_MARGIN
    d = judge_simpler([0.998], config=config)
    assert d.action == "keep" and d.reason.startswith("kept for simplicity") and "1 run against 6 of main" in d.reason
    assert judge_simpler([1.003], config=config).action == "discard"


def test_without_a_noise_estimate_a_simpler_change_is_judged_by_the_gain_rule():
    for candidate in ([1.0], [1.01], [0.99]):
        assert judge_simpler(candidate, noise=None) == judge(candidate, noise=None)


def test_the_simplicity_margin_comes_from_program_md():
    from bot.loop.judge import judge_config
    from bot.loop.program import LoopSettings

    assert judge_config(LoopSettings()).simplicity_sigmas == 1.0
    assert judge_config(LoopSettings(simplicity_sigmas=0.5)).simplicity_sigmas == 0.5


# --- the reasons in the task's metric -----------------------------------------------------------------

ACCURACY = JudgeConfig(metric=TICKET_ROUTING.metric)  # higher is better: the judge is given its negation


def test_a_higher_is_better_tasks_reasons_show_its_metric_on_its_own_scale():
    """The rule minimises the loss (accuracy negated); the reason reads accuracy as people know it."""
    kept = judge([-0.85], main=[-0.80] * 6, config=ACCURACY)
    assert (kept.action, kept.val_bpb, kept.delta) == ("keep", -0.85, pytest.approx(-0.05))
    assert kept.reason.startswith("accuracy 0.850000 beats main 0.800000 by 0.050000, more than the noise margin")
    worse = judge([-0.75], main=[-0.80] * 6, config=ACCURACY)
    assert worse.action == "discard"
    assert worse.reason == "accuracy 0.750000 is worse than main 0.800000 by 0.050000"
    assert judge([-0.75], main=[-0.75] * 6, config=ACCURACY).reason == "accuracy 0.750000 ties main: main keeps the tie"


def test_a_higher_is_better_keep_for_simplicity_bounds_its_loss_from_below():
    quiet = Noise(sigma=0.002, dof=30)
    d = judge_simpler([-0.751, -0.751], config=ACCURACY, main=[-0.75] * 6, noise=quiet)  # 0.001 better
    assert d.action == "keep" and d.reason.startswith("kept for simplicity")
    upper = (-0.751 + 0.75) + t_multiplier(SIMPLICITY_Z, 30) * standard_error(quiet, 2, 6)  # the loss's bound
    assert f"accuracy 0.751000 against main 0.750000 (+0.001000, at least {-upper:+.6f}; 2 runs" in d.reason


def test_judge_config_takes_the_tasks_metric_from_program_md():
    assert judge_config(LoopSettings(task="ticket-routing")).metric == TICKET_ROUTING.metric
    assert judge_config(LoopSettings()).metric.name == "val_bpb"
