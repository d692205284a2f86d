"""The GitHub branch policy: every branch at once for the Actions runner (it checks out the job's
commit); otherwise once a run starts, and in the degraded mode only for promising experiments,
each one left without a branch counted once in the budget's forecast so that the savings do not
talk the mode back into full."""

from __future__ import annotations

import pytest

from bot.github.branches import BudgetBranches
from bot.github.budget import BRANCH_WRITES, LOG_WRITES_PER_HOUR, PEOPLE_WRITES_PER_EXPERIMENT, WriteBudget
from bot.store.writes import WriteMode

LIMITS = ((60.0, 10), (3600.0, 50))


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def degraded(budget: WriteBudget, clock: Clock) -> None:
    for _ in range(9):  # 9 experiments in 10 minutes: over 90% of 50 an hour in full (test_budget's case)
        budget.charge("branch")
        budget.charge("commit")
        clock.now += 60.0
    assert budget.decide_mode().mode == "degraded"


def degraded_policy() -> tuple[Clock, WriteBudget, BudgetBranches]:
    """A clock, a budget turned degraded on it, and the policy of a runner that carries the asset."""
    clock = Clock()
    budget = WriteBudget(clock=clock, limits=LIMITS)
    degraded(budget, clock)
    return clock, budget, BudgetBranches(budget, runner_reads_branch=False)


@pytest.mark.parametrize("mode", ["full", "degraded"])
def test_with_the_actions_runner_every_branch_is_pushed_at_once(mode: str) -> None:
    clock = Clock()
    budget = WriteBudget(clock=clock, limits=LIMITS)
    if mode == "degraded":
        degraded(budget, clock)
    policy = BudgetBranches(budget, runner_reads_branch=True)
    assert policy.wanted(1, started=False, promising=False)


def test_in_full_mode_a_branch_waits_for_its_first_run() -> None:
    policy = BudgetBranches(WriteBudget(clock=Clock(), limits=LIMITS), runner_reads_branch=False)
    assert not policy.wanted(1, started=False, promising=False)
    assert policy.wanted(1, started=True, promising=False)
    assert policy.wanted(2, started=False, promising=True)


def test_degraded_only_a_promising_one_is_pushed_and_each_other_is_counted_once_in_the_forecast() -> None:
    clock, budget, policy = degraded_policy()
    before = budget.forecast()
    assert not policy.wanted(1, started=False, promising=False)
    assert not policy.wanted(1, started=True, promising=False)  # asked each tick: counted once
    after_one = budget.forecast()
    assert not policy.wanted(2, started=True, promising=False)
    assert policy.wanted(3, started=True, promising=True)
    # each unbranched experiment is counted 6 times over (the last sixth of the hour's rate)
    per_experiment = (BRANCH_WRITES + PEOPLE_WRITES_PER_EXPERIMENT) * 6
    assert after_one - before == pytest.approx(per_experiment)
    assert budget.forecast() - before == pytest.approx(2 * per_experiment)
    clock.now += 3600.0  # an hour later they have left the forecast, with every write
    assert budget.forecast() == pytest.approx(LOG_WRITES_PER_HOUR)


def test_one_left_without_a_branch_stays_so_when_the_mode_turns_full_unless_it_turns_promising() -> None:
    clock, budget, policy = degraded_policy()
    before = budget.forecast()
    assert not policy.wanted(1, started=True, promising=False)
    assert not policy.wanted(2, started=True, promising=False)
    budget._set_mode(WriteMode("full", clock.now, "room again", LIMITS))  # the forecast fell
    assert not policy.wanted(1, started=True, promising=False)  # no burst of catch-up pushes
    assert policy.wanted(3, started=True, promising=False)  # a new one goes by the full mode
    noted = budget.forecast()
    assert policy.wanted(2, started=True, promising=True)  # promising: pushed, its note forgotten
    assert noted - budget.forecast() == pytest.approx((BRANCH_WRITES + PEOPLE_WRITES_PER_EXPERIMENT) * 6)
    assert budget.forecast() > before


def test_those_a_former_life_left_without_a_branch_stay_so() -> None:
    budget = WriteBudget(clock=Clock(), limits=LIMITS)
    policy = BudgetBranches(budget, runner_reads_branch=False)
    before = budget.forecast()
    policy.left_unbranched([4, 5])
    assert not policy.wanted(4, started=True, promising=False) and policy.wanted(6, started=True, promising=False)
    assert policy.wanted(5, started=True, promising=True)
    assert budget.forecast() == before  # not counted again as new experiments


def test_one_proposed_while_degraded_is_pushed_when_it_starts_in_full_mode() -> None:
    clock, budget, policy = degraded_policy()
    before = budget.forecast()
    assert not policy.wanted(1, started=False, promising=False)  # waiting for a runner: nothing withheld yet
    assert budget.forecast() == before
    budget._set_mode(WriteMode("full", clock.now, "room again", LIMITS))
    assert policy.wanted(1, started=True, promising=False)
