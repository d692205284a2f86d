"""Seeds through the real conductor on the ticket-routing task, whose hold-out split is drawn from
the seed: a fake evaluator whose accuracy is a function of (router, seed) alone, as the real one's
is, shows that a new main is measured under seeds its router has not run under (its runs are fresh
draws, not the kept candidate's repeated), and that a change is judged seed for seed with main
without any parameters' fingerprint (Task.seed_pairs), where training's unpaired rule discards it."""

from __future__ import annotations

import statistics
import zlib
from pathlib import Path

import pytest
from fakes import EFFECT, IDENTITY, SMALL_TRAIN_PY, FakeRunner, result_for, with_effect

from bot.agent.scripted import ScriptedAgent
from bot.core.records import Job, Proposal, RunResult
from bot.forge.local import init_research_repo
from bot.loop import lifecycle, measurement
from bot.loop.conductor import Conductor
from bot.loop.judge import JudgeConfig
from bot.loop.pairing import Paired, paired_differences
from bot.store import Store
from tests.bot.loop.test_lifecycle import make, program, run_to_end, tick_until
from tests.bot.store.test_store import new_experiment, new_run

ROUTER = "def train(examples):\n    return None\n\n\ndef route(texts):\n    return ['card_arrival' for _ in texts]\n"
# What the seed's hold-out split does to any router's accuracy: sd about 0.006, as the demo measured.
SPLIT = {1: 0.004, 2: -0.007, 3: 0.009, 4: -0.002, 5: 0.006, 6: -0.008, 7: 0.001, 8: -0.004, 9: 0.007}


def accuracy(asset: str, seed: int) -> float:
    """A router's accuracy under one seed: its effect, the seed's split, and a small part of its own
    (sd about 0.0004) that a deterministic evaluator repeats exactly for the same router and seed."""
    own = (zlib.crc32(f"{asset}|{seed}".encode()) % 5 - 2) * 0.0003
    return 0.80 + sum(float(m) for m in EFFECT.findall(asset)) + SPLIT[seed] + own


def routing_runner(identity: dict[str, str]) -> FakeRunner:
    def outcome(job: Job) -> RunResult:
        return result_for(job, identity=identity, val_bpb=-accuracy(job.asset, job.seed))  # higher is better

    return FakeRunner(outcome=outcome)


def routing_loop(tmp_path: Path, changes: list[tuple[float, str]], task: str = "ticket-routing") -> Conductor:
    """A conductor on `task` (ticket routing's router.py, or training's train.py beside the same fake
    evaluation), the first main measured 4 times and every later one twice, proposing `changes`
    (effect on accuracy, title)."""
    asset, base = ("router.py", ROUTER) if task == "ticket-routing" else ("train.py", SMALL_TRAIN_PY)
    identity = dict(IDENTITY, task=task)
    settings = dict(task=task, first_baseline_runs=4, baseline_runs=2)
    files = {asset: with_effect(base, 0.0, "main"), "program.md": program(**settings)}
    proposals = [
        Proposal(title, f"hypothesis of {title}", with_effect(base, effect, title)) for effect, title in changes
    ]
    return make(
        tmp_path,
        ScriptedAgent(proposals),
        forge=init_research_repo(tmp_path / "repo", files),
        runner=routing_runner(identity),
        identity=identity,
        experiments=len(changes),
    )


def test_a_new_main_runs_under_seeds_its_router_has_not_run_under_so_its_remeasure_is_fresh(tmp_path: Path) -> None:
    loop = routing_loop(tmp_path, [(0.05, "a clear gain")])
    run_to_end(loop)
    exp = loop.store.experiments.all()[0]
    assert exp.status == "keep"
    tick_until(loop, lambda: loop.store.experiments.get(exp.id).remeasured_delta is not None)
    runs = [r for r in loop.store.runs.all() if r.rerun_of is None]
    kept = [r for r in runs if r.experiment_id == exp.id]
    new_main = [r for r in runs if r.experiment_id is None and r.code_hash == exp.code_hash]
    assert len(new_main) == 2 and not {r.seed for r in new_main} & {r.seed for r in kept}
    assert len({(r.code_hash, r.seed) for r in runs}) == len(runs)  # no router ran twice under one seed
    assert {r.val_bpb for r in new_main}.isdisjoint(r.val_bpb for r in kept)
    remeasured = loop.store.experiments.get(exp.id).remeasured_delta
    old_main = [r.val_bpb for r in runs if r.experiment_id is None and r.code_hash != exp.code_hash]
    assert remeasured == pytest.approx(statistics.fmean(r.val_bpb for r in new_main) - statistics.fmean(old_main))
    assert remeasured != pytest.approx(exp.delta)


@pytest.fixture
def pairing_from_one_degree_of_freedom(monkeypatch: pytest.MonkeyPatch) -> None:
    """The paired rule allowed from one degree of freedom and once the paired noise more likely than
    not pays (the defaults ask for 4 and 95% confidence, which take several experiments to gather)."""
    config = JudgeConfig(paired_min_dof=1, paired_pays_p=0.5, confirm_main_runs=0)
    monkeypatch.setattr(lifecycle, "judge_config", lambda settings: config)


