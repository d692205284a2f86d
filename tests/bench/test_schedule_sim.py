"""bench/schedule_sim.py: the real conductor on simulated time. Its cheap pieces (the forge in
memory, SQLite in memory) must change nothing the conductor does: the same short loops run on the
local git forge and a store file start the same runs in the same order at the same simulated
times, give the same verdicts with the same deltas, and spend the same runs on a main that moved.
Its simplifications make train.py smaller as the judge counts it, re-graft onto a moved main and
carry their true effect to the runner. A run's seed shares its noise with the runs of that seed
whose train.py draws the same initial weights."""

from __future__ import annotations

import benches
import numpy as np
import pytest

from bot.core.merge import merge_text
from bot.core.records import Job
from bot.core.simplicity import simplification

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
    assert any(run.moved for run in cheap.runs) == (slots > 1)  # one slot: no run on a main about to move


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


def test_a_simplification_makes_train_py_smaller_as_the_judge_counts_it() -> None:
    main = sim.sim_train_py(frozenset({1}))
    agent = sim.EffectAgent([0.5, -0.25], simplifications=frozenset({1}))
    context = sim.ProposalContext(program_md="", asset=main, main_val_bpb=None, history=[])

    added, simplified = agent.propose(context), agent.propose(context)

    assert simplification(main, added.asset) is None
    smaller = simplification(main, simplified.asset)
    assert smaller is not None and smaller.lines == 1 and smaller.tokens >= 2
    assert sim.EFFECT_LINE.findall(simplified.asset) == ["-0.25"]  # the runner reads its true effect


def test_a_simplification_re_grafts_onto_a_main_moved_by_its_neighbours() -> None:
    base = sim.sim_train_py(frozenset({4, 5}))
    context = sim.ProposalContext(program_md="", asset=base, main_val_bpb=None, history=[])
    agent = sim.EffectAgent([0.0] * 7, simplifications=frozenset({4, 5}))
    proposals = [agent.propose(context).asset for _ in range(7)]
    moved = merge_text(base, proposals[3], proposals[6], path="train.py", branch="p6")  # places 3 and 6
    moved = merge_text(base, moved, proposals[5], path="train.py", branch="p5")  # a simplification at 5

    merged = merge_text(base, moved, proposals[4], path="train.py", branch="p4")  # ...and one at 4 onto it

    assert sorted(sim.EFFECT_LINE.findall(merged)) == ["0.0"] * 4
    assert "_spare_" not in merged
    assert simplification(moved, merged) is not None


def test_each_simplification_carries_its_effect_and_the_simplicity_setting_reaches_the_judge() -> None:
    lenient = sim.simulate([0.0, 40.0], seed=0, simplifications=frozenset({0, 1}), settings={"simplicity_sigmas": 50})
    off = sim.simulate([0.0], seed=0, simplifications=frozenset({0}), settings={"simplicity_sigmas": 0})

    null, loss = lenient.experiments
    assert null.simpler and null.status == "keep" and null.kept_for_simplicity
    assert loss.simpler and loss.delta is not None and 30.0 < loss.delta < 50.0
    (null_off,) = off.experiments
    assert null_off.simpler and not null_off.kept_for_simplicity


def test_a_seed_share_makes_runs_of_one_seed_agree_unless_the_change_draws_other_weights() -> None:
    """rho 1: a run's noise is its seed's alone, so main's and a change's runs of one seed differ by the
    change's effect exactly, unless the change reshapes the model (or draws its weights otherwise)."""
    clock = sim.SimClock()
    runner = sim.SimRunner(1, clock, np.random.default_rng(0), sim.NOISE["gauss"], rho=1.0, fingerprints=True)
    main = sim.SIM_TRAIN_PY
    kept = main.replace("# place 1\n", "# place 1\n_effect_1 = -2.0\n")
    reshaped = main.replace("# place 2\n", "# place 2\n_reshape_2 = -2.0\n")
    drawn_otherwise = main.replace("# place 3\n", "# place 3\n_decor_3 = -2.0\n")
    values = {}
    for run_id, (asset, seed) in enumerate([(main, 1), (kept, 1), (reshaped, 1), (drawn_otherwise, 1), (main, 2)]):
        runner.submit(Job(run_id=run_id, asset=asset, profile="h100", seed=seed, commit="c"))
        values[run_id] = runner.jobs[run_id].value
    assert values[1] - values[0] == pytest.approx(-2.0 * sim.SIGMA)
    assert values[2] - values[0] != pytest.approx(-2.0 * sim.SIGMA)
    assert values[3] - values[0] != pytest.approx(-2.0 * sim.SIGMA)
    assert values[4] != pytest.approx(values[0])  # another seed, other weights
    fingerprints = [sim.params_fingerprint(a) for a in (main, kept, reshaped, drawn_otherwise)]
    assert fingerprints[0] == fingerprints[1] == fingerprints[3] != fingerprints[2]
