"""The judge: pooled noise, the margin, and every branch of decide()."""

from __future__ import annotations

import math

import pytest

from bot.judge import Decision, JudgeConfig, decide, margin, pooled_sigma

MAIN = "a" * 40
OLD_MAIN = "b" * 40

# Main measured twice at 1.0 with a pooled sigma of 0.01 and the default config (2 sigmas, no
# floor, confirm on): the margin is 2 * 0.01 * sqrt(1/1 + 1/2) = 0.024495 for one candidate run
# and 2 * 0.01 * sqrt(1/2 + 1/2) = 0.02 for two.
SIGMA = 0.01
MARGIN_1_RUN = 2 * SIGMA * math.sqrt(1 + 1 / 2)
MARGIN_2_RUNS = 2 * SIGMA * math.sqrt(1 / 2 + 1 / 2)


def judge(candidate: list[float], *, main: list[float] | None = None, crash: str | None = None,
          sigma: float | None = SIGMA, measured_on: str = MAIN, current_main: str = MAIN,
          config: JudgeConfig | None = None) -> Decision:
    return decide(candidate=candidate, crash=crash, main=[1.0, 1.0] if main is None else main, sigma=sigma,
                  measured_on=measured_on, current_main=current_main, config=config or JudgeConfig())


# --- pooled_sigma ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("groups", "expected"), [
    # mean 2, squares 1 + 1 = 2, one degree of freedom
    ([[1.0, 3.0]], math.sqrt(2.0)),
    # squares 2 (first group) + 4 + 0 + 4 (second group, mean 4) = 10 over 1 + 2 degrees of freedom
    ([[1.0, 3.0], [2.0, 4.0, 6.0]], math.sqrt(10.0 / 3.0)),
    # repeats that agree exactly: zero noise, not "unknown"
    ([[1.5, 1.5, 1.5]], 0.0),
    # squares 0.5 + 0.5 over 1 + 1
    ([[0.5, 1.5], [2.0, 3.0]], math.sqrt(1.0 / 2.0)),
], ids=["one-pair", "two-groups", "identical", "equal-groups"])
def test_pooled_sigma_known_values(groups, expected):
    assert pooled_sigma(groups) == pytest.approx(expected, rel=1e-12)


def test_pooled_sigma_ignores_groups_of_one():
    # The singletons carry no information about the spread, however far off they are.
    assert pooled_sigma([[1.0, 3.0], [100.0], [-50.0]]) == pytest.approx(math.sqrt(2.0))


@pytest.mark.parametrize("groups", [[], [[]], [[1.0]], [[1.0], [2.0], [3.0]]],
                         ids=["no-groups", "empty-group", "one-singleton", "only-singletons"])
def test_pooled_sigma_is_none_without_repeats(groups):
    assert pooled_sigma(groups) is None


# --- margin --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("sigma", "n_c", "n_m", "config", "expected"), [
    (0.01, 1, 2, JudgeConfig(), 2 * 0.01 * math.sqrt(1 / 1 + 1 / 2)),
    (0.01, 2, 2, JudgeConfig(), 2 * 0.01 * math.sqrt(1 / 2 + 1 / 2)),
    (0.02, 3, 5, JudgeConfig(noise_sigmas=3.0), 3 * 0.02 * math.sqrt(1 / 3 + 1 / 5)),
    (0.01, 1, 1, JudgeConfig(noise_sigmas=1.0), 0.01 * math.sqrt(2)),
    # the formula is above the floor: the floor does not matter
    (0.01, 1, 2, JudgeConfig(min_margin=0.001), 2 * 0.01 * math.sqrt(1.5)),
    # the formula is below the floor: the floor wins
    (0.01, 1, 2, JudgeConfig(min_margin=0.05), 0.05),
    (0.0, 2, 2, JudgeConfig(min_margin=0.003), 0.003),
    (0.0, 2, 2, JudgeConfig(), 0.0),
    (0.01, 1, 2, JudgeConfig(noise_sigmas=0.0, min_margin=0.004), 0.004),
], ids=["1v2", "2v2", "3v5-3sigmas", "1v1-1sigma", "above-floor", "floored", "zero-sigma-floor",
        "zero-sigma-no-floor", "zero-sigmas-floor"])
