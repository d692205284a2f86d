"""Runs that runners lose, and slots that come and go (bot.loop.runs), through the real conductor
on the fake runner: a lost run costs one run, never its experiment; losses of different runs never
add up; a run lost MAX_LOST_RUNS times in a row fails its experiment, blaming the runners; and the
conductor fills the slots the runner has now, a slot taken away finishing its run."""

from __future__ import annotations

import json
import time
from pathlib import Path

from fakes import IDENTITY, SMALL_TRAIN_PY, FakeRunner, result_for, with_effect

from bot.agent.scripted import ScriptedAgent
from bot.core.records import Proposal, RunResult, RunStatus
from bot.forge.local import init_research_repo
from bot.loop.conductor import Conductor, ConductorConfig
from bot.loop.runs import MAX_LOST_RUNS
from bot.store import Store

MAIN = with_effect(SMALL_TRAIN_PY, 0.0, "main")


def make(tmp_path: Path, runner: FakeRunner, proposals: list[Proposal], **settings: int) -> Conductor:
    lines = "\n".join(f"  {k}: {json.dumps(v)}" for k, v in {"baseline_runs": 2, **settings}.items())
    program = f"---\nautoresearch:\n{lines}\n---\n\n# Research program\n\nLower val_bpb.\n"
    forge = init_research_repo(tmp_path / "repo", {"train.py": MAIN, "program.md": program})
    config = ConductorConfig(profile="smoke", identity=dict(IDENTITY), max_experiments=len(proposals), retry_base_s=0.0)
    return Conductor(Store(tmp_path / "state.db"), forge, runner, ScriptedAgent(proposals), config)


def run_to_end(conductor: Conductor, ticks: int = 400) -> None:
    for _ in range(ticks):
        conductor.tick()
        if conductor.finished():
            return
        time.sleep(0.002)  # the agent's thread answers between ticks
    raise AssertionError("the loop never finished")


def change(effect: float, title: str) -> Proposal:
    return Proposal(title, f"hypothesis of {title}", with_effect(MAIN, effect, title))


class LosesExperimentRuns(FakeRunner):
    """Every run of an experiment is lost (its machine goes away each time); main's runs finish."""

    def lookup(self, run_id: int) -> RunStatus:
        job = self.jobs.get(run_id)
        if job is not None and job.experiment_id is not None:
            return RunStatus("lost", detail="the Modal container was preempted")
        return super().lookup(run_id)


def test_a_lost_run_runs_again_under_its_seed_and_its_experiment_is_decided(tmp_path: Path) -> None:
    runner = FakeRunner()
    loop = make(tmp_path, runner, [change(0.5, "worse")], first_baseline_runs=2)
    runner.lost.add(3)  # the experiment's first run (main's two baselines are runs 1 and 2)
    run_to_end(loop)
    lost = loop.store.runs.get(3)
    assert lost.state == "lost" and lost.experiment_id == 1 and "vanished" in (lost.note or "")
    again = [r for r in loop.store.runs.all() if r.rerun_of == 3]
    assert len(again) == 1 and again[0].seed == lost.seed and again[0].state == "done"
    exp = loop.store.experiments.get(1)
    assert exp.status == "discard" and not loop.blocked


def test_losses_of_different_runs_do_not_add_up(tmp_path: Path) -> None:
    # Six of main's runs at once, each lost once on its own machine: six losses of one code, but no
    # run was lost twice, so nothing is given up on.
    runner = FakeRunner(slots=6)
    runner.lost.update(range(1, MAX_LOST_RUNS + 2))
    loop = make(tmp_path, runner, [change(0.5, "worse")], first_baseline_runs=MAX_LOST_RUNS + 1)
    run_to_end(loop)
    runs = loop.store.runs.all()
    assert sum(r.state == "lost" for r in runs) == MAX_LOST_RUNS + 1
    assert all(any(x.rerun_of == r.id and x.state == "done" for x in runs) for r in runs if r.state == "lost")
    assert not loop.blocked and loop.store.experiments.get(1).status == "discard"