@pytest.mark.parametrize("task", ["ticket-routing", "training"])
def test_a_two_sigma_gain_is_kept_seed_for_seed_where_the_tasks_seeds_pair(
    tmp_path: Path, pairing_from_one_degree_of_freedom: None, task: str
) -> None:
    """A gain of 0.012 accuracy, twice the split's sd: ticket routing pairs each run with main's under
    its seed (no fingerprint: its runs report none) and keeps it on three pairs; training, whose runs
    here report no fingerprint either, judges the same numbers unpaired and discards them."""
    loop = routing_loop(tmp_path, [(0.012, "two sigma")], task=task)
    run_to_end(loop)
    exp = loop.store.experiments.all()[0]
    seeds = [r.seed for r in loop.store.runs.all() if r.experiment_id == exp.id]
    if task == "ticket-routing":
        assert exp.status == "keep" and "paired on 3 seeds" in exp.reason
        assert seeds == [1, 2, 3]  # main's first three seeds: no run of main was needed beside them
    else:
        assert exp.status == "discard" and "paired" not in exp.reason


def test_a_null_change_is_not_kept_seed_for_seed(tmp_path: Path, pairing_from_one_degree_of_freedom: None) -> None:
    loop = routing_loop(tmp_path, [(0.0, "a null change"), (-0.0005, "a tiny loss")])
    run_to_end(loop)
    assert [e.status for e in loop.store.experiments.all()] == ["discard", "discard"]


def test_where_the_tasks_seeds_pair_every_run_pairs_with_mains_under_its_seed_without_a_fingerprint() -> None:
    values = [("A", None, "baseline", 1.0), ("A", None, "baseline", 1.2), ("E", 1, "candidate", 0.9)]
    seeded = [(1, "m", None), (2, "m", None), (1, "m", None)]  # no runner reports a fingerprint

    def found(seed_pairs: bool) -> dict:
        return paired_differences(
            values, seeded, {"m": "A"}, lambda code: measurement.main_runs(values, code), seed_pairs=seed_pairs
        )

    assert found(seed_pairs=False) == {}  # training (and query latency): no fingerprint, no pairs
    assert found(seed_pairs=True) == {(1, "E"): Paired([pytest.approx(-0.1)], [0])}


def test_changes_on_one_main_spread_over_its_seeds_instead_of_all_taking_its_first(tmp_path: Path) -> None:
    """Five clear losses on a main measured four times, each discarded on one run: their runs take
    main's seeds 1-4 in turn, then the first again, so the experiments on one main subtract different
    runs of it (bot.store.runs: the seed whose pairs overlap least), where main's first seed for every
    one would pool their differences on one run of main."""
    loop = routing_loop(tmp_path, [(-0.05, f"a clear loss {i}") for i in range(5)])
    run_to_end(loop)
    assert [e.status for e in loop.store.experiments.all()] == ["discard"] * 5
    runs = [r for r in loop.store.runs.all() if r.rerun_of is None]
    assert [r.seed for r in runs if r.experiment_id is None] == [1, 2, 3, 4]
    assert [r.seed for r in runs if r.experiment_id is not None] == [1, 2, 3, 4, 1]


def test_a_candidates_short_run_pairs_with_mains_short_runs_and_leaves_its_full_seeds_to_its_full_runs(
    tmp_path: Path,
) -> None:
    """Main measured twice in full (seeds 1, 2) and three times short for screening (3, 4, 5): a
    candidate's short run takes one of main's short seeds, so its full runs still take main's full
    seeds 1 and 2 and each pairs with a full run of main (a short one never counts beside them);
    beyond main's full seeds it takes one no run of either code has, which main then runs in full
    (main_seeds lists the full runs' seeds alone). No code runs twice under one seed, whatever the
    budget, so its short and full runs never share one."""
    store = Store(tmp_path / "state.db")
    exp = new_experiment(store)
    main = [new_run(store, None, "baseline", code_hash="main-1").seed for _ in range(2)]
    short = [new_run(store, None, "screen", code_hash="main-1").seed for _ in range(3)]
    assert (main, short) == ([1, 2], [3, 4, 5])
    on_main = dict(main_code="main-1")
    screened = new_run(store, exp.id, "screen", **on_main).seed
    full = [new_run(store, exp.id, purpose, **on_main).seed for purpose in ("candidate", "confirm")]
    assert (screened, full) == (3, [1, 2])
    assert store.runs.main_seeds("main-1") == [1, 2] and store.runs.main_seeds("main-1", full=False) == [3, 4, 5]
    assert store.runs.next_seed("code-1", "main-1") == 6  # 3, 4, 5: main ran them short, code-1 ran 3
    other = new_experiment(store, 2)
    assert new_run(store, other.id, "screen", code_hash="code-2", **on_main).seed == 4  # overlaps least
    assert store.runs.next_seed("code-2", "main-1", full=False) == 5  # the one no other short run took
    runs = store.runs.all()
    assert len({(r.code_hash, r.seed) for r in runs}) == len(runs)
