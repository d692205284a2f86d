"""Paired seeds: which runs pair with main's under the same seed, the paired noise they pool to, and
the paired rule that judge.decide asks after its own."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from bot.loop import measurement
from bot.loop.judge import Decision, JudgeConfig, Noise, decide, pooled_noise
from bot.loop.pairing import Paired, Pairs, Side, paired_differences, paired_pool
from bot.store import Store
from tests.bot.loop.test_judge import MAIN, MAIN_RUNS, NOISE, SIGMA, TWO_RUN_Z, judge, normal_tail, t_quantile
from tests.bot.loop.test_measurement import FIVE

# --- paired seeds --------------------------------------------------------------------------------
M1, M2 = "1" * 40, "2" * 40  # main's commits: train.py A, then B after a keep


def seeded_runs(*runs: tuple[str, int | None, str, float, int, str, str | None]):
    """(values, seeded) as store.runs.measured_runs gives them, from (code, experiment, purpose,
    val_bpb, seed, base_sha, params_fingerprint) rows."""
    return [r[:4] for r in runs], [r[4:] for r in runs]


def paired(values, seeded, mains=None) -> dict[Side, Paired]:
    return paired_differences(
        values, seeded, mains or {M1: "A", M2: "B"}, lambda code: measurement.main_runs(values, code)
    )


def differences(values, seeded, mains=None) -> dict[Side, list[float]]:
    return {side: found.differences for side, found in paired(values, seeded, mains).items()}


def test_an_experiments_runs_pair_with_mains_runs_of_the_same_seed_and_fingerprint():
    values, seeded = seeded_runs(
        ("A", None, "baseline", 1.000, 1, M1, "p"),
        ("A", None, "baseline", 1.010, 2, M1, "p"),
        ("A", None, "baseline", 1.004, 3, M1, "p"),
        ("E1", 1, "candidate", 0.997, 1, M1, "p"),
        ("E1", 1, "confirm", 1.006, 2, M1, "p"),
        ("E2", 2, "candidate", 0.990, 1, M1, "q"),  # new shapes: pairs with nothing
        ("E3", 3, "candidate", 0.995, 1, M1, None),  # its runner reported no fingerprint
    )
    found = paired(values, seeded)
    assert found == {(1, "E1"): Paired([pytest.approx(-0.003), pytest.approx(-0.004)], [0, 1])}
    assert paired_pool(found).noise() == pooled_noise([found[(1, "E1")].differences])


def test_a_change_re_measured_on_a_new_main_pairs_with_that_mains_runs():
    values, seeded = seeded_runs(
        ("A", None, "baseline", 1.000, 1, M1, "p"),
        ("A", None, "baseline", 1.002, 2, M1, "p"),
        ("B", None, "baseline", 0.990, 1, M2, "p"),
        ("E1", 1, "candidate", 0.995, 1, M1, "p"),
        ("E1+B", 1, "remeasure", 0.985, 1, M2, "p"),
    )
    assert differences(values, seeded) == {
        (1, "E1"): [pytest.approx(-0.005)],
        (1, "E1+B"): [pytest.approx(-0.005)],
    }


def test_a_seed_with_more_than_one_run_on_a_side_or_a_set_aside_run_of_main_pairs_with_nothing():
    """Two runs under one seed (a store from before index seeds) would share one partner; a run of
    main set aside as an outlier says more about the machine than about main."""
    values, seeded = seeded_runs(
        *[("A", None, "baseline", v, k + 1, M1, "p") for k, v in enumerate(FIVE)],
        ("A", None, "baseline", 1.010, 6, M1, "p"),  # an outlier: set aside
        ("E1", 1, "candidate", 0.999, 6, M1, "p"),
        ("E1", 1, "candidate", 0.998, 2, M1, "p"),
        ("E1", 1, "confirm", 0.997, 2, M1, "p"),
    )
    assert measurement.main_runs(values, "A").outlier == 1.010
    assert differences(values, seeded) == {}


def test_a_run_on_a_main_whose_train_py_is_not_known_pairs_with_nothing():
    values, seeded = seeded_runs(("A", None, "baseline", 1.0, 1, M1, "p"), ("E1", 1, "candidate", 0.99, 1, M2, "p"))
    assert differences(values, seeded, mains={M1: "A"}) == {}
    assert differences(values, seeded, mains={M1: "A", M2: "A"}) == {(1, "E1"): [pytest.approx(-0.01)]}


# --- paired seeds -------------------------------------------------------------------------------
# sigma_d 0.003 from 20 degrees of freedom against sigma 0.01: a paired difference varies a
# twentieth as much as an unpaired one (2 sigma^2), well inside paired_pays.
PAIRED = Noise(sigma=0.003, dof=20)


def paired_margin(n: int, noise: Noise = PAIRED) -> float:
    return t_quantile(normal_tail(TWO_RUN_Z), noise.dof) * noise.sigma / math.sqrt(n)


def judge_paired(
    candidate: list[float], differences: list[float], noise: Noise | None = PAIRED, rest: Noise | None = None, **kwargs
) -> Decision:
    """`rest`, the pool without these pairs, is `noise` unless given."""
    return decide(
        candidate=candidate,
        crash=None,
        main=kwargs.pop("main", MAIN_RUNS),
        noise=kwargs.pop("unpaired", NOISE),
        measured_on=MAIN,
        current_main=MAIN,
        config=kwargs.pop("config", JudgeConfig()),
        pairs=Pairs(differences, noise, noise if rest is None else rest),
        **kwargs,
    )


def test_three_pairs_lower_than_main_seed_for_seed_by_more_than_the_paired_margin_are_kept():
    d = [-0.006, -0.005, -0.007]  # unpaired: 0.994 against 1.0 is inside 2.1 standard errors (0.012)
    assert judge([0.994, 0.995, 0.993]).action == "discard"
    decision = judge_paired([0.994, 0.995, 0.993], d)
    assert decision.action == "keep" and decision.paired
    assert decision.delta == pytest.approx(-0.006) and decision.margin == pytest.approx(paired_margin(3))
    assert decision.reason.startswith("val_bpb 0.994000 beats main by 0.006000 seed for seed")
    assert "paired on 3 seeds" in decision.reason and "sigma_d 0.003000 from 20 degrees of freedom" in decision.reason


def test_fewer_than_three_pairs_earn_another_run_under_the_next_seed_never_a_keep():
    one = judge_paired([0.994], [-0.006])  # 2 paired standard errors: far beyond the margin, yet one pair
    assert one.action == "confirm" and one.paired and "one more run under the next seed" in one.reason
    assert one.extra_main_runs == 0  # main's run under that seed is the lifecycle's to queue when it lacks one
    two = judge_paired([0.994, 0.996], [-0.006, -0.004])
    assert two.action == "confirm" and "paired on 2 seeds" in two.reason  # unpaired, two runs would be discarded


def test_three_pairs_inside_the_paired_margin_are_left_to_the_unpaired_rule():
    band = paired_margin(3)
    decision = judge_paired([0.999] * 3, [-0.99 * band] * 3)
    assert decision.action == "discard" and not decision.paired


def test_a_pair_no_lower_than_main_gets_no_paired_confirmation():
    decision = judge_paired([1.001], [0.001])
    assert decision.action == "discard" and not decision.paired


def test_what_the_unpaired_rule_keeps_stays_kept_whatever_the_pairs_say():
    decision = judge_paired([0.95], [0.001])
    assert decision.action == "keep" and not decision.paired


@pytest.mark.parametrize(
    ("noise", "why"),
    [
        (None, "no experiment has two pairs yet"),
        (Noise(sigma=0.003, dof=3), "too few degrees of freedom"),
        (Noise(sigma=0.0075, dof=20), "sigma_d^2 above half of sigma^2: pairing does not pay"),
        (Noise(sigma=0.003, dof=4), "a ratio of 0.09 on 4 degrees of freedom does not show a ratio of 0.5 or less"),
    ],
    ids=["no paired noise", "few dof", "does not pay", "not shown to pay"],
)
def test_the_unpaired_rule_judges_where_pairing_is_not_known_to_pay(noise, why):
    d = [-0.006, -0.005, -0.007]
    assert judge_paired([0.994, 0.995, 0.993], d, noise) == judge([0.994, 0.995, 0.993]), why
    assert judge_paired([0.994], [-0.006], noise) == judge([0.994]), why


def test_pairing_pays_when_the_ratio_of_the_variances_is_below_its_share_with_the_confidence_asked():
    """sigma_d^2 / sigma^2 against paired_pays times the F quantile at 1 - paired_pays_p: 0.09 on 4 and
    30 degrees of freedom is under 0.5 x 0.174 at 95% but under 0.5 x 0.42 at 80%."""
    d, few = [-0.006, -0.005, -0.007], Noise(sigma=0.003, dof=4)
    assert not judge_paired([0.994, 0.995, 0.993], d, few).paired
    assert judge_paired([0.994, 0.995, 0.993], d, few, config=JudgeConfig(paired_pays_p=0.8)).paired


def test_a_change_without_pairs_is_judged_by_the_unpaired_rule():
    """Its parameters' fingerprint differs from main's (or none was reported): no differences."""
    assert judge_paired([0.994, 0.995, 0.993], []) == judge([0.994, 0.995, 0.993])


def test_pairs_that_spread_far_more_than_the_pool_are_not_judged_paired_and_say_so():
    """A change that keeps main's shapes but shares nothing else with it under a seed: its own d's
    spread like unpaired differences, so the pool's small sigma_d does not hold for it."""
    d = [-0.020, 0.002, -0.012]  # sd 0.011: about 13 times the variance of the rest of the pool
    own = sum((x + 0.010) ** 2 for x in d)
    pool = Noise(sigma=math.sqrt((18 * 0.003**2 + own) / 20), dof=20)
    assert pool.sigma**2 < 0.5 * SIGMA**2  # pairing pays for the pool as a whole
    decision = judge_paired([0.980, 1.002, 0.988], d, pool, rest=Noise(sigma=0.003, dof=18))
    assert decision.action == "discard" and not decision.paired
    assert "(not judged paired: its 3 pairs spread sd 0.011" in decision.reason
    assert decision.reason.startswith(judge([0.980, 1.002, 0.988]).reason)