def test_a_run_lost_again_and_again_fails_its_experiment_blaming_the_runners(tmp_path: Path) -> None:
    loop = make(tmp_path, LosesExperimentRuns(), [change(-0.5, "better")], first_baseline_runs=2)
    run_to_end(loop)
    exp = loop.store.experiments.get(1)
    assert exp.status == "failed" and exp.state == "done"
    assert f"{MAX_LOST_RUNS} runs of it were lost in a row, a fault of the runners" in exp.reason
    assert "preempted" in exp.reason
    chain = [r for r in loop.store.runs.all() if r.experiment_id == 1]
    assert [r.state for r in chain] == ["lost"] * MAX_LOST_RUNS and len({r.seed for r in chain}) == 1
    assert not loop.blocked  # main's own runs are fine: only this experiment ends


class PreemptedThenKilled(FakeRunner):
    """The experiment's first run is preempted (lost, no result), its re-run killed from outside
    (lost, with the crash it may be); the run after finishes."""

    def __init__(self) -> None:
        super().__init__()
        self.fates: dict[int, str] = {}  # experiment run id -> what happens to it

    def lookup(self, run_id: int) -> RunStatus:
        job = self.jobs.get(run_id)
        if job is None or job.experiment_id is None:
            return super().lookup(run_id)
        fate = self.fates.setdefault(run_id, ["preempted", "killed", "finishes"][min(len(self.fates), 2)])
        if fate == "preempted":
            return RunStatus("lost", detail="the Modal container was preempted")
        if fate == "killed":
            why = "the training process was killed by SIGKILL, sent by something outside the run"
            crash = RunResult(run_id=run_id, status="crash", error=why, log_tail="", metrics=result_for(job).metrics)
            return RunStatus("lost", detail=why, result=crash)
        return super().lookup(run_id)


def test_a_preemption_then_one_outside_kill_is_run_again_not_charged_as_a_crash(tmp_path: Path) -> None:
    """Only kills from outside in a row are charged (MAX_KILLED_RUNS): a loss of another kind
    before one kill makes no streak of kills."""
    loop = make(tmp_path, PreemptedThenKilled(), [change(0.5, "worse")], first_baseline_runs=2)
    run_to_end(loop)
    chain = sorted((r for r in loop.store.runs.all() if r.experiment_id == 1), key=lambda r: r.id)
    assert [r.state for r in chain] == ["lost", "lost", "done"] and len({r.seed for r in chain}) == 1
    assert [r.status for r in chain][-1] == "ok"
    assert not [r for r in loop.store.runs.all() if r.status == "crash"]


def test_main_s_run_lost_again_and_again_stops_the_loop_saying_to_bring_the_runners_back(tmp_path: Path) -> None:
    runner = FakeRunner()
    runner.lost.update(range(1, 100))  # every run of main: its runners are gone
    loop = make(tmp_path, runner, [change(-0.5, "better")], first_baseline_runs=2)
    for _ in range(3 * MAX_LOST_RUNS):
        loop.tick()
    assert f"{MAX_LOST_RUNS} runs of it were lost in a row, a fault of the runners" in loop.blocked
    assert "Bring the runners back" in loop.blocked and "restart the conductor" in loop.blocked
    assert sum(r.state == "lost" for r in loop.store.runs.all()) == MAX_LOST_RUNS  # then nothing more is spent


def test_the_conductor_fills_the_slots_the_runner_has_now(tmp_path: Path) -> None:
    runner = FakeRunner(slots=4, auto=False)
    loop = make(tmp_path, runner, [], first_baseline_runs=10)
    loop.tick()
    assert len(runner.running()) == 4
    runner.slots = 2  # two slots taken away: their runs go on, and no new run starts until two ended
    runner.finish(runner.running()[0])
    loop.tick()
    assert len(runner.running()) == 3 and len(loop.store.runs.all(state="running")) == 3
    for run_id in runner.running()[:2]:
        runner.finish(run_id)
    loop.tick()
    assert len(runner.running()) == 2  # one run left of the three, and one new on the slot freed
    runner.slots = 5  # slots added: filled at the next tick
    loop.tick()
    assert len(runner.running()) == 5
