"""Screening (bot.loop.screening) through the real conductor with a fake runner: a candidate's short
run first, full runs only for a promising one, short and full values never mixed, and nothing
changed with the setting off. A short run's fake value is its code's full value plus SHORT_OFFSET,
far from any full value, so a short value anywhere in the judge's numbers would show."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from fakes import CRASH_MARK, IDENTITY, SMALL_TRAIN_PY, FakeRunner, result_for, with_effect

from bot.agent.scripted import ScriptedAgent
from bot.core.records import Job, Proposal, RunResult
from bot.forge.local import LocalForge, init_research_repo
from bot.loop.conductor import Conductor, ConductorConfig
from bot.loop.judge import pooled_noise
from bot.loop.program import SettingsError, parse_program
from bot.loop.screening import SCREEN, SCREEN_FRACTION, SHORT_MAIN_RUNS
from bot.store import Store
from bot.views.read_model import view_of
from bot.views.results import rows

MAIN = with_effect(SMALL_TRAIN_PY, 0.0, "main")
SHORT_OFFSET = 1.0  # a short run's value: its code's full value plus this
SHORT_STEPS = 20  # a short run's steps (a full one's: 100, the fakes')
FAST = dict(first_baseline_runs=2, baseline_runs=2)


def program(**settings: object) -> str:
    lines = "\n".join(f"  {k}: {json.dumps(v)}" for k, v in settings.items())
    return f"---\nautoresearch:\n{lines}\n---\n\n# Research program\n\nLower val_bpb.\n"


def proposal(effect: float, title: str) -> Proposal:
    return Proposal(title, f"hypothesis of {title}", with_effect(MAIN, effect, title))


class BudgetRunner(FakeRunner):
    """A fake runner whose short runs (budget_fraction < 1) measure SHORT_OFFSET more; `jobs` keeps
    every job as submitted, its fraction with it. Its results carry `identity` (the fakes' by default)."""

    def __init__(self, identity: dict[str, str] | None = None) -> None:
        self.identity = dict(IDENTITY if identity is None else identity)
        super().__init__(outcome=self._outcome)

    def _outcome(self, job: Job) -> RunResult:
        result = result_for(job, identity=self.identity)
        if job.budget_fraction < 1.0 and result.val_bpb is not None:
            result.val_bpb += SHORT_OFFSET
            result.metrics.update(val_bpb=result.val_bpb, num_steps=SHORT_STEPS)
        return result


def make(
    tmp_path: Path,
    proposals: list[Proposal],
    runner: FakeRunner,
    lookahead: int = 1,
    forge: LocalForge | None = None,
    experiments: int | None = None,
    **settings: object,
) -> Conductor:
    """A conductor on a new research repo (or on `forge`, and the store in tmp_path as it stands), its
    results under `runner`'s identity, proposing `proposals` up to `experiments` in the store."""
    if forge is None:
        forge = init_research_repo(tmp_path / "repo", {"train.py": MAIN, "program.md": program(**FAST, **settings)})
    return Conductor(
        Store(tmp_path / "state.db"),
        forge,
        runner,
        ScriptedAgent(proposals),
        ConductorConfig(
            profile="smoke",
            identity=dict(getattr(runner, "identity", IDENTITY)),
            max_experiments=len(proposals) if experiments is None else experiments,
            retry_base_s=0.0,
            lookahead=lookahead,
        ),
        clock=time.time,
    )


def run_to_end(conductor: Conductor) -> None:
    for _ in range(400):
        conductor.tick()
        if conductor.finished():
            return
        time.sleep(0.002)
    raise AssertionError("the loop never finished")


def statuses(conductor: Conductor) -> list[tuple[str, str | None]]:
    return [(e.title, e.status) for e in conductor.store.experiments.all()]


def test_a_screened_out_candidate_never_gets_a_full_run(tmp_path: Path) -> None:
    runner = BudgetRunner()
    loop = make(tmp_path, [proposal(+0.1, "worse")], runner, screening=True)
    run_to_end(loop)
    exp = loop.store.experiments.all()[0]
    assert exp.status == "discard"
    assert exp.reason.startswith("screened out: short-run delta +0.09")
    assert f"against main's short runs {2.0 + SHORT_OFFSET:.3f}" in exp.reason
    own = loop.store.runs.all(experiment_id=exp.id)
    assert [r.purpose for r in own] == [SCREEN]
    assert [runner.jobs[r.id].budget_fraction for r in own] == [SCREEN_FRACTION]
    assert exp.val_bpb is None and exp.delta is None  # a short delta is no full one
    assert not exp.meta["screen"]["promoted"]


def test_a_promising_candidate_goes_on_to_full_runs_and_the_judge(tmp_path: Path) -> None:
    runner = BudgetRunner()
    loop = make(tmp_path, [proposal(-0.1, "better")], runner, screening=True)
    run_to_end(loop)
    assert statuses(loop) == [("better", "keep")]
    exp = loop.store.experiments.all()[0]
    own = loop.store.runs.all(experiment_id=exp.id)
    assert [r.purpose for r in own] == [SCREEN, "candidate"]
    assert [runner.jobs[r.id].budget_fraction for r in own] == [SCREEN_FRACTION, 1.0]
    assert exp.meta["screen"]["promoted"] and exp.meta["screen"]["delta"] == pytest.approx(-0.1, abs=0.002)
    short_mains = [r for r in loop.store.runs.all() if r.purpose == SCREEN and r.experiment_id is None]
    assert len(short_mains) == SHORT_MAIN_RUNS
    assert all(runner.jobs[r.id].budget_fraction == SCREEN_FRACTION for r in short_mains)
    full_mains = [r for r in loop.store.runs.all() if r.purpose == "baseline" and r.code_hash != exp.code_hash]
    # its short run pairs with one of main's short runs, its full run with one of main's full runs
    assert own[0].seed in {r.seed for r in short_mains} and own[1].seed == full_mains[0].seed
    row = next(row for row in rows(view_of(loop.store)) if row["id"] == exp.id)
    assert row["steps"] == 100  # its full run's steps: the short run's fifth is another measurement


def test_short_and_full_values_never_mix_in_the_judge_or_the_noise(tmp_path: Path) -> None:
    runner = BudgetRunner()
    # proposed one after another: the second on the new main, screened against its own short runs
    loop = make(tmp_path, [proposal(-0.1, "better"), proposal(+0.2, "worse")], runner, lookahead=0, screening=True)
    run_to_end(loop)
    assert statuses(loop) == [("better", "keep"), ("worse", "discard")]
    kept = loop.store.experiments.all()[0]
    full = [r.val_bpb for r in loop.store.runs.all(experiment_id=kept.id) if r.purpose == "candidate"]
    assert kept.val_bpb == pytest.approx(sum(full) / len(full))  # its short run is not in its mean
    assert kept.delta == pytest.approx(-0.1, abs=0.002)
    baseline = loop.lifecycle.baseline
    assert all(value < 2.0 + SHORT_OFFSET / 2 for _, _, _, value in baseline.values())
    assert all(purpose != SCREEN for _, _, purpose, _ in baseline.values())
    main_full = [r.val_bpb for r in loop.store.runs.all(code_hash=kept.code_hash) if r.purpose == "baseline"]
    assert baseline.main_values(kept.code_hash) == main_full
    noise = baseline.noise()
    assert noise is not None and noise.sigma < 0.001  # a short value pooled in would make it ~0.5
    short = loop.lifecycle.screening.short_noise()
    groups: dict[str, list[float]] = {}
    for run in loop.store.runs.all(state="done"):
        if run.purpose == SCREEN and run.experiment_id is None:
            groups.setdefault(run.code_hash, []).append(run.val_bpb)
    assert len(groups) == 2 and short == pooled_noise(groups.values())  # main's short runs alone, by train.py


def test_a_candidate_whose_main_changes_before_its_screen_ends_is_measured_in_full(tmp_path: Path) -> None:
    runner = BudgetRunner()
    loop = make(tmp_path, [proposal(-0.1, "better"), proposal(-0.3, "much better")], runner, screening=True)
    run_to_end(loop)
    first, second = loop.store.experiments.all()
    assert first.status == "keep"
    assert second.meta["screen"] == "not screened: main's train.py changed before its screen ended"
    assert second.status is not None and "screened out" not in (second.reason or "")


def test_a_crashing_short_run_ends_its_experiment_as_a_crash(tmp_path: Path) -> None:
    crash = Proposal("crash", "crashes", MAIN + CRASH_MARK)
    loop = make(tmp_path, [crash], BudgetRunner(), screening=True)
    run_to_end(loop)
    exp = loop.store.experiments.all()[0]
    assert exp.status == "crash" and "boom" in exp.error_tail
    assert [r.purpose for r in loop.store.runs.all(experiment_id=exp.id)] == [SCREEN]


def test_with_screening_off_nothing_changes(tmp_path: Path) -> None:
    runner = BudgetRunner()
    loop = make(tmp_path, [proposal(-0.1, "better"), proposal(+0.1, "worse")], runner)
    run_to_end(loop)
    assert statuses(loop) == [("better", "keep"), ("worse", "discard")]
    assert {r.purpose for r in loop.store.runs.all()} == {"baseline", "candidate"}
    assert all(job.budget_fraction == 1.0 for job in runner.jobs.values())
    assert all("screen" not in e.meta for e in loop.store.experiments.all())


def test_screening_is_refused_for_a_task_without_a_time_budget() -> None:
    with pytest.raises(SettingsError, match="has none: remove `screening: true`"):
        parse_program(program(task="ticket-routing", screening=True))
    assert parse_program(program()).settings.screening is False


def test_what_people_see_leaves_short_runs_out_of_mains_value_and_the_check(tmp_path: Path) -> None:
    from bot.github.render import check_summary

    loop = make(tmp_path, [proposal(+0.1, "worse")], BudgetRunner(), screening=True)
    run_to_end(loop)
    main = view_of(loop.store).main
    full = [r.val_bpb for r in loop.store.runs.all() if r.purpose == "baseline"]
    assert main.val_bpb == pytest.approx(sum(full) / len(full)) and main.runs == len(full)
    assert main.margin is not None and main.margin < 0.01  # a short run pooled in would make it ~1
    exp = loop.store.experiments.all()[0]
    summary = check_summary(
        exp, loop.store.runs.all(experiment_id=exp.id), main_val_bpb=main.val_bpb, noise_margin=None
    )
    assert "| val_bpb | — |" in summary and "| Runs | 0 |" in summary  # no full run: no value of its own
    assert f"| screen | ok | {2.1 + SHORT_OFFSET:.6f}" in summary  # its short run, listed as such
    assert "**Decision:** screened out: short-run delta +0.09" in summary


def test_after_a_new_harness_a_screened_candidate_gets_mains_short_runs_anew_and_a_verdict(tmp_path: Path) -> None:
    """Main's short runs under the old harness no longer count (measurement.counted): a candidate
    screened after a restart with a new harness hash gets main's short runs queued again under the
    new one, instead of waiting for ever on runs that are done but do not count."""
    before = make(tmp_path, [proposal(+0.1, "worse")], BudgetRunner(), screening=True)
    run_to_end(before)
    old_short = [r.id for r in before.store.runs.all() if r.purpose == SCREEN and r.experiment_id is None]
    assert len(old_short) == SHORT_MAIN_RUNS
    after = make(
        tmp_path,
        [proposal(-0.1, "better")],
        BudgetRunner(dict(IDENTITY, harness_hash="harness-2")),
        forge=before.forge,
        experiments=2,
    )
    run_to_end(after)
    old, new = after.store.experiments.all()
    assert (old.status, new.status) == ("discard", "keep")
    assert new.meta["screen"]["promoted"] and new.meta["screen"]["main_runs"] == SHORT_MAIN_RUNS
    fresh = [
        r for r in after.store.runs.all() if r.purpose == SCREEN and r.experiment_id is None and r.id not in old_short
    ]
    assert len(fresh) == SHORT_MAIN_RUNS and all(r.harness_hash == "harness-2" for r in fresh)