def test_the_paired_margin_floor_is_min_margin():
    decision = judge_paired([0.994] * 3, [-0.006] * 3, config=JudgeConfig(min_margin=0.01))
    assert decision.action == "discard"


# --- the paired pool's degrees of freedom ---------------------------------------------------------


def pairs_on(main_runs: dict[Side, list[int]]) -> dict[Side, Paired]:
    """Sides whose pairs subtract the given runs of main (positions), their differences made up."""
    return {
        side: Paired([0.001 * (k % 3) + 0.0001 * i for k, _ in enumerate(runs)], runs)
        for i, (side, runs) in enumerate(main_runs.items())
    }


def satterthwaite(found: dict[Side, Paired]) -> float:
    """The pooled sum of squares' degrees of freedom, tr(A)^2 / tr(A^2), from its matrix A in the runs'
    independent noise (each side's own runs and the runs of main they subtract), built in full."""
    pooled = {side: p for side, p in found.items() if len(p.differences) >= 2}
    own = sum(len(p.differences) for p in pooled.values())
    mains = sorted({j for p in pooled.values() for j in p.main_runs})
    column = {j: own + k for k, j in enumerate(mains)}
    a = np.zeros((own + len(mains), own + len(mains)))
    at = 0
    for p in pooled.values():
        n = len(p.differences)
        b = np.zeros((n, a.shape[0]))
        for k, j in enumerate(p.main_runs):
            b[k, at + k], b[k, column[j]] = 1.0, -1.0
        at += n
        centre = np.eye(n) - 1.0 / n
        a += b.T @ centre @ b
    return float(np.trace(a) ** 2 / np.trace(a @ a))


