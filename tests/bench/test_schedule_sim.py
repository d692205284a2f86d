"""bench/schedule_sim.py: the real conductor on simulated time. Its cheap pieces (the forge in
memory, SQLite in memory) must change nothing the conductor does: the same short loops run on the
local git forge and a store file start the same runs in the same order at the same simulated
times, give the same verdicts with the same deltas, and spend the same runs on a main that moved."""

from __future__ import annotations

import benches
import pytest

sim = benches.load("schedule_sim")

# clear gains among losses and nulls: keeps move main under experiments in flight, so the loops
# re-graft, re-measure and run old mains' runs late, as well as judging
EFFECTS = [-10.0, 3.0, 0.0, -10.0, 5.0, 1.0, -10.0, 2.0]


@pytest.mark.parametrize(("slots", "noise"), [(1, "gauss"), (3, "drift")])
def test_cheap_pieces_give_the_same_runs_and_verdicts_as_git_and_a_store_file(slots: int, noise: str) -> None:
    cheap = sim.simulate(EFFECTS, slots=slots, noise=sim.NOISE[noise], seed=3, cheap=True)
    real = sim.simulate(EFFECTS, slots=slots, noise=sim.NOISE[noise], seed=3, cheap=False)

    assert cheap.trace == real.trace
    assert cheap.experiments == real.experiments
    assert cheap.runs == real.runs
    assert [e.status for e in cheap.experiments].count("keep") == 3
    assert any(run.purpose == "remeasure" for run in cheap.runs)
    assert any(run.moved for run in cheap.runs)


def test_a_probe_stops_at_its_experiments_verdict() -> None:
    trajectory = sim.simulate([-10.0, 0.0, 0.0, 0.0], slots=2, seed=1, until=1)

    verdicts = [event for event in trajectory.trace if event[1] == "verdict"]
    assert verdicts[-1][2:] == (1, "keep")
    assert trajectory.experiments[0].effect == -10.0


def test_each_change_carries_its_effect_and_runs_measure_it() -> None:
    trajectory = sim.simulate([40.0], slots=1, seed=0)

    (experiment,) = trajectory.experiments
    assert experiment.status == "discard"
    assert experiment.delta is not None and 30.0 < experiment.delta < 50.0  # 40 sigma, give or take the noise
    assert [run.purpose for run in trajectory.runs] == ["baseline"] * 6 + ["candidate"]