def test_margin_formula_and_floor(sigma, n_c, n_m, config, expected):
    assert margin(sigma, n_c, n_m, config) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("min_margin", [0.0, 0.003])
def test_margin_is_the_floor_when_sigma_is_unknown(min_margin):
    assert margin(None, 1, 2, JudgeConfig(min_margin=min_margin)) == min_margin


@pytest.mark.parametrize(("n_c", "n_m"), [(0, 2), (2, 0), (0, 0)])
def test_margin_is_the_floor_without_runs(n_c, n_m):
    assert margin(0.01, n_c, n_m, JudgeConfig(min_margin=0.002)) == 0.002


def test_margin_shrinks_with_more_runs():
    config = JudgeConfig()
    assert margin(SIGMA, 1, 2, config) > margin(SIGMA, 2, 2, config) > margin(SIGMA, 4, 4, config)


# --- decide: crash, remeasure, wait --------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [
    dict(candidate=[0.5]),  # a great number
    dict(candidate=[]),  # no number at all
    dict(candidate=[0.5], main=[]),  # no main either
    dict(candidate=[0.5], measured_on=OLD_MAIN),  # and measured on an old main
    dict(candidate=[2.0], sigma=None),
], ids=["great-number", "no-candidate", "no-main", "old-main", "worse-no-sigma"])
def test_crash_wins_over_everything(kwargs):
    d = judge(crash="Traceback (most recent call last):\n  File \"train.py\"\nRuntimeError: CUDA out of memory\n",
              **kwargs)
    assert d.action == "crash"
    # the reason quotes the last line of the traceback
    assert "RuntimeError: CUDA out of memory" in d.reason
    assert "Traceback" not in d.reason
    assert (d.val_bpb, d.delta, d.margin) == (None, None, None)


@pytest.mark.parametrize("crash", ["", "   \n\t\n"], ids=["empty", "whitespace"])
def test_crash_without_output(crash):
    d = judge([0.5], crash=crash)
    assert d.action == "crash"
    assert "no output" in d.reason


@pytest.mark.parametrize("candidate", [[0.5], [0.999], [1.5], []], ids=["great", "borderline", "worse", "none"])
def test_measured_on_an_old_main_is_remeasured(candidate):
    d = judge(candidate, measured_on=OLD_MAIN, current_main=MAIN)
    assert d.action == "remeasure"
    assert OLD_MAIN[:7] in d.reason and MAIN[:7] in d.reason
    assert d.val_bpb is None


def test_no_candidate_waits():
    d = judge([])
    assert d.action == "wait"
    assert "no finished run" in d.reason


@pytest.mark.parametrize("sigma", [SIGMA, None])
def test_no_main_waits(sigma):
    d = judge([0.5], main=[], sigma=sigma)
    assert d.action == "wait"
    assert "main has no measurement" in d.reason


# --- decide: keep, confirm, discard --------------------------------------------------------------

def test_clear_improvement_is_kept_with_numbers():
    d = judge([0.95])
    assert d.action == "keep"
    assert d.val_bpb == pytest.approx(0.95)
    assert d.delta == pytest.approx(-0.05)
    assert d.margin == pytest.approx(MARGIN_1_RUN)
    assert "beats main" in d.reason and "1 run)" in d.reason


def test_clear_improvement_over_several_runs_uses_the_means():
    d = judge([0.95, 0.97], main=[1.0, 1.02])
    assert d.action == "keep"
    assert d.val_bpb == pytest.approx(0.96)
    assert d.delta == pytest.approx(-0.05)
    assert d.margin == pytest.approx(MARGIN_2_RUNS)
    assert "2 runs" in d.reason