def test_sides_that_share_no_runs_of_main_count_every_degree_of_freedom():
    found = pairs_on({(1, "E1"): [0, 1, 2], (2, "E2"): [3, 4], (3, "E3"): [5]})  # one pair: no deviation
    assert paired_pool(found).noise().dof == 3 == satterthwaite(found)


@pytest.mark.parametrize(("sides", "dof"), [(1, 2), (2, 3), (10, 6), (100, 7)])
def test_sides_on_the_same_runs_of_main_know_no_more_than_those_runs_allow(sides, dof):
    """m sides of 3 pairs on main's runs under seeds 1-3: 4 m (3 - 1) / (m + 3) degrees of freedom,
    never 8 however many sides, where counting each side's pairs less one would give 2 m."""
    found = pairs_on({(e, f"E{e}"): [0, 1, 2] for e in range(sides)})
    assert paired_pool(found).noise().dof == dof == math.floor(satterthwaite(found) + 1e-9)


def test_the_degrees_of_freedom_of_sides_that_share_some_runs_are_those_of_the_full_matrix():
    """Two mains; sides of two and three pairs, some on main's first runs, some on a run of main queued
    under a later seed: the closed form over shared runs equals the quadratic form's own count."""
    found = pairs_on(
        {
            (1, "E1"): [0, 1, 2],
            (2, "E2"): [0, 1],
            (3, "E3"): [1, 2, 6],
            (4, "E4"): [0, 6],
            (5, "E5"): [3, 4, 5],
            (6, "E6"): [3, 4],
            (7, "E7"): [7, 8],
            (8, "E8"): [2],
        }
    )
    assert paired_pool(found).noise().dof == math.floor(satterthwaite(found))
    without = {side: p for side, p in found.items() if side != (3, "E3")}
    assert paired_pool(found).noise(without=(3, "E3")) == paired_pool(without).noise()


