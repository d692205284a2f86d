"""GPUs never wait for the agent: with a slow model (the real Claude agent on the scripted Messages
API, answering each turn after a delay), the proposals prepared ahead keep both slots busy; without
lookahead a slot that frees stays idle until the model answers. No training: the fake runner's
jobs end when the test says so."""

from __future__ import annotations

import json
import time
from pathlib import Path

import anthropic
import pytest
from anthropic_standin import AnthropicStandIn, edit_then_submit
from fakes import IDENTITY, FakeRunner

from bot.agent.claude import ClaudeAgent, ClaudeConfig
from bot.forge.local import init_research_repo
from bot.loop.conductor import Conductor, ConductorConfig
from bot.store import Store

ROOT = Path(__file__).resolve().parents[3]
MAIN = (ROOT / "train.py").read_text()
PROGRAM = "---\nautoresearch:\n  first_baseline_runs: 2\n  baseline_runs: 2\n---\n\nLower val_bpb.\n"
TURN_S = 0.3  # the model's think time per turn; a proposal is two turns

pytestmark = pytest.mark.filterwarnings("ignore:The model .* is deprecated:DeprecationWarning")


def conductor(tmp_path: Path, api: AnthropicStandIn, runner: FakeRunner, lookahead: int | None) -> Conductor:
    forge = init_research_repo(tmp_path / "repo", {"train.py": MAIN, "program.md": PROGRAM})
    client = anthropic.Anthropic(api_key=api.api_key, base_url=api.base_url, max_retries=0, timeout=10)
    agent = ClaudeAgent(ClaudeConfig(), client=client)
    return Conductor(
        Store(tmp_path / "state.db"),
        forge,
        runner,
        agent,
        ConductorConfig(profile="smoke", identity=dict(IDENTITY), lookahead=lookahead),
    )


def tick_until(loop: Conductor, done, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "the condition was never reached"
        loop.tick()
        time.sleep(0.01)


def running(loop: Conductor, purpose: str | None = None) -> list:
    return [r for r in loop.store.runs.all(state="running") if purpose in (None, r.purpose)]


def queued_candidates(loop: Conductor) -> int:
    return len([r for r in loop.store.runs.all(state="queued") if r.purpose == "candidate"])


def busy_after_each_finish(tmp_path: Path, lookahead: int | None, finishes: int) -> list[int]:
    """How many slots run right after each finished candidate run (one tick, no waiting)."""
    runner = FakeRunner(slots=2, auto=False)
    # each proposal: an edit that makes it new (a marked effect for the fake runner), then submit
    slow_model = edit_then_submit(lambda n: f"_fake_effect = (0.01, {json.dumps(f'p{n}')})", delay_s=TURN_S)
    with AnthropicStandIn([slow_model] * 40) as api:
        loop = conductor(tmp_path, api, runner, lookahead)
        loop.start()

        def main_measured() -> bool:
            for run in running(loop, "baseline"):
                runner.finish(run.id)
            return len([r for r in loop.store.runs.all(state="done") if r.purpose == "baseline"]) >= 2

        tick_until(loop, main_measured)
        busy = []
        for _ in range(finishes):
            tick_until(
                loop, lambda: len(running(loop, "candidate")) == 2 and (lookahead == 0 or queued_candidates(loop) >= 1)
            )
            runner.finish(running(loop, "candidate")[0].id)
            loop.tick()
            busy.append(len(running(loop)))
        assert api.violations == []
    return busy


def test_with_lookahead_a_slow_model_never_leaves_a_slot_idle(tmp_path: Path) -> None:
    assert busy_after_each_finish(tmp_path, None, finishes=3) == [2, 2, 2]


def test_without_lookahead_a_freed_slot_waits_for_the_model(tmp_path: Path) -> None:
    assert busy_after_each_finish(tmp_path, 0, finishes=2) == [1, 1]