def test_improvement_inside_the_margin_with_one_run_is_confirmed():
    d = judge([0.99])
    assert d.action == "confirm"
    assert d.val_bpb == pytest.approx(0.99)
    assert d.delta == pytest.approx(-0.01)
    assert d.margin == pytest.approx(MARGIN_1_RUN)
    assert "confirmation run" in d.reason


def test_improvement_inside_the_margin_with_two_runs_is_discarded():
    d = judge([0.99, 0.99])
    assert d.action == "discard"
    assert "inside the noise margin" in d.reason
    assert d.delta == pytest.approx(-0.01)
    assert d.margin == pytest.approx(MARGIN_2_RUNS)


def test_improvement_inside_the_margin_without_confirm_is_discarded():
    d = judge([0.99], config=JudgeConfig(confirm=False))
    assert d.action == "discard"
    assert "inside the noise margin" in d.reason
    assert d.margin == pytest.approx(MARGIN_1_RUN)


@pytest.mark.parametrize("candidate", [[1.01], [1.001, 1.003]], ids=["one-run", "two-runs"])
def test_worse_is_discarded(candidate):
    d = judge(candidate)
    assert d.action == "discard"
    assert "worse than main" in d.reason
    assert d.delta > 0


@pytest.mark.parametrize("sigma", [SIGMA, None, 0.0], ids=["sigma", "no-sigma", "zero-sigma"])
def test_exact_tie_goes_to_main(sigma):
    d = judge([1.0], main=[1.0, 1.0], sigma=sigma)
    assert d.action == "discard"
    assert "ties" in d.reason
    assert d.delta == 0.0


def test_confirmation_that_clears_the_smaller_two_run_margin_is_kept():
    # One run: delta -0.022 is inside the one-run margin 0.0245 -> one confirmation run.
    first = judge([0.978])
    assert first.action == "confirm"
    assert MARGIN_2_RUNS < -first.delta < MARGIN_1_RUN
    # The confirmation run agrees: delta -0.0225 with two runs clears the two-run margin 0.02.
    second = judge([0.978, 0.977])
    assert second.action == "keep"
    assert second.val_bpb == pytest.approx(0.9775)
    assert second.delta == pytest.approx(-0.0225)
    assert second.margin == pytest.approx(MARGIN_2_RUNS)


def test_confirmation_that_regresses_is_discarded():
    assert judge([0.978]).action == "confirm"
    assert judge([0.978, 1.0]).action == "discard"


def test_improvement_equal_to_the_margin_is_not_kept():
    # Exactly representable numbers: delta -0.25 against a floor of 0.25. Only *more* than the margin keeps.
    config = JudgeConfig(min_margin=0.25)
    one = judge([0.75], main=[1.0], sigma=None, config=config)
    assert one.action == "confirm"
    assert one.margin == 0.25 and one.delta == -0.25
    two = judge([0.75, 0.75], main=[1.0], sigma=None, config=config)
    assert two.action == "discard"
    assert "inside the noise margin" in two.reason


def test_min_margin_floor_applies_when_sigma_is_unknown():
    config = JudgeConfig(min_margin=0.25)
    assert judge([0.875], main=[1.0], sigma=None, config=config).action == "confirm"
    kept = judge([0.5], main=[1.0], sigma=None, config=config)
    assert kept.action == "keep" and kept.margin == 0.25


def test_without_noise_estimate_an_improvement_is_confirmed_first():
    # sigma None and min_margin 0: the margin is 0, so the judge cannot tell noise from gain on one
    # run; it asks for a confirmation, and keeps if the mean of both runs still beats main.
    d = judge([0.999], sigma=None)
    assert d.action == "confirm" and "noise is not known" in d.reason
    assert judge([0.999, 0.998], sigma=None).action == "keep"
    assert judge([0.999], sigma=None, config=JudgeConfig(confirm=False)).action == "keep"
