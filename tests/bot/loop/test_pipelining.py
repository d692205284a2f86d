"""GPUs never wait for the agent: the proposals prepared ahead keep both slots busy when one frees;
without lookahead a slot that frees stays idle until the model answers. The model is the real
Claude agent on the scripted Messages API; whatever its speed, the conductor takes an answer in a
later tick than the one that asked, so one tick after a slot frees shows whether a proposal was
ready for it. The tests tick when the conductor is woken (the agent answered, a run finished), as
the driver does, and never wait on a clock. No training: the fake runner's jobs end when the test
says so."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import anthropic
import pytest
from anthropic_standin import AnthropicStandIn, edit_then_submit
from fakes import IDENTITY, SMALL_TRAIN_PY, FakeRunner

from bot.agent.claude import ClaudeAgent, ClaudeConfig
from bot.forge.local import init_research_repo
from bot.loop.conductor import Conductor, ConductorConfig
from bot.store import Store

PROGRAM = "---\nautoresearch:\n  first_baseline_runs: 2\n  baseline_runs: 2\n---\n\nLower val_bpb.\n"

pytestmark = pytest.mark.filterwarnings("ignore:The model .* is deprecated:DeprecationWarning")


def conductor(tmp_path: Path, api: AnthropicStandIn, runner: FakeRunner, lookahead: int | None) -> Conductor:
    forge = init_research_repo(tmp_path / "repo", {"train.py": SMALL_TRAIN_PY, "program.md": PROGRAM})
    client = anthropic.Anthropic(api_key=api.api_key, base_url=api.base_url, max_retries=0, timeout=10)
    agent = ClaudeAgent(ClaudeConfig(), client=client)
    return Conductor(
        Store(tmp_path / "state.db"),
        forge,
        runner,
        agent,
        ConductorConfig(profile="smoke", identity=dict(IDENTITY), lookahead=lookahead),
    )


class Ticker:
    """Ticks the conductor as the driver would: again as soon as it is woken (the agent answered,
    the runner finished a job), or after the driver's timer (1 s here) if nothing woke it."""

    def __init__(self, loop: Conductor) -> None:
        self.loop = loop
        self.woken = threading.Event()
        loop.wake_on(self.woken.set)

    def tick(self) -> None:
        self.woken.clear()
        self.loop.tick()

    def until(self, done, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, "the condition was never reached"
            self.tick()
            if not done():
                self.woken.wait(timeout=1.0)


def running(loop: Conductor, purpose: str | None = None) -> list:
    return [r for r in loop.store.runs.all(state="running") if purpose in (None, r.purpose)]


def queued_candidates(loop: Conductor) -> int:
    return len([r for r in loop.store.runs.all(state="queued") if r.purpose == "candidate"])


def busy_after_each_finish(tmp_path: Path, lookahead: int | None, finishes: int) -> list[int]:
    """How many slots run right after each finished candidate run (one tick, no waiting)."""
    runner = FakeRunner(slots=2, auto=False)
    # each proposal: an edit that makes it new (a marked effect for the fake runner), then submit
    model = edit_then_submit(lambda n: f"_fake_effect = (0.01, {json.dumps(f'p{n}')})")
    with AnthropicStandIn([model] * 40) as api:
        loop = conductor(tmp_path, api, runner, lookahead)
        loop.start()
        ticker = Ticker(loop)

        def main_measured() -> bool:
            for run in running(loop, "baseline"):
                runner.finish(run.id)
            return len([r for r in loop.store.runs.all(state="done") if r.purpose == "baseline"]) >= 2

        ticker.until(main_measured)
        busy = []
        for _ in range(finishes):
            ticker.until(
                lambda: len(running(loop, "candidate")) == 2 and (lookahead == 0 or queued_candidates(loop) >= 1)
            )
            runner.finish(running(loop, "candidate")[0].id)
            ticker.tick()
            busy.append(len(running(loop)))
        assert api.violations == []
    return busy


def test_with_lookahead_a_freed_slot_never_waits_for_the_model(tmp_path: Path) -> None:
    assert busy_after_each_finish(tmp_path, None, finishes=3) == [2, 2, 2]


def test_without_lookahead_a_freed_slot_waits_for_the_model(tmp_path: Path) -> None:
    assert busy_after_each_finish(tmp_path, 0, finishes=2) == [1, 1]