def test_the_pooled_noise_spreads_as_its_degrees_of_freedom_say():
    """10 sides of 3 pairs on main's runs under seeds 1-3, drawn 20,000 times (Gaussian, unit noise per
    run): sigma_d^2 / 2 varies as a chi-square over the counted degrees of freedom would with about
    6 of them, not the 20 that each side's pairs less one add up to."""
    rng = np.random.default_rng(7)
    main = rng.standard_normal((20000, 1, 3))
    own = rng.standard_normal((20000, 10, 3))
    d = own - main
    estimate = ((d - d.mean(axis=2, keepdims=True)) ** 2).sum(axis=(1, 2)) / 20 / 2
    measured = 2 * estimate.mean() ** 2 / estimate.var()
    found = pairs_on({(e, f"E{e}"): [0, 1, 2] for e in range(10)})
    assert abs(measured - satterthwaite(found)) < 0.5 and paired_pool(found).noise().dof == 6  # 6.15


def test_a_side_is_tested_against_the_pool_without_it():
    found = pairs_on({(1, "E1"): [0, 1, 2], (2, "E2"): [3, 4, 5], (3, "E3"): [6, 7, 8]})
    found[(3, "E3")] = Paired([-0.020, 0.002, -0.012], [6, 7, 8])
    pool = paired_pool(found)
    rest = pool.noise(without=(3, "E3"))
    assert rest == paired_pool({side: p for side, p in found.items() if side != (3, "E3")}).noise()
    assert rest.dof == 4 and pool.noise().dof == 6
    assert paired_pool({(1, "E1"): found[(1, "E1")]}).noise(without=(1, "E1")) is None


# --- the seeds the store gives experiments on one main ---------------------------------------------


def seeds_on_one_main(
    tmp_path: Path, main_runs: int, experiments: int, pairs: int
) -> tuple[list[int], list[list[int]]]:
    """Main's seeds and each experiment's, as store.runs gives them: main measured `main_runs` times,
    then `experiments` changes one after another, each run `pairs` times on it."""
    store = Store(tmp_path / "state.db")

    def queue(experiment_id: int | None, code: str, **main_code: str) -> int:
        purpose = "baseline" if experiment_id is None else "candidate"
        run = store.runs.add(
            experiment_id=experiment_id,
            purpose=purpose,
            code_hash=code,
            commit_sha="c" * 40,
            base_sha=M1,
            asset="print(1)\n",
            profile="cpu",
            **main_code,
        )
        return run.seed

    main = [queue(None, "A") for _ in range(main_runs)]
    sides = []
    for e in range(experiments):
        exp = store.experiments.start_proposing(M1)
        sides.append([queue(exp.id, f"E{e}", main_code="A") for _ in range(pairs)])
    store.close()
    return main, sides


