"""A keep waits for what people should see of it before main takes it (in full mode on GitHub, its
pull request: GitHub refuses one for a branch main already holds), but never longer than
MERGE_WAIT_S: a publisher that cannot open it holds the research up for a bounded time only.
The conductor is driven with a fake runner, a scripted agent and the real local forge; the clock
is the test's."""

from __future__ import annotations

import time
from pathlib import Path

from fakes import IDENTITY, SMALL_TRAIN_PY, FakeRunner, with_effect

from bot.agent.scripted import ScriptedAgent
from bot.core.records import Proposal
from bot.core.states import State
from bot.forge.local import init_research_repo
from bot.loop.conductor import Conductor, ConductorConfig
from bot.loop.merge_gate import MERGE_WAIT_S
from bot.store import Experiment, Store

MAIN = with_effect(SMALL_TRAIN_PY, 0.0, "main")
PROGRAM = "---\nautoresearch:\n  first_baseline_runs: 2\n  baseline_runs: 2\n---\n\nLower val_bpb.\n"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Gate:
    """Holds every keep until `open` is set; counts what it was asked."""

    def __init__(self) -> None:
        self.open = False
        self.asked: list[int] = []

    def __call__(self, exp: Experiment) -> str | None:
        self.asked.append(exp.id)
        return None if self.open else "its pull request is not open yet"


def make(tmp_path: Path, gate: Gate, clock: Clock) -> Conductor:
    forge = init_research_repo(tmp_path / "repo", {"train.py": MAIN, "program.md": PROGRAM})
    agent = ScriptedAgent([Proposal("better", "hypothesis", with_effect(MAIN, -0.1, "better"))])
    config = ConductorConfig(profile="smoke", identity=dict(IDENTITY), max_experiments=1, retry_base_s=0.0)
    return Conductor(Store(tmp_path / "state.db"), forge, FakeRunner(), agent, config, clock=clock, merge_gate=gate)


def events(conductor: Conductor, exp_id: int) -> str:
    return "\n".join(e["message"] for e in conductor.store.events.all(exp_id))


def until_merging(conductor: Conductor) -> Experiment:
    for _ in range(400):
        conductor.tick()
        [*exps] = conductor.store.experiments.all()
        if exps and exps[0].state == State.MERGING:
            return exps[0]
        time.sleep(0.002)  # the agent answers on its own thread
    raise AssertionError(f"never reached merging: {conductor.store.experiments.all()}")


def test_a_keep_waits_at_the_merge_while_its_gate_holds_and_merges_once_it_lets_go(tmp_path: Path) -> None:
    gate, clock = Gate(), Clock()
    loop = make(tmp_path, gate, clock)
    main_before = loop.forge.main_sha()
    exp = until_merging(loop)
    for _ in range(5):
        clock.now += 10
        loop.tick()
    assert loop.store.experiments.get(exp.id).state == State.MERGING
    assert loop.forge.main_sha() == main_before
    gate.open = True
    loop.tick()
    kept = loop.store.experiments.get(exp.id)
    assert kept.status == "keep" and loop.forge.main_sha() == kept.merged_sha
    assert "without waiting" not in events(loop, exp.id)


def test_a_gate_that_never_lets_go_holds_the_keep_for_merge_wait_s_then_main_takes_it(tmp_path: Path) -> None:
    gate, clock = Gate(), Clock()
    loop = make(tmp_path, gate, clock)
    exp = until_merging(loop)
    clock.now += MERGE_WAIT_S - 1
    loop.tick()
    assert loop.store.experiments.get(exp.id).state == State.MERGING
    clock.now += 1
    loop.tick()
    kept = loop.store.experiments.get(exp.id)
    assert kept.status == "keep" and loop.forge.main_sha() == kept.merged_sha
    assert "merged without waiting longer: its pull request is not open yet" in events(loop, exp.id)