def pairs_of_seeds(main: list[int], sides: list[list[int]]) -> dict[Side, Paired]:
    return pairs_on({(e, f"E{e}"): [main.index(seed) for seed in seeds] for e, seeds in enumerate(sides)})


def test_experiments_on_one_main_take_the_seeds_that_overlap_least_with_the_others_pairs(tmp_path: Path):
    """Main measured 6 times: the first three experiments of two runs each take disjoint seeds, and the
    next ones pairs of seeds that no experiment has shared yet, where taking main's first seeds again
    would have put every experiment on main's runs under seeds 1 and 2."""
    main, sides = seeds_on_one_main(tmp_path, main_runs=6, experiments=8, pairs=2)
    assert main == [1, 2, 3, 4, 5, 6]
    assert sides == [[1, 2], [3, 4], [5, 6], [1, 3], [2, 4], [5, 1], [6, 2], [3, 5]]
    assert len({frozenset(seeds) for seeds in sides}) == len(sides)


@pytest.mark.parametrize(
    ("experiments", "pairs", "dof", "on_the_first_seeds"),
    [(5, 2, 4, 2), (20, 2, 11, 3), (100, 2, 17, 3), (10, 3, 11, 6), (100, 3, 18, 7)],
)
def test_the_pool_of_experiments_spread_over_mains_runs_knows_more_the_more_they_are(
    tmp_path: Path, experiments: int, pairs: int, dof: int, on_the_first_seeds: int
):
    """m experiments of n pairs on main's N runs, spread as the store spreads them, count Satterthwaite's
    degrees of freedom of the full matrix; about 4 m (n - 1)(N - 1) / (4 (N - 1) + (m - 1)(n - 1)) for
    a balanced spread, growing to 4 (N - 1) (20 here: main's 5 degrees of freedom, at the half of each
    difference's variance that main's run holds), where all on main's first n runs stay under 4 (n - 1)."""
    main, sides = seeds_on_one_main(tmp_path, main_runs=6, experiments=experiments, pairs=pairs)
    found = pairs_of_seeds(main, sides)
    assert paired_pool(found).noise().dof == dof == math.floor(satterthwaite(found) + 1e-9)
    balanced = 4 * experiments * (pairs - 1) * 5 / (20 + (experiments - 1) * (pairs - 1))
    assert balanced - 1 <= satterthwaite(found) < 20
    first = pairs_of_seeds(main, [main[:pairs]] * experiments)
    assert paired_pool(first).noise().dof == on_the_first_seeds < 4 * (pairs - 1)


def test_the_pooled_noise_of_experiments_spread_over_mains_runs_spreads_as_its_degrees_of_freedom_say(
    tmp_path: Path,
):
    """10 experiments of 3 pairs on main's 6 runs as the store spreads them, drawn 20,000 times (Gaussian,
    unit noise per run): sigma_d^2 / 2 varies as a chi-square over the counted degrees of freedom would
    with about 11 of them (11.3), where the same experiments on main's first 3 runs know 6."""
    main, sides = seeds_on_one_main(tmp_path, main_runs=6, experiments=10, pairs=3)
    found = pairs_of_seeds(main, sides)
    rng = np.random.default_rng(7)
    main_noise = rng.standard_normal((20000, 6))
    own = rng.standard_normal((20000, 10, 3))
    d = own - main_noise[:, [[main.index(seed) for seed in seeds] for seeds in sides]]
    estimate = ((d - d.mean(axis=2, keepdims=True)) ** 2).sum(axis=(1, 2)) / 20 / 2
    measured = 2 * estimate.mean() ** 2 / estimate.var()
    assert abs(measured - satterthwaite(found)) < 0.8 and paired_pool(found).noise().dof == 11
